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

from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture
def transformers() -> ModuleType:
    """The ``transformers`` package; the test that asks for it is skipped where it is missing."""
    return pytest.importorskip("transformers")



@pytest.fixture(scope="session")
def gpt_plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real analytic plans of models/gpt.py on H100s (made once): ``"uneven"``, 6 layers on 4
    stages, every stage recomputed; ``"interleaved"``, a 3D plan: 12 layers on 4 devices x 2
    chunks, tensor parallel 2 and 2 data-parallel replicas (16 GPUs)."""
    from autopipe.cli.main import main

    gpt = str(Path(__file__).resolve().parent.parent / "models" / "gpt.py")
    folder = tmp_path_factory.mktemp("gpt_plans")
    requests = {
        "uneven": ["-k", "n_layer=6", "--stages", "4", "--batch-size", "16", "--recompute-all"],
        "interleaved": ["-k", "n_layer=12", "--gpus", "16", "--tensor-parallel", "2", "--stages", "4", "--schedule", "interleaved-1f1b",
                        "--virtual", "2", "--batch-size", "32"],
    }  # fmt: skip
    for name, args in requests.items():
        code = main(["plan", gpt, "--device", "h100", *args, "-o", str(folder / f"{name}.json")])
        assert code == 0, name
    return {name: folder / f"{name}.json" for name in requests}
