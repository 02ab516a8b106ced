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
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autopipe._io import atomic_write_text, parse_json, read_json, shown
from autopipe.errors import PlanError, PlanFileError
from autopipe.graph.kinds import OFFLOAD_KINDS, RECOMPUTE_KINDS
from autopipe.graph.model_file import found, recorded
from autopipe.graph.recipe import TraceRecipe
from autopipe.modes import Recompute, Sharding
from autopipe.schedules.registry import schedule_names, schedule_spec
from autopipe.schedules.targets import TARGETS
from autopipe.units import check_path

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_DEVICES",
    "MAX_MICRO_BATCHES",
    "MAX_REPLICAS",
    "MAX_TENSOR_PARALLEL",
    "PLAN_VERSION",
    "Alternative",
    "Baseline",
    "FreePlan",
    "Overlap",
    "Plan",
    "StagePlan",
    "check_plan_values",
]

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
    # held again, once, while a backward recomputes (the plan's recompute_layers: the largest of the
    # stage's recomputed layers' activations; 0 otherwise, a whole-stage recompute holding activation_bytes)
    transient_bytes: float = 0.0
    # What autopipe's executor holds besides the saved tensors (measured profiles; 0 otherwise):
    # per micro-batch from B to W, the gradients a split backward keeps for W; and, once while a
    # backward runs, what it makes and frees (the gradients flowing through it).
    kept_bytes: float = 0.0
    backward_bytes: float = 0.0


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
    memory: str = ""  # its uniform memory choice in words (Plan.memory_choice), "" for none


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
class FreePlan:
    """The free plan's prediction beside a targeted one: the best plan of the same request with
    every schedule and recomputation (``--target autopipe``), kept where the plan's target searches less."""

    schedule: str
    virtual: int
    micro_batches: int
    recomputed: tuple[int, ...]  # the stages it recomputes
    iteration_time_s: float
    step_time_s: float  # with the data-parallel all-reduce (the --gpus search compares these)
    tensor_parallel: int = 1
    devices: int = 1  # pipeline depth
    data_parallel: int = 1
    memory: str = ""  # its uniform memory choice in words (Plan.memory_choice), "" for none

    @staticmethod
    def of(plan: Plan) -> FreePlan:
        """The prediction of ``plan`` (the free search's best), as a targeted plan keeps it."""
        return FreePlan(
            plan.schedule,
            plan.virtual,
            plan.micro_batches,
            tuple(s.index for s in plan.stages if s.recompute),
            plan.iteration_time_s,
            plan.step_time_s,
            plan.tensor_parallel,
            plan.devices,
            plan.data_parallel,
            plan.memory_choice,
        )


@dataclass(frozen=True)
class Overlap:
    """What the time model lets run beside the computation (planner/overlap.py prices it; a target's
    default: schedules/targets.py). The defaults are what plans written before it were priced with:
    data-parallel and tensor-parallel communication serial, pipeline sends asynchronous."""

    grad_reduce: bool = False  # the gradients' reduction starts as each chunk's last backward runs
    param_gather: bool = False  # the parameters' all-gather (sharded weights) runs under the forward
    tp_comm: float = 0.0  # the share of the tensor-parallel collectives hidden behind the computation, 0 to 1
    p2p: bool = True  # pipeline sends leave the sender free (False: it waits for the transfer)
    # each MoE layer's all-to-all runs beside another micro-batch's computation (DualPipeV's pairs,
    # Megatron's --overlap-moe-expert-parallel-comm); the cluster search sets it where it priced so
    expert_comm: bool = False

    @staticmethod
    def parse(text: str, name: str = "overlap") -> Overlap:
        """``grad_reduce,param_gather,p2p,tp_comm=0.5`` (what overlaps; ``none``: nothing) as an
        Overlap; PlanError (one line, naming it as ``name``) for anything else."""
        if not isinstance(text, str):
            raise PlanError(f"{name} must be an Overlap or its text, like 'grad_reduce,p2p', not {text!r:.40}")
        words = [w.strip() for w in text.split(",") if w.strip()]
        if words == ["none"]:
            return Overlap(p2p=False)
        on: dict[str, Any] = {"p2p": False}
        for word in words:
            key, _, value = word.partition("=")
            if key == "tp_comm" and value:
                try:
                    share = float(value)
                except ValueError:
                    share = math.nan
                if not 0.0 <= share <= 1.0:
                    raise PlanError(f"{name} {text!r}: tp_comm={value} is not a share from 0 to 1; use tp_comm=0.5")
                on[key] = share
            elif key in ("grad_reduce", "param_gather", "p2p", "expert_comm") and not value:
                on[key] = True
            else:
                raise PlanError(
                    f"{name} {text!r}: {word!r} is not an overlap; use none, or any of grad_reduce, param_gather, "
                    "p2p, expert_comm, tp_comm=SHARE (e.g. grad_reduce,param_gather,p2p)"
                )
        return Overlap(**on)

    def text(self) -> str:
        """What :meth:`parse` reads back: ``grad_reduce,param_gather,p2p`` (``none``: nothing)."""
        said = [name for name in ("grad_reduce", "param_gather") if getattr(self, name)]
        said += [f"tp_comm={self.tp_comm:g}"] if self.tp_comm > 0 else []
        said += ["p2p"] if self.p2p else []
        said += ["expert_comm"] if self.expert_comm else []
        return ",".join(said) or "none"

    def describe(self) -> str:
        """``grad reduce, param gather, p2p`` (what overlaps), or ``nothing``."""
        said = [name for name, on in (("grad reduce", self.grad_reduce), ("param gather", self.param_gather)) if on]
        said += [f"tp comm {self.tp_comm:.0%}"] if self.tp_comm > 0 else []
        said += ["p2p"] if self.p2p else []
        said += ["expert all-to-all"] if self.expert_comm else []
        return ", ".join(said) or "nothing"


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
    recompute_policy: Recompute  # auto, never or always, as asked
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
    allreduce_s: float = 0.0  # data-parallel communication the step pays past the pipeline's end
    parallel_note: str = ""  # the (S, D) decision, its links and the runner-up, for people
    action_overhead_s: float = 0.0  # the executor's cost per action, in every stage time above
    send_overhead_s: float = 0.0  # and per F or B that sends to another rank, in those stage times too
    # Tensor parallel (solve.parallel, costs.tensor): every stage runs on t devices of one node,
    # Megatron-style; the stage times, memory and params above are one device's share.
    tensor_parallel: int = 1  # t; the devices in all are t * devices * data_parallel
    sequence_parallel: bool = False  # Korthikanti et al. 2022 (only with t > 1)
    model_flops: float = 0.0  # per iteration, all devices: 3 x forward (0: not counted)
    hardware_flops: float = 0.0  # model_flops plus the forward of recomputed stages
    shard_optimizer: bool = False  # any sharding but none (plans before ``sharding``: ZeRO-1)
    # How the state is split over the D replicas (modes.Sharding, priced by planner/placement.py) and
    # over how many of them (0: all D; 1 < N < D: hybrid, N-way shards replicated D / N times); what the
    # time model overlapped, and the data-parallel communication per step before overlap. Left out of
    # the file at their defaults, which are what plans before them were priced with.
    sharding: Sharding = Sharding.NONE
    shard_group: int = 0
    overlap: Overlap = Overlap()
    dp_comm_s: float = 0.0
    # Bytes its gradient reductions moved per parameter byte (planner/placement.py's reduce_ratio): 2
    # where bf16 weights' gradients were reduced in fp32 (Megatron-LM's default), 1 in their own dtype.
    grad_reduce_ratio: float = 1.0
    # The framework the plan was made for (``--target``, schedules/targets.py; plans written
    # before it read as autopipe) and, where that target searches less, the free plan's prediction.
    target: str = "autopipe"
    free_plan: FreePlan | None = None
    # How sure the prediction is (planner/noise.py): the iteration with every block at its median
    # plus its measured spread, over iteration_time_s, less 1 (0: no spread known), and, where
    # candidates were within that noise, which were tied and how the plan was chosen among them.
    uncertainty: float = 0.0
    noise_note: str = ""
    # CPU ranks sharing one host (planner/defaults.host_shared): every stage time above is the
    # profile's times this many times (the contention measured beside the profile for this many
    # ranks); 1: priced as profiled.
    host_sharing: float = 1.0
    # Expert and context parallelism (costs.experts, costs.context; Megatron-Core's folding):
    # a stage's t x cp x d devices also form ep x etp-wide expert groups; the devices in all are
    # t * context_parallel * devices * data_parallel. The executor and emitted stages refuse them.
    expert_parallel: int = 1  # ep: devices sharing each MoE layer's routed experts
    expert_tensor_parallel: int = 1  # etp: devices splitting each routed expert
    context_parallel: int = 1  # cp: devices splitting every sample's sequence
    # The uniform memory choice (costs/activations/choices.py; at most one, Megatron-LM's forms): module kinds
    # recomputed in every layer (--recompute-granularity selective --recompute-modules), the first
    # k layers of each stage recomputed whole (--recompute-method block --recompute-num-layers k),
    # module kinds' saved inputs offloaded to the host (--offload-modules). stages[].recompute
    # stays the whole-stage recomputation alone. Plans written before them read as none.
    recompute_modules: tuple[str, ...] = ()
    recompute_layers: int = 0
    offload_modules: tuple[str, ...] = ()
    version: int = PLAN_VERSION

    @property
    def iteration_shown(self) -> str:
        """The predicted iteration in milliseconds as people read it: ``92.9 ms ± 4%``."""
        ms = f"{self.iteration_time_s * 1e3:.3f} ms"
        return f"{ms} ± {self.uncertainty:.0%}" if self.uncertainty > 0 else ms

    @property
    def step_time_s(self) -> float:
        """Iteration time including the data-parallel gradient all-reduce."""
        return self.iteration_time_s + self.allreduce_s

    @property
    def memory_choice(self) -> str:
        """The uniform memory choice in words: ``recompute core_attn+mlp``, ``recompute 2 layers per
        stage``, ``offload qkv_linear`` ("" for none)."""
        if self.recompute_modules:
            return "recompute " + "+".join(self.recompute_modules)
        if self.recompute_layers:
            return f"recompute {self.recompute_layers} layer{'s' if self.recompute_layers != 1 else ''} per stage"
        if self.offload_modules:
            return "offload " + "+".join(self.offload_modules)
        return ""

    def to_json(self) -> str:
        raw = asdict(self)
        for field, default in _LATER.items():  # added later: left out at their defaults
            if raw[field] == default:
                del raw[field]
        if "overlap" in raw and not raw["overlap"]["expert_comm"]:
            del raw["overlap"]["expert_comm"]  # added later: left out when off
        for stage in raw["stages"]:
            for field in ("transient_bytes", "kept_bytes", "backward_bytes"):  # 0: left out
                if stage[field] == 0.0:
                    del stage[field]
        for part in [*raw["alternatives"], *([raw["free_plan"]] if raw["free_plan"] is not None else [])]:
            if not part["memory"]:
                del part["memory"]
        return json.dumps(raw, indent=1, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def precision(self) -> str | None:
        """The precision an analytic plan was priced in, ``bf16``, ``fp16``, ``fp8``, ``tf32`` or ``fp32``, from
        its profile's device line (``"h100: ... (analytic, bf16)"``); None for a measured one, which ran
        the model as it is (fp32 unless the model says otherwise) and does not record it."""
        found = re.search(r"\(analytic, (fp32|tf32|bf16|fp16|fp8)\b", self.profile_device)
        return found.group(1) if found else None

    @property
    def balance(self) -> tuple[int, ...]:
        """Blocks per stage, the form torchgpipe-style ``nn.Sequential`` pipelines take."""
        return tuple(len(s.blocks) for s in self.stages)

    def save(self, path: str | Path) -> None:
        """Write the plan to ``path``; its model file is recorded relative to the plan file's
        folder when under it, else absolute (:mod:`autopipe.graph.model_file`)."""
        model_file = recorded(self.recipe.model_file, path)
        plan = self if model_file == self.recipe.model_file else self.with_model_file(model_file)
        atomic_write_text(path, plan.to_json())

    def with_model_file(self, model_file: str) -> Plan:
        """This plan naming ``model_file`` as its recipe's model file."""
        return dataclasses.replace(self, recipe=dataclasses.replace(self.recipe, model_file=model_file))

    @staticmethod
    def load(path: str | Path) -> Plan:
        """Read and check a plan file; PlanFileError (one line) for anything that is not a plan."""
        check_path(path, "Plan.load's path", "the path of a plan JSON", error=PlanFileError)
        named = shown(path)
        missing = f"plan file not found: {named}; make one with 'autopipe plan MODEL -o {named}'"
        plan = _plan_from_raw(read_json(path, "a plan", PlanFileError, _WRITTEN, missing=missing), named)
        model_file = found(plan.recipe.model_file, path)  # from the plan's folder first, then from here
        return plan if model_file == plan.recipe.model_file else plan.with_model_file(model_file)

    @staticmethod
    def from_json(text: str | bytes, source: str = "plan") -> Plan:
        """Parse and check a plan (schema, types, ranges, the stages against the schedule);
        PlanFileError, one line naming the field, for anything wrong."""
        return _plan_from_raw(parse_json(text, source, "a plan", PlanFileError, _WRITTEN), source)

    def summary(self) -> str:
        """A few lines of plain text: the decision and the prediction."""
        lines = [
            f"{self.model}: {self.devices} devices x {self.virtual} stage(s), {self.schedule}, "
            f"{self.micro_batches} micro-batch{'es' if self.micro_batches != 1 else ''} of {self.micro_batch_size}",
            f"iteration {self.iteration_shown}, bubble {self.bubble_fraction:.1%}, {self.throughput:.1f} samples/s",
        ]
        for s in self.stages:
            first, last = s.blocks[0], s.blocks[-1]
            span = first if first == last else f"{first} .. {last}"
            lines.append(
                f"  stage {s.index} (device {s.rank}): {span} [{len(s.blocks)} blocks]"
                f"{' recompute' if s.recompute else ''}"
            )
        if self.memory_choice:
            lines.append(f"  every layer: {self.memory_choice}")
        return "\n".join(lines)


_WRITTEN = "give a plan written by 'autopipe plan'"
_LATER: dict[str, Any] = {  # fields added later, left out of the file at these defaults
    "uncertainty": 0.0,
    "noise_note": "",
    "sharding": "none",
    "shard_group": 0,
    "overlap": asdict(Overlap()),
    "dp_comm_s": 0.0,
    "grad_reduce_ratio": 1.0,
    "host_sharing": 1.0,
    "send_overhead_s": 0.0,
    "expert_parallel": 1,
    "expert_tensor_parallel": 1,
    "context_parallel": 1,
    "recompute_modules": (),
    "recompute_layers": 0,
    "offload_modules": (),
}


def _plan_from_raw(raw: Any, source: str) -> Plan:
    """The plan in a JSON value read from ``source``: its version first, then every field."""
    if not isinstance(raw, dict) or "version" not in raw:
        raise PlanFileError(f"{source} is not an autopipe plan (no 'version' field); make one with 'autopipe plan'")
    version = raw["version"]
    if not isinstance(version, int) or isinstance(version, bool) or version not in _READS:
        raise PlanFileError(
            f"{source} has plan version {_shown(version)}, this autopipe reads versions "
            f"{' and '.join(map(str, _READS))} (a number); plan again"
        )
    return _plan_from_dict(raw, source)


# ----------------------------------------------------------------------------- reading and checking
# A plan file may have been edited by hand or by a tool: every field is checked for its type and
# range here, and the stages against the schedule, so that a bad file is one line naming the
# field -- never a KeyError or a hang later. (The stages against the model: stages/check.py.)

# The largest plans autopipe makes and reads (the planner refuses requests beyond them, so every
# plan it writes loads back): more would make schedules and simulations loop for minutes.
MAX_MICRO_BATCHES = 2**16
MAX_BATCH_SIZE = 2**31  # samples per step (per pipeline)
MAX_DEVICES = 2**12  # pipeline ranks
MAX_REPLICAS = 2**20  # data-parallel replicas
MAX_VIRTUAL = 64  # chunks per device
MAX_TENSOR_PARALLEL = 2**10  # devices in one tensor-parallel group (one node)
_MAX_INT = 2**53  # any other count (parameters, indices)
_COUNT_RANGES = {  # the plan's own counts (top-level fields), and what each may be
    "devices": (1, MAX_DEVICES),
    "data_parallel": (1, MAX_REPLICAS),
    "tensor_parallel": (1, MAX_TENSOR_PARALLEL),
    "expert_parallel": (1, MAX_DEVICES),
    "expert_tensor_parallel": (1, MAX_TENSOR_PARALLEL),
    "context_parallel": (1, MAX_TENSOR_PARALLEL),
    "micro_batches": (1, MAX_MICRO_BATCHES),
    "micro_batch_size": (1, MAX_BATCH_SIZE),
    "batch_size": (1, MAX_BATCH_SIZE),
    "virtual": (1, MAX_VIRTUAL),
}
_UNBOUNDED = {"throughput", "memory_limit_bytes", "link_bandwidth"}  # may be infinite
_TRACERS = ("auto", "fx", "export")
_AGAIN = "plan again with 'autopipe plan' (or fix the file)"


def _shown(v: Any) -> str:
    """A value as an error message shows it: short, on one line."""
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    text = repr(v)  # escapes quotes, newlines and lone surrogates
    return text if len(text) <= 40 else text[:37] + "..."


def _bad(source: str, where: str, v: Any, expected: str) -> PlanFileError:
    return PlanFileError(f"{source}: {where} is {_shown(v)}, expected {expected}; {_AGAIN}")


def _value(v: Any, kind: str, where: str, source: str) -> Any:
    """``v`` checked against a field annotation (``int``, ``float``, ``str``, ``bool``,
    ``int | None``, ``tuple[X, ...]``) and converted (lists to tuples, ints to floats)."""
    name = where.rsplit(".", 1)[-1]
    if kind.startswith("tuple[") and kind.endswith(", ...]"):
        if not isinstance(v, list):
            raise _bad(source, where, v, "a list")
        return tuple(_value(x, kind[6:-6], f"{where}[{i}]", source) for i, x in enumerate(v))
    if kind == "int | None" and v is None:
        return None
    if kind in ("int", "int | None"):
        if not isinstance(v, int) or isinstance(v, bool):
            raise _bad(source, where, v, "a whole number")
        low, high = _COUNT_RANGES.get(where, (0, _MAX_INT))
        if not low <= v <= high:
            # A plan-level count is named with its own range (the one check_plan_values checks).
            raise _bad(
                source, where, v, f"{low} to {high}" if where in _COUNT_RANGES else "a whole number from 0 to 2**53"
            )
        return v
    if kind == "float":
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        x = float(v) if ok and abs(v) < 1e308 else math.nan
        if not (x >= 0 and (math.isfinite(x) or name.split("[")[0] in _UNBOUNDED)):
            raise _bad(source, where, v, "a finite number >= 0")
        return x
    if kind == "bool":
        if not isinstance(v, bool):
            raise _bad(source, where, v, "true or false")
        return v
    if kind == "str":
        if not isinstance(v, str):
            raise _bad(source, where, v, "a string")
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(source, where, v, "text (it holds a lone surrogate)") from None
        return v
    if kind in ("Recompute", "Sharding"):
        mode = Recompute if kind == "Recompute" else Sharding
        if v not in mode._value2member_map_:
            raise _bad(source, where, v, f"one of {', '.join(m.value for m in mode)}")
        return mode(v)
    raise AssertionError(f"no reader for a field of type {kind}")  # a new field type: add it above


def _fields(cls: type, raw: Any, where: str, source: str, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The fields of dataclass ``cls`` read from the JSON object ``raw``, each checked;
    fields with defaults may be missing, ``skip`` are read by the caller."""
    if not isinstance(raw, dict):
        raise _bad(source, where.rstrip("."), raw, "an object")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in skip}
    unknown = sorted(set(raw) - set(fields) - skip)
    if unknown:
        raise PlanFileError(f"{source}: {where}{_shown(unknown[0])} is not a field of a plan; remove it or {_AGAIN}")
    out: dict[str, Any] = {}
    for name, f in fields.items():
        if name in raw:
            out[name] = _value(raw[name], str(f.type), f"{where}{name}", source)
        elif f.default is dataclasses.MISSING:
            raise PlanFileError(f"{source}: {where}{name} is missing; {_AGAIN}")
    return out


def _recipe(raw: dict[str, Any], version: int, source: str) -> tuple[TraceRecipe, set[str]]:
    """The plan's recipe (version 2: the ``"recipe"`` object; 1: the same keys at the top)."""
    names = {f.name for f in dataclasses.fields(TraceRecipe)}
    if version >= 2:
        if "recipe" not in raw:
            raise PlanFileError(f"{source}: recipe is missing; {_AGAIN}")
        obj, where, keys = raw["recipe"], "recipe.", {"recipe"}
    else:
        obj, where, keys = {k: raw[k] for k in names if k in raw}, "", names
    fields = _fields(TraceRecipe, obj, where, source)
    if "fingerprint" not in fields:
        raise PlanFileError(f"{source}: {where}fingerprint is missing; {_AGAIN}")
    if fields.get("tracer", "fx") not in _TRACERS:
        raise _bad(source, f"{where}tracer", fields["tracer"], f"one of {', '.join(_TRACERS)}")
    if fields.get("max_blocks") == 0:
        raise _bad(source, f"{where}max_blocks", 0, "a whole number >= 1 or null")
    return TraceRecipe.from_dict(fields), keys


def _plan_from_dict(raw: dict[str, Any], source: str = "plan") -> Plan:
    version = raw["version"]
    recipe, recipe_keys = _recipe(raw, version, source)
    lists = {"stages", "alternatives", "baselines"}
    top = _fields(
        Plan,
        {k: v for k, v in raw.items() if k not in recipe_keys},
        "",
        source,
        frozenset({"recipe", "version", "free_plan", "overlap", *lists}),
    )
    free = raw.get("free_plan")
    top["free_plan"] = None if free is None else FreePlan(**_fields(FreePlan, free, "free_plan.", source))
    if "overlap" in raw:
        top["overlap"] = Overlap(**_fields(Overlap, raw["overlap"], "overlap.", source))
    if "sharding" not in raw and top.get("shard_optimizer"):
        top["sharding"] = Sharding.ZERO1  # written before the sharding field: shard_optimizer was ZeRO-1
    parts: dict[str, Any] = {}
    for key, cls in (("stages", StagePlan), ("alternatives", Alternative), ("baselines", Baseline)):
        if key not in raw:
            raise PlanFileError(f"{source}: {key} is missing; {_AGAIN}")
        if not isinstance(raw[key], list):
            raise _bad(source, key, raw[key], "a list")
        parts[key] = tuple(cls(**_fields(cls, x, f"{key}[{i}].", source)) for i, x in enumerate(raw[key]))
    plan = Plan(**top, **parts, recipe=recipe, version=PLAN_VERSION)  # read into this version's shape
    check_plan_values(plan, source)
    return plan


def _check_sharding(plan: Plan, bad: Any) -> None:
    """The sharding fields against each other and the replicas; the overlap's share in range."""
    D, g = plan.data_parallel, plan.shard_group
    if plan.shard_optimizer != (plan.sharding != Sharding.NONE):
        raise bad(f"shard_optimizer is {str(plan.shard_optimizer).lower()} with sharding {plan.sharding}")
    if plan.sharding != Sharding.NONE and D == 1:
        raise bad(f"sharding is {plan.sharding} with data_parallel 1 (sharding splits state over the replicas)")
    if g and (plan.sharding == Sharding.NONE or not 1 < g < D or D % g):
        raise bad(
            f"shard_group is {g} with sharding {plan.sharding} and data_parallel {D}; "
            "expected 0 (all replicas) or a divisor of data_parallel between 1 and it, with a sharding"
        )
    if not 0.0 <= plan.overlap.tp_comm <= 1.0:
        raise bad(f"overlap.tp_comm is {plan.overlap.tp_comm:g}, expected a share from 0 to 1")


def check_plan_values(plan: Plan, source: str = "plan") -> None:
    """Check what the fields say together: sizes in range, the batch, the schedule and where it
    puts each stage. PlanFileError naming the field and how to fix it. (No model needed.)"""

    def bad(message: str) -> PlanFileError:
        return PlanFileError(f"{source}: {message}; {_AGAIN}")

    S, v, m = plan.devices, plan.virtual, plan.micro_batches
    names = schedule_names()
    if plan.schedule not in names:
        raise bad(f"schedule {_shown(plan.schedule)} is unknown (known: {', '.join(names)})")
    spec = schedule_spec(plan.schedule)
    if plan.target not in TARGETS:
        raise bad(f"target {_shown(plan.target)} is unknown (known: {', '.join(TARGETS)})")
    if plan.free_plan is not None and plan.free_plan.schedule not in names:
        raise bad(f"free_plan.schedule {_shown(plan.free_plan.schedule)} is unknown (known: {', '.join(names)})")
    for name, value, most in (
        ("devices", S, MAX_DEVICES),
        ("data_parallel", plan.data_parallel, MAX_REPLICAS),
        ("tensor_parallel", plan.tensor_parallel, MAX_TENSOR_PARALLEL),
        ("expert_parallel", plan.expert_parallel, MAX_DEVICES),
        ("expert_tensor_parallel", plan.expert_tensor_parallel, MAX_TENSOR_PARALLEL),
        ("context_parallel", plan.context_parallel, MAX_TENSOR_PARALLEL),
        ("micro_batches", m, MAX_MICRO_BATCHES),
        ("micro_batch_size", plan.micro_batch_size, MAX_BATCH_SIZE),
        ("batch_size", plan.batch_size, MAX_BATCH_SIZE),
        ("virtual", v, MAX_VIRTUAL),
    ):
        if not 1 <= value <= most:
            raise bad(f"{name} is {value}, expected 1 to {most}")
    if plan.sequence_parallel and plan.tensor_parallel == 1:
        raise bad(
            "sequence_parallel is true with tensor_parallel 1 (sequence parallelism "
            "splits a tensor-parallel group's work)"
        )
    _check_memory_choice(plan, bad)
    experts = plan.expert_parallel * plan.expert_tensor_parallel
    stage = plan.tensor_parallel * plan.context_parallel * plan.data_parallel
    if stage % experts:
        raise bad(
            f"expert_parallel {plan.expert_parallel} x expert_tensor_parallel {plan.expert_tensor_parallel} does not "
            f"divide a stage's tensor_parallel x context_parallel x data_parallel = {stage} devices"
        )
    _check_sharding(plan, bad)
    if plan.hardware_flops < plan.model_flops:
        raise bad(
            f"hardware_flops {plan.hardware_flops:g} is below model_flops {plan.model_flops:g} (it adds recomputation)"
        )
    if not spec.takes_virtual and v != 1:
        raise bad(f"virtual is {v}, but the {spec.name} schedule runs one stage per device (virtual 1)")
    if plan.batch_size != m * plan.micro_batch_size:
        raise bad(f"batch_size {plan.batch_size} is not micro_batches {m} x micro_batch_size {plan.micro_batch_size}")
    if m < spec.least_micro_batches(S):
        raise bad(f"micro_batches is {m}, but {spec.name} on {S} devices runs at least {spec.least_micro_batches(S)}")
    if v > 1 and spec.micro_batches_multiple_of_devices and m % S:
        raise bad(f"micro_batches {m} is not a multiple of devices {S}, which {spec.name} with virtual {v} needs")
    if len(plan.stages) != S * v:
        raise bad(f"the plan has {len(plan.stages)} stage(s) but devices {S} x virtual {v} = {S * v}")
    if len(plan.peak_memory_bytes) != S:
        raise bad(f"peak_memory_bytes has {len(plan.peak_memory_bytes)} value(s), expected one per device ({S})")
    placed = spec.devices_of(S, v)
    seen: set[int] = set()
    for i, st in enumerate(plan.stages):
        if st.index != i:
            raise bad(f"stages[{i}] has index {st.index}, expected {i} (stages are numbered 0 .. {S * v - 1} in order)")
        if st.rank != placed[i]:
            raise bad(f"stage {i} is on device {st.rank}, but the {spec.name} schedule runs it on device {placed[i]}")
        if not st.blocks or not st.nodes or len(st.block_indices) != len(st.blocks):
            raise bad(
                f"stage {i} has {len(st.blocks)} block(s), {len(st.block_indices)} block index(es) "
                f"and {len(st.nodes)} node(s); "
                "every stage needs at least one block, with one index per block"
            )
        again = seen.intersection(st.block_indices)
        if again:
            raise bad(f"stage {i} holds block {min(again)} again (every block is on one stage)")
        seen.update(st.block_indices)
    for i, b in enumerate(plan.baselines):
        if not b.peak_memory_bytes:
            raise bad(f"baselines[{i}].peak_memory_bytes is empty, expected one value per device")


def _check_memory_choice(plan: Plan, bad: Any) -> None:
    """The uniform memory choice: known module kinds, each once, at most one of the three, and
    no stage recomputed whole beside it."""
    for field, kinds in (("recompute_modules", RECOMPUTE_KINDS), ("offload_modules", OFFLOAD_KINDS)):
        names = getattr(plan, field)
        wrong = [k for k in names if k not in kinds]
        if wrong or len(set(names)) != len(names):
            raise bad(
                f"{field} {list(names)} names {_shown(wrong[0]) if wrong else 'a kind twice'} "
                f"(known: {', '.join(kinds)})"
            )
    given = [f for f in ("recompute_modules", "recompute_layers", "offload_modules") if getattr(plan, f)]
    if len(given) > 1:
        raise bad(f"{' and '.join(given)} are both given; a plan makes one uniform memory choice")
    if given and any(s.recompute for s in plan.stages):
        raise bad(f"{given[0]} is given and stages recompute whole too; a plan makes one of the two choices")
    if not plan.recompute_layers and any(s.transient_bytes for s in plan.stages):
        raise bad("stages hold transient_bytes, which only recompute_layers gives")
