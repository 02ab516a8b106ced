"""The Plan: where to cut, how many micro-batches, which schedule, what to recompute.

A Plan is what ``autopipe plan`` writes (plan.json) and what ``autopipe show``, ``emit`` and
``run`` read. It names stages by the user's modules and fx node names, records the decision
and every prediction behind it (per-stage time and memory, bubble, iteration time), the best
alternatives the search rejected, and the baselines (even split by layer count, split by
parameter count, greedy time-balanced split) under the same simulator. Same Profile and
request give byte-identical JSON. How to rebuild and re-trace its model is the Profile's
:class:`~autopipe.graph.recipe.TraceRecipe`, written as the ``"recipe"`` object (version 2);
version 1 plans, with those fields at the top level, are read too.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autopipe._io import atomic_write_text
from autopipe.errors import PlanFileError
from autopipe.graph.recipe import TraceRecipe

__all__ = ["PLAN_VERSION", "Alternative", "Baseline", "Plan", "StagePlan"]

PLAN_VERSION = 2
_READS = (1, PLAN_VERSION)  # version 1: the recipe's fields at the top level


@dataclass(frozen=True)
class StagePlan:
    """One (virtual) stage of the pipeline."""

    index: int  # virtual stage index, 0 .. S*v-1
    rank: int  # the device that runs it (index % S)
    blocks: tuple[str, ...]  # block names, e.g. ("blocks.0", "blocks.1")
    block_indices: tuple[int, ...]  # indices into the Profile's blocks
    nodes: tuple[str, ...]  # fx node names, graph order
    params: int  # parameter elements owned
    forward_s: float  # per micro-batch
    backward_s: float  # per micro-batch, recomputation included
    backward_input_s: float  # input-gradient part (zero-bubble B), recomputation included
    backward_weight_s: float  # weight-gradient part (zero-bubble W)
    recompute: bool  # activation checkpointing on this stage
    memory_bytes: float  # predicted: static + activations held at the schedule's peak
    static_bytes: float  # parameters + gradients + optimizer state
    activation_bytes: float  # saved for backward, one micro-batch
    held_bytes: float  # kept per micro-batch in flight: activations, or only inputs if recomputed
    send_bytes: float  # bytes sent to the next stage per micro-batch (0 for the last)


@dataclass(frozen=True)
class Alternative:
    """A decision the search priced and did not take."""

    schedule: str
    virtual: int
    micro_batches: int
    iteration_time_s: float
    bubble_fraction: float
    peak_memory_bytes: float
    partition: str  # "solver" or the baseline name that produced the cuts


@dataclass(frozen=True)
class Baseline:
    """A simple split priced with the chosen schedule and micro-batches."""

    name: str  # "even-layers", "by-params", "greedy-time"
    stage_blocks: tuple[int, ...]  # blocks per stage
    iteration_time_s: float
    bubble_fraction: float
    peak_memory_bytes: tuple[float, ...]  # per device
    fits: bool  # within the memory limit


@dataclass(frozen=True)
class Plan:
    """A pipeline plan and everything predicted about it."""

    model: str  # for people: "models/gpt.py:build_model -k n_layer=4"
    recipe: TraceRecipe  # to rebuild the model and re-trace it into the same blocks
    profile_device: str
    devices: int  # S: pipeline ranks
    virtual: int  # v: stages per device (interleaved); 1 otherwise
    schedule: str
    micro_batches: int  # m
    micro_batch_size: int
    batch_size: int
    memory_limit_bytes: float  # per device
    link_bandwidth: float  # bytes/s
    link_latency_s: float
    recompute_policy: str
    stages: tuple[StagePlan, ...]
    iteration_time_s: float
    bubble_fraction: float
    throughput: float  # samples per second
    peak_memory_bytes: tuple[float, ...]  # per device, simulated
    alternatives: tuple[Alternative, ...]
    baselines: tuple[Baseline, ...]
    # Data x pipeline parallel (solve.parallel): D replicas of this pipeline, each step ending
    # with a ring all-reduce of every stage's gradients; throughput then counts all D replicas.
    data_parallel: int = 1  # D; the devices in all are devices * data_parallel
    allreduce_s: float = 0.0  # gradient all-reduce per iteration, after the pipeline flush
    parallel_note: str = ""  # the (S, D) decision, its links and the runner-up, for people
    action_overhead_s: float = 0.0  # the executor's cost per action, in every stage time above
    version: int = PLAN_VERSION

    @property
    def step_time_s(self) -> float:
        """Iteration time including the data-parallel gradient all-reduce."""
        return self.iteration_time_s + self.allreduce_s

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def balance(self) -> tuple[int, ...]:
        """Blocks per stage, the form torchgpipe-style ``nn.Sequential`` pipelines take."""
        return tuple(len(s.blocks) for s in self.stages)

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, self.to_json())

    @staticmethod
    def load(path: str | Path) -> Plan:
        p = Path(path)
        if not p.is_file():
            raise PlanFileError(f"plan file not found: {p}; make one with 'autopipe plan MODEL -o {p}'")
        return Plan.from_json(p.read_text(), source=str(p))

    @staticmethod
    def from_json(text: str, source: str = "plan") -> Plan:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanFileError(f"{source} is not valid JSON ({e}); write it again with 'autopipe plan'") from None
        if not isinstance(raw, dict) or "version" not in raw:
            raise PlanFileError(f"{source} is not an autopipe plan (no 'version' field); make one with 'autopipe plan'")
        if raw["version"] not in _READS:
            raise PlanFileError(
                f"{source} has plan version {raw['version']}, this autopipe reads versions "
                f"{' and '.join(map(str, _READS))}; plan again"
            )
        try:
            return _plan_from_dict(raw)
        except (KeyError, TypeError, ValueError) as e:
            raise PlanFileError(f"{source} is corrupt ({type(e).__name__}: {e}); plan again with 'autopipe plan'") from None

    def summary(self) -> str:
        """A few lines of plain text: the decision and the prediction."""
        lines = [
            f"{self.model}: {self.devices} devices x {self.virtual} stage(s), {self.schedule}, "
            f"{self.micro_batches} micro-batch{'es' if self.micro_batches != 1 else ''} of {self.micro_batch_size}",
            f"iteration {self.iteration_time_s * 1e3:.3f} ms, bubble {self.bubble_fraction:.1%}, "
            f"{self.throughput:.1f} samples/s",
        ]
        for s in self.stages:
            first, last = s.blocks[0], s.blocks[-1]
            span = first if first == last else f"{first} .. {last}"
            lines.append(
                f"  stage {s.index} (device {s.rank}): {span} [{len(s.blocks)} blocks]"
                f"{' recompute' if s.recompute else ''}"
            )
        return "\n".join(lines)


def _tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x)


def _plan_from_dict(raw: dict[str, Any]) -> Plan:
    stages = tuple(
        StagePlan(**{**s, "blocks": _tuple(s["blocks"]), "block_indices": _tuple(s["block_indices"]), "nodes": _tuple(s["nodes"])})
        for s in raw["stages"]
    )
    alternatives = tuple(Alternative(**a) for a in raw["alternatives"])
    baselines = tuple(
        Baseline(**{**b, "stage_blocks": _tuple(b["stage_blocks"]), "peak_memory_bytes": _tuple(b["peak_memory_bytes"])})
        for b in raw["baselines"]
    )
    if raw["version"] >= 2:
        recipe, recipe_keys = TraceRecipe.from_dict(raw["recipe"]), {"recipe"}
    else:  # version 1: the recipe's fields at the top level, all of them written
        recipe_keys = {f.name for f in dataclasses.fields(TraceRecipe)}
        recipe = TraceRecipe.from_dict({k: raw[k] for k in recipe_keys})
    skip = {"stages", "alternatives", "baselines", "peak_memory_bytes", "version", *recipe_keys}
    fields = {k: v for k, v in raw.items() if k not in skip}
    return Plan(
        **fields,
        recipe=recipe,
        stages=stages,
        alternatives=alternatives,
        baselines=baselines,
        peak_memory_bytes=_tuple(raw["peak_memory_bytes"]),
        version=PLAN_VERSION,  # read into this version's shape
    )
