"""Checks on command-line values that argparse cannot express in one clear line.

argparse reports a bad value with a usage block; autopipe reports it like every other bad
input, as one ``autopipe: error:`` line naming the flag, the value and the fix. Options are
therefore parsed as strings and checked here, after parsing and before any slow work starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from autopipe._io import check_output_file, check_output_folder
from autopipe.errors import InputError
from autopipe.units import COUNT_BOUNDS

if TYPE_CHECKING:
    from autopipe.api import Words

__all__ = [
    "FLAGS",
    "UsageError",
    "balance_list",
    "cli_words",
    "int_list",
    "non_negative_int",
    "output_folder",
    "output_path",
    "positive_int",
    "resolve_device",
    "split_names",
]


class UsageError(InputError):
    """A command-line value is malformed or out of range."""


FLAGS = {  # the library's field -> the flag that sets it: how the CLI's errors name it
    "action_overhead_s": "--action-overhead",
    "send_overhead_s": "--send-overhead",
    "balance": "--balance",
    "batch_size": "--batch-size",
    "data_parallel": "--data-parallel",
    "devices": "--devices",
    "gpus": "--gpus",
    "max_blocks": "--blocks",
    "memory": "--memory",
    "micro_batch_sizes": "--micro-batch-sizes",
    "micro_batches": "--micro-batches",
    "offload_modules": "--offload-modules",
    "recompute_layers": "--recompute-layers",
    "recompute_modules": "--recompute-modules",
    "repeat": "--repeat",
    "overlap": "--overlap",
    "schedule": "--schedule",
    "shard_group": "--shard-group",
    "sharding": "--sharding",
    "stages": "--stages",
    "target": "--target",
    "tensor_parallel": "--tensor-parallel",
    "context_parallel": "--context-parallel",
    "expert_parallel": "--expert-parallel",
    "expert_tensor_parallel": "--expert-tensor-parallel",
    "threads": "--threads",
    "virtual": "--virtual",
    "warmup": "--warmup",
    "zero1": "--zero1",
}


def cli_words() -> Words:
    """How the library's errors name its fields on the command line: by :data:`FLAGS` (``--stages 4``)."""
    from autopipe.api import Words

    return Words(tuple(FLAGS.items()), " ")


def _int(text: str, flag: str, what: str) -> int:
    try:
        value = int(text.strip()) if len(text) <= 100 else int("too long")
    except (ValueError, AttributeError):
        raise UsageError(f"{flag} must be {what} (got {text[:100]!r})") from None
    field = next((f for f, said in FLAGS.items() if said == flag), None)
    if field in COUNT_BOUNDS:  # the one table of bounds (autopipe/units.py)
        low, high = COUNT_BOUNDS[field]
        if value > high:  # below the least: the caller's own message (a positive integer, >= 0)
            raise UsageError(f"{flag} must be from {low} to {high} (got {value})")
    return value


def positive_int(text: str, flag: str) -> int:
    """``"8"`` -> 8; zero, negatives and non-numbers raise UsageError."""
    value = _int(text, flag, "a positive integer")
    if value < 1:
        raise UsageError(f"{flag} must be a positive integer (got {value})")
    return value


def kinds_list(text: str, flag: str) -> tuple[str, ...]:
    """``"core_attn,mlp"`` -> ("core_attn", "mlp"); ``"none"`` -> () (the library checks the names)."""
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    if not kinds or len(text) > 200:
        raise UsageError(
            f"{flag} must be module kinds separated by commas, like core_attn,mlp, or none (got {text[:100]!r})"
        )
    return () if kinds == ("none",) else kinds


def non_negative_int(text: str, flag: str) -> int:
    value = _int(text, flag, "an integer >= 0")
    if value < 0:
        raise UsageError(f"{flag} must be an integer >= 0 (got {value})")
    return value


def int_list(text: str, flag: str) -> tuple[int, ...]:
    """``"4,1,2,2"`` -> ``(1, 2, 4)``: positive integers, sorted, duplicates dropped."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts) or any(int(p) < 1 for p in parts):
        raise UsageError(f"{flag} must be positive integers separated by commas, like 1,2,4 (got {text!r})")
    return tuple(sorted({int(p) for p in parts}))


def balance_list(text: str, flag: str) -> tuple[int, ...]:
    """``"3,1,1,3"`` -> ``(3, 1, 1, 3)``: positive integers in the order given (blocks per chunk)."""
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise UsageError(f"{flag} must be blocks per chunk separated by commas, like 3,1,1,3 (got {text!r})")
    values = tuple(int(p) for p in parts)
    if min(values) < 1:
        raise UsageError(f"{flag} entries must be at least 1 block per chunk (got {text!r})")
    return values


def split_names(values: Iterable[str] | None) -> tuple[str, ...]:
    """Repeated and comma-separated names (``--leaf A,B --leaf C``) -> ``("A", "B", "C")``."""
    return tuple(n.strip() for v in values or () for n in v.split(",") if n.strip())


def resolve_device(name: str | None) -> str:
    """``None`` -> ``"cuda"`` when a CUDA device is usable, else ``"cpu"``; checks cpu/cuda[:N]."""
    import torch  # here, so that --help and --version do not wait for torch

    cuda = torch.cuda.is_available()
    if name is None:
        return "cuda" if cuda else "cpu"
    name = name.strip().lower()
    kind, _, index = name.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind == "cpu" or not index.isdigit())):
        raise UsageError(f"--device must be cpu, cuda or cuda:N (got {name!r})")
    if kind == "cuda" and not cuda:
        raise UsageError(f"--device {name} but this torch ({torch.__version__}) sees no CUDA device; use --device cpu")
    if kind == "cuda" and index and int(index) >= torch.cuda.device_count():
        raise UsageError(
            f"--device {name} but only {torch.cuda.device_count()} CUDA device(s) are visible; "
            f"use cuda:0 to cuda:{torch.cuda.device_count() - 1}"
        )
    return name


_EXAMPLES = {"--timeline": "timeline.png", "--plot": "loss.png", "--trace": "trace.json"}  # else out.json


def output_path(text: str, flag: str, example: str | None = None) -> Path:
    """An output file that can be written (checked before the slow work, not after); a folder given
    instead gets a message suggesting ``example`` (by default one the flag writes) in it."""
    return check_output_file(text, flag, example or _EXAMPLES.get(flag, "out.json"))


def output_folder(text: str, flag: str) -> Path:
    """An output folder that can be made (checked before the slow work, not after)."""
    return check_output_folder(text, flag)
