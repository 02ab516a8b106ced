# Run: by tools/megatron_check.py, under a Python 3.12 with megatron-core (not autopipe's venv)
"""Megatron-LM's own code on autopipe's ``config --for megatron`` outputs (one JSON file of cases).

For each case: the environment its ``# launch:`` line names (plus the world size torchrun would
set), ``sys.argv`` = the printed arguments and the run's own (tokenizer, data, iterations),
then Megatron's ``parse_args``, ``validate_args`` and ``core_transformer_config_from_args``, and
for every pipeline rank and virtual stage the layers Megatron-Core builds there
(``get_num_layers_to_build``) and the first one's index (``get_transformer_layer_offset``),
compared with the plan's. Nothing distributed is initialised: ``parallel_state``'s rank getters
are set to each rank in turn. On a CPU machine the device is reported as Hopper (compute
capability 9.0), so the checks Megatron keys to the architecture (CUDA_DEVICE_MAX_CONNECTIONS for
tensor parallelism) run as on an H100; and Transformer Engine, which every Megatron container
has and this environment cannot install, is reported as new enough for every version check
(``is_te_min_version``: FP8 with routed experts, FP8 grouped GEMMs), at :data:`TE_REPORTED`.
Prints one JSON object per case on stdout.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import warnings
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

HOPPER = (9, 0)
TE_REPORTED = "99.0.0"  # above every version Megatron checks for (transformer_config.py: up to 2.14)


def _as_hopper() -> None:
    """torch reports one Hopper GPU; Megatron's architecture checks read it."""
    import torch

    name = "NVIDIA H100 (reported on CPU)"
    props = SimpleNamespace(major=HOPPER[0], minor=HOPPER[1], name=name, total_memory=80 << 30)
    torch.cuda.get_device_capability = lambda *a, **k: HOPPER
    torch.cuda.get_device_properties = lambda *a, **k: props
    torch.cuda.device_count = lambda: 1


def _te_reported() -> None:
    """Megatron's Transformer Engine version checks answer as for :data:`TE_REPORTED` (every
    module that imported ``is_te_min_version`` / ``get_te_version`` by name)."""
    from packaging.version import Version

    def at_least(version: str, check_equality: bool = True) -> bool:
        return Version(TE_REPORTED) >= Version(version) if check_equality else Version(TE_REPORTED) > Version(version)

    for name, module in list(sys.modules.items()):
        if name.startswith("megatron") and module is not None:
            if hasattr(module, "is_te_min_version"):
                module.is_te_min_version = at_least
            if hasattr(module, "get_te_version"):
                module.get_te_version = lambda: Version(TE_REPORTED)


def _megatron() -> SimpleNamespace:
    _as_hopper()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core
        import megatron.training.arguments as arguments
        from megatron.core import parallel_state
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        try:
            from megatron.training.arguments import core_transformer_config_from_args
        except ImportError:
            from megatron.training.argument_utils import core_transformer_config_from_args
    if hasattr(arguments, "get_device_arch_version"):
        arguments.get_device_arch_version = lambda: HOPPER[0]
    _te_reported()
    return SimpleNamespace(
        version=megatron.core.__version__.split("+")[0],  # "+<hash>" is the git commit of the working directory
        where=os.path.dirname(megatron.core.__file__),
        arguments=arguments,
        to_config=core_transformer_config_from_args,
        state=parallel_state,
        build=get_num_layers_to_build,
        offset=get_transformer_layer_offset,
    )


@contextlib.contextmanager
def _environment(env: dict[str, str], argv: list[str]) -> Iterator[None]:
    saved_env, saved_argv = dict(os.environ), sys.argv
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(env)
    sys.argv = ["pretrain_gpt.py", *argv]
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv


@contextlib.contextmanager
def _rank(state: Any, p: int, v: int | None, rank: int, vp: int | None) -> Iterator[None]:
    """parallel_state answers as pipeline rank ``rank``, virtual stage ``vp``."""
    names = {
        "get_pipeline_model_parallel_rank": lambda *a, **k: rank,
        "get_pipeline_model_parallel_world_size": lambda *a, **k: p,
        "get_virtual_pipeline_model_parallel_rank": lambda *a, **k: vp,
        "get_virtual_pipeline_model_parallel_world_size": lambda *a, **k: v,
    }
    saved = {n: getattr(state, n) for n in names if hasattr(state, n)}
    for n, f in names.items():
        setattr(state, n, f)
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(state, n, f)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()


def _placement(m: SimpleNamespace, config: Any) -> list[list[int]]:
    """[rank, virtual stage, first layer, layers] for every chunk, in Megatron's chunk order
    (virtual stage-major, as interleaved 1F1B runs them)."""
    p = config.pipeline_model_parallel_size
    v = config.virtual_pipeline_model_parallel_size
    out = []
    for vp in range(v or 1):
        for rank in range(p):
            stage = vp if v else None
            with _rank(m.state, p, v, rank, stage):
                n = m.build(config, vp_stage=stage, pp_rank=rank)
                first = m.offset(config, vp_stage=stage, pp_rank=rank)
            out.append([rank, vp, int(first), int(n)])
    return out


def check(m: SimpleNamespace, case: dict[str, Any]) -> dict[str, Any]:
    row: dict[str, Any] = {"case": case["case"], "accepted": "", "placement": "", "config": {}}
    env = {**case["env"], "WORLD_SIZE": str(case["world"]), "RANK": "0", "LOCAL_RANK": "0"}
    try:
        with _environment(env, case["args"] + case["extra"]), contextlib.redirect_stdout(io.StringIO()):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                args = m.arguments.parse_args()
                m.arguments.validate_args(args, {})
                config = m.to_config(args)
    except (Exception, SystemExit) as e:  # Megatron refuses with assert, ValueError or argparse's exit
        row["accepted"] = _first_line(e)
        return row
    row["accepted"] = "yes"
    row["config"] = {
        "num_layers": config.num_layers,
        "p": config.pipeline_model_parallel_size,
        "v": config.virtual_pipeline_model_parallel_size,
        "t": config.tensor_model_parallel_size,
        "sequence_parallel": config.sequence_parallel,
        "recompute": [config.recompute_granularity, config.recompute_method, config.recompute_num_layers],
        "recompute_modules": sorted(config.recompute_modules or [])
        if config.recompute_granularity == "selective"
        else [],
        "offload_modules": sorted(config.offload_modules or [])
        if getattr(config, "fine_grained_activation_offloading", False)
        else [],
        "bf16": config.bf16,
        "distributed_optimizer": bool(getattr(args, "use_distributed_optimizer", False)),
        "data_parallel": getattr(args, "data_parallel_size", None),
    }
    fsdp = bool(getattr(args, "use_megatron_fsdp", False))
    sharded = {  # the sharding and overlaps Megatron runs (issue 24)
        "fsdp": getattr(args, "data_parallel_sharding_strategy", None) if fsdp else None,
        "instances": getattr(args, "num_distributed_optimizer_instances", 1),
        "overlap_grad_reduce": bool(getattr(args, "overlap_grad_reduce", False)),
        "overlap_param_gather": bool(getattr(args, "overlap_param_gather", False)),
        "tp_comm_overlap": bool(getattr(args, "tp_comm_overlap", False)),
        "overlap_p2p_comm": bool(getattr(args, "overlap_p2p_comm", False)),
    }
    row["config"].update(sharded)
    derived = {
        "t": config.tensor_model_parallel_size,
        "p": config.pipeline_model_parallel_size,
        "d": row["config"]["data_parallel"],
        "sequence_parallel": bool(config.sequence_parallel),
        "distributed_optimizer": row["config"]["distributed_optimizer"],
        **{k: v for k, v in sharded.items() if k in case["degrees"]},
    }
    if derived != case["degrees"]:
        row["placement"] = f"degrees: Megatron {derived} vs plan {case['degrees']}"
        return row
    moe = {  # the plan's experts as Megatron's config holds them (issue 25)
        "ep": config.expert_model_parallel_size,
        "etp": config.expert_tensor_parallel_size,
        "overlap_moe_comm": bool(getattr(config, "overlap_moe_expert_parallel_comm", False)),
        "mtp": config.mtp_num_layers or 0,
    }
    if case.get("moe") and moe != case["moe"]:
        row["placement"] = f"experts: Megatron {moe} vs plan {case['moe']}"
        return row
    memory = {  # the plan's uniform memory choice, as Megatron's config holds it
        "recompute_modules": row["config"]["recompute_modules"],
        "recompute_layers": config.recompute_num_layers if config.recompute_method == "block" else 0,
        "offload_modules": row["config"]["offload_modules"],
    }
    if memory != case.get("memory", memory):
        row["placement"] = f"memory: Megatron {memory} vs plan {case['memory']}"
        return row
    try:
        built = _placement(m, config)
    except Exception as e:
        row["placement"] = f"{_first_line(e)} (in {traceback.extract_tb(e.__traceback__)[-1].name})"
        return row
    row["built"] = built
    expected = [list(x) for x in case["expected"]]
    if built == expected and config.num_layers == sum(x[3] for x in expected):
        row["placement"] = "yes"
    else:
        row["placement"] = f"Megatron {_short(built)} vs plan {_short(expected)} (num_layers {config.num_layers})"
    return row


def _short(chunks: list[list[int]]) -> str:
    """Chunks as ``r0v0:0+3`` (rank, virtual stage, first layer + layers)."""
    return " ".join(f"r{r}v{v}:{o}+{n}" for r, v, o, n in chunks)


def main() -> int:
    cases = json.loads(open(sys.argv[1], encoding="utf-8").read())
    m = _megatron()
    print(
        json.dumps(
            {
                "megatron_core": m.version,
                "from": m.where,
                "device": "reported as Hopper 9.0",
                "te": f"reported as {TE_REPORTED}",
            }
        ),
        flush=True,
    )
    for case in cases:
        print(json.dumps(check(m, case)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
