"""autopipe: automatic pipeline-parallelism planning for PyTorch models."""

from autopipe.costs import Affine, BlockCost, Profile, TensorCost
from autopipe.errors import (
    AutopipeError,
    EmitError,
    InfeasibleError,
    ModelLoadError,
    PlanError,
    PlanFileError,
    ProfileError,
    ScheduleError,
    TraceError,
)

__version__ = "0.1.0"

__all__ = [
    "Affine",
    "AutopipeError",
    "BlockCost",
    "EmitError",
    "InfeasibleError",
    "ModelLoadError",
    "PlanError",
    "PlanFileError",
    "Profile",
    "ProfileError",
    "ScheduleError",
    "TensorCost",
    "TraceError",
    "__version__",
]
