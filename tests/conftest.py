"""Fixtures the tests share, and how the tests are laid out.

- ``tests/<package>/test_<module>.py`` holds the tests of ``autopipe/<package>/<module>.py``
  (``tests/cli/`` those of the top-level ``cli/``); ``tests/test_<name>.py`` those of a
  top-level module or folder. Test file names are unique across tests/ (pytest's default
  import mode puts each test file's folder on the path under its bare name).
- Plain helper functions are in ``tests/helpers.py`` (``from tests.helpers import even_plan``);
  fixtures are here. Scripts that tests start as separate processes end in ``_worker.py``.
- ``@pytest.mark.slow`` (registered in pyproject.toml) marks the tests that start processes
  (gloo ranks, ``autopipe run``, ``python -m ...``) or build Hugging Face models, and any other
  test that takes more than about 1.5 s; ``pytest -m "not slow"`` runs the rest in under two
  minutes on two cores.
"""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture
def transformers() -> ModuleType:
    """The ``transformers`` package; the test that asks for it is skipped where it is missing."""
    return pytest.importorskip("transformers")

