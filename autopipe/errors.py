"""The exceptions users of autopipe see.

Every error autopipe raises is an :class:`AutopipeError` (an ``Exception``): its message is one
line that says what is wrong and how to fix it. Bad input is an :class:`InputError`, also a
``ValueError``; a failed run is a :class:`RuntimeFailure`, also a ``RuntimeError``. The CLI
prints the line and exits with code 2 (1 for a failed run); API users catch the typed subclass.
A traceback from autopipe is a bug.
"""

from __future__ import annotations

__all__ = [
    "AutopipeError",
    "BatchError",
    "CommunicationError",
    "ConfigError",
    "EmitError",
    "FactoryArgumentError",
    "InfeasibleError",
    "InputError",
    "ModelLoadError",
    "OutputError",
    "PlanError",
    "PlanFileError",
    "ProfileError",
    "RankMismatchError",
    "RunOptionError",
    "RuntimeFailure",
    "ScheduleError",
    "Terminated",
    "TraceError",
]


class AutopipeError(Exception):
    """Base class of autopipe's errors, each with a one-line message."""


class InputError(AutopipeError, ValueError):
    """Bad input to autopipe (a model file, a flag, a keyword, a plan or profile file)."""


class ModelLoadError(InputError):
    """A model file could not be loaded or its model could not run on its example inputs."""


class FactoryArgumentError(ModelLoadError):
    """A model file's factory cannot take the kwargs given: ``unknown`` ones it does not take,
    or ``missing`` ones it requires. The message advises ``-k`` (as ``autopipe plan`` takes
    them); :mod:`autopipe.stages.rebuild` rewords it for a plan, whose kwargs are recorded."""

    def __init__(
        self, message: str, *, factory: str, is_class: bool, missing: tuple[str, ...], unknown: tuple[str, ...]
    ) -> None:
        super().__init__(message)
        self.factory = factory
        self.is_class = is_class  # the factory is a class (an nn.Module subclass, say), not a function
        self.missing = missing
        self.unknown = unknown


class TraceError(InputError):
    """The model could not be traced into a graph of blocks."""


class RankMismatchError(TraceError):
    """The ranks built or traced the model differently, so their stages would not fit together."""


class ProfileError(InputError):
    """Profiling failed, or a profile file is unreadable or belongs to another model."""


class ScheduleError(InputError):
    """A pipeline schedule is invalid (the message shows the whole grid, bad step marked)."""


class OutputError(InputError):
    """An output file or folder cannot be written where it was asked for (checked before the work)."""


class PlanError(InputError):
    """The planning request is invalid (stages, batch size, memory, pinned decisions)."""


class InfeasibleError(PlanError):
    """No plan fits the memory limits; the message names the smallest limit that would fit."""

    def __init__(self, message: str, min_memory_bytes: float | None = None) -> None:
        super().__init__(message)
        self.min_memory_bytes = min_memory_bytes


class PlanFileError(InputError):
    """A plan file is missing, corrupt, or of an unknown version."""


class ConfigError(InputError):
    """A plan cannot be said in a training framework's words (``autopipe config``)."""


class EmitError(InputError):
    """Stage folders cannot be written (or read back): a folder in the way, code torch alone cannot run."""


class RunOptionError(InputError):
    """A run flag (``autopipe run``, ``python -m autopipe.runtime``) is malformed or out of range."""


class BatchError(InputError):
    """A batch given to ``Pipeline.step`` is not what the model was traced with: another number of
    inputs, a type, dtype or shape other than the example's (the message names the expected shape)."""


class RuntimeFailure(AutopipeError, RuntimeError):
    """A pipeline run failed: a rank raised, died or timed out (``autopipe run`` exits 1).

    ``rank`` is the rank whose failure ended the run (None when it is not known).
    """

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class CommunicationError(RuntimeFailure):
    """A send, receive or collective failed or timed out: usually a peer rank died or hung."""


class Terminated(BaseException):  # a signal, like KeyboardInterrupt, not an error
    """SIGTERM reached the ``autopipe`` command: raised by its handler where the process is, so
    every ``finally`` runs (temporary files and folders removed, ranks ended) before it exits
    143. A ``BaseException``, like ``KeyboardInterrupt``: the guard around user code lets it through."""
