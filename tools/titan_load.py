"""Load autopipe's torchtitan outputs with torchtitan's own config code; print what it read, as JSON.

    python tools/titan_load.py FILE...

Each FILE is an output of ``autopipe config PLAN --for torchtitan|torchtitan-main|torchtitan-0.2``:
a ``.toml`` is read as a 0.2.x user's launch reads it (``ConfigManager().parse_args(["--job.config_file",
FILE])``), a ``.py`` recipe as a 0.3.0 or main user's (``--module STEM --config autopipe_plan``, with
the file's folder on ``sys.path``): torchtitan builds the config again and its own checks run. One
JSON line per file: torchtitan's version and where it was imported from, the ``training`` and
``parallelism`` fields as torchtitan holds them, the activation checkpointing it will apply and,
for a pipelined recipe, the stages torchtitan builds on each rank
(``_get_pp_rank_to_stage_indices_mapping``). Which torchtitan is used is Python's to find: run it
with ``PYTHONPATH=DIR`` to check a checkout or a ``pip install --target DIR`` of another release.
The tests (tests/config/test_titan_own_code.py) run it in a subprocess and compare with the plans.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any


def _fields(obj: object) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}  # type: ignore[arg-type]


def _load(path: Path) -> dict[str, Any]:
    from torchtitan.config import ConfigManager  # type: ignore[import-not-found,unused-ignore]

    if path.suffix == ".toml":
        config = ConfigManager().parse_args(["--job.config_file", str(path)])
        ac: object = config.activation_checkpoint.mode
    else:
        sys.path.insert(0, str(path.parent))
        try:
            config = ConfigManager().parse_args(["--module", path.stem, "--config", "autopipe_plan"])
        finally:
            sys.path.remove(str(path.parent))
        ac = type(config.activation_checkpoint).__qualname__ if config.activation_checkpoint is not None else "none"
    par = config.parallelism
    placed: list[list[int]] = []
    if path.suffix == ".py" and par.pipeline_parallel_degree > 1:
        from torchtitan.distributed.pipeline_parallel import (  # type: ignore[import-not-found,unused-ignore]
            _get_pp_rank_to_stage_indices_mapping,
        )

        n, ranks = len(par.module_fqns_per_model_part), par.pipeline_parallel_degree
        placed = [
            list(_get_pp_rank_to_stage_indices_mapping(r, ranks, par.pipeline_parallel_schedule, n))
            for r in range(ranks)
        ]
    return {
        "file": str(path),
        "training": _fields(config.training),
        "parallelism": _fields(par),
        "activation_checkpoint": ac,
        "placed": placed,
    }


def main(argv: list[str]) -> int:
    import torchtitan  # type: ignore[import-not-found,unused-ignore]

    where = str(Path(torchtitan.__file__).parent)
    version = str(getattr(torchtitan, "__version__", "?"))
    for name in argv:
        out = {"torchtitan": version, "from": where, **_load(Path(name))}
        print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
