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
- The full run (README, ``.ci/run``) is ``pytest -n 2``: two pytest-xdist workers.
  :func:`pytest_xdist_make_scheduler` hands each module of :data:`RANK_MODULES` (whose slow
  tests start training ranks) and of :data:`SETUP_MODULES` (whose tests share an expensive
  module-scoped fixture) to one worker as a whole -- its tests run in order, so one gloo
  launch serves many cases and a module's cached plans, profiles or emitted stages are made
  once, not once per worker -- and every other test on its own.
  :func:`pytest_collection_modifyitems` puts the slow tests first in each worker's
  list, so the quick ones fill in at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# Modules whose slow tests start processes that train (gloo ranks, ``autopipe run``, torchrun).
RANK_MODULES = frozenset(
    {
        "tests/runtime/run/test_launch.py",
        "tests/runtime/test_pipeline.py",
        "tests/runtime/test_checkpoint.py",
        "tests/stages/test_export.py",
        "tests/cli/test_run_cmd.py",
        "tests/test_bench_prediction.py",
        "tests/test_api.py",
    }
)
# Modules whose module-scoped fixture takes seconds (profiling five models, emitting stages):
# split test by test over two workers, each worker would make it again.
SETUP_MODULES = frozenset({"tests/cli/test_plan_cmd.py", "tests/stages/test_emit.py", "tests/test_fuzz.py"})


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: never called without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n N`` (``--dist load``, the default): a module of :data:`RANK_MODULES` or
    :data:`SETUP_MODULES` is one unit of work, any other test a unit of its own; units with
    more tests go first."""
    if config.getvalue("dist") != "load":
        return None  # another --dist asked for by name
    from xdist.scheduler import LoadScopeScheduling

    class RankModules(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in RANK_MODULES | SETUP_MODULES else nodeid

    return RankModules(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, the slow tests first (a stable sort); elsewhere the order stays."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(params=["native", "python"])
def native_and_python(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test twice: with the C extensions (``"native"``; skipped where one is not built)
    and with their Python twins (``"python"``), switched by :func:`autopipe.native.use_native`;
    yields which."""
    from autopipe import native

    if request.param == "native" and native.missing():
        pytest.skip(f"C extensions not built (no C compiler at install): {', '.join(native.missing())}")
    before = native.use_native(request.param == "native")
    try:
        yield request.param
    finally:
        native.use_native(before)


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
        "interleaved": [
            "-k",
            "n_layer=12",
            "--gpus",
            "16",
            "--tensor-parallel",
            "2",
            "--stages",
            "4",
            "--schedule",
            "interleaved-1f1b",
            "--virtual",
            "2",
            "--batch-size",
            "32",
        ],
    }
    for name, args in requests.items():
        code = main(["plan", gpt, "--device", "h100", *args, "-o", str(folder / f"{name}.json")])
        assert code == 0, name
    return {name: folder / f"{name}.json" for name in requests}


def pytest_configure(config: pytest.Config) -> None:
    """Python's Ctrl-C handler in every test process: a suite started as a background job of a
    script (``.ci/run &``, nohup) inherits SIGINT ignored, and the tests of Ctrl-C during user code
    (tests/model/test_usercode.py, tests/test_fuzz_causes.py's child processes) need one to arrive."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) in (
        signal.SIG_IGN,
        signal.SIG_DFL,
    ):
        signal.signal(signal.SIGINT, signal.default_int_handler)
