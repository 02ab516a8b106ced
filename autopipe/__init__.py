"""autopipe: automatic pipeline-parallelism planning for PyTorch models.

``autopipe.plan(model, example_inputs, devices=4, memory="16GiB", batch_size=32)`` (or
``autopipe.plan("models/gpt.py", kwargs={...}, ...)``) profiles a model and returns its Plan,
``autopipe.profile(...)`` the Profile alone, ``autopipe.emit(plan, model, folder, ...)`` writes
its stages; ``choices=autopipe.Choices(micro_batches=8, schedule="1f1b")`` pins decisions and
``link=autopipe.Link(bandwidth=25e9)`` prices the hardware, taken alike by ``plan``,
``plan_profile`` and ``plan_cluster``; ``autopipe.api`` has the rest of the programmatic interface.
``autopipe.plan_cluster("models/gpt.py", device="h100", gpus=64, batch_size=1536)`` plans a
model file for a cluster (tensor x pipeline x data parallel) without allocating its weights.
``autopipe.pipeline(plan, model)`` is one rank's part of a plan for your own training loop (torchrun).
"""

from autopipe._io import VERSION
from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.errors import (
    AutopipeError,
    EmitError,
    InfeasibleError,
    InputError,
    ModelLoadError,
    PlanError,
    PlanFileError,
    ProfileError,
    RuntimeFailure,
    ScheduleError,
    TraceError,
)
from autopipe.modes import Recompute, Tracer
from autopipe.plans import Plan

__version__ = VERSION


_LAZY = {
    "Choices": "autopipe.api",
    "Link": "autopipe.api",
    "Pipeline": "autopipe.runtime.pipeline",
    "emit": "autopipe.api",
    "load_timeout": "autopipe.api",
    "pipeline": "autopipe.runtime.pipeline",
    "pipeline_inputs": "autopipe.stages.export",
    "plan": "autopipe.api",
    "plan_cluster": "autopipe.api",
    "plan_profile": "autopipe.api",
    "profile": "autopipe.api",
    "rebuild_model": "autopipe.stages.rebuild",
    "sync_shared_grads": "autopipe.stages.export",
    "to_torch_pipelining": "autopipe.stages.export",
}
"""Names imported on first use, so ``import autopipe`` (and the CLI's --help) waits for no torch."""


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autopipe' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "Affine",
    "AutopipeError",
    "BlockCost",
    "Choices",
    "EmitError",
    "InfeasibleError",
    "InputError",
    "Link",
    "ModelLoadError",
    "Pipeline",
    "Plan",
    "PlanError",
    "PlanFileError",
    "Profile",
    "ProfileError",
    "Recompute",
    "RuntimeFailure",
    "ScheduleError",
    "TensorCost",
    "TraceError",
    "Tracer",
    "__version__",
    "emit",
    "load_timeout",
    "pipeline",
    "pipeline_inputs",
    "plan",
    "plan_cluster",
    "plan_profile",
    "profile",
    "rebuild_model",
    "sync_shared_grads",
    "to_torch_pipelining",
]
