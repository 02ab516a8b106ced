"""The Profile: what every block of a model costs, the value the planner reasons with.

A Profile is plain data (no torch): the measured profiler (``measured.py``) and the analytic
cost model both produce one, ``autopipe profile`` writes one as JSON, and the solver reads
numbers from it. Costs depend on the micro-batch size ``u``; each is stored as an affine fit
``y(u) = intercept + slope * u`` over the micro-batch sizes that were profiled, so the planner
can price any micro-batch count.

Blocks are listed in a topological order of the model's graph. Tensors say which block
produces them (``src``, -1 for the model's inputs) and which blocks read them (``dsts``); a
tensor read by a block more than one position later is a skip connection.

How to build the model again and trace it into the same blocks is one value, the profile's
:class:`~autopipe.graph.recipe.TraceRecipe`, written as the ``"recipe"`` object (version 2);
version 1 files, with those fields at the top level, are read too.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from autopipe._io import atomic_write_text, parse_json, read_json, shown
from autopipe.errors import ProfileError
from autopipe.graph.kinds import OFFLOAD_KINDS, RECOMPUTE_KINDS
from autopipe.graph.recipe import TraceRecipe

__all__ = [
    "PROFILE_VERSION",
    "Affine",
    "BlockCost",
    "Contention",
    "ExecutorCost",
    "ExpertTimes",
    "MemoryOption",
    "Profile",
    "Spread",
    "TensorCost",
]

PROFILE_VERSION = 2
_READS = (1, PROFILE_VERSION)  # version 1: the recipe's fields at the top level
_WRITTEN = "give a profile written by 'autopipe profile'"


@dataclass(frozen=True)
class Affine:
    """``y(u) = intercept + slope * u``, a cost as a function of micro-batch size ``u``."""

    intercept: float
    slope: float

    def __call__(self, u: float) -> float:
        return self.intercept + self.slope * u

    def plus(self, other: Affine) -> Affine:
        """This cost with ``other`` added (a recomputed forward in a backward); a cost that is
        more than a line (``planner.cluster.experts``' hidden all-to-all) keeps its shape."""
        return Affine(self.intercept + other.intercept, self.slope + other.slope)

    @staticmethod
    def fit(xs: Sequence[float], ys: Sequence[float]) -> Affine:
        """Least-squares line through ``(xs, ys)``; never negative at ``u >= 0``.

        Measured times are noisy: a negative slope (more work taking less time) is clipped to
        zero, and a negative intercept to zero with the slope refit through the origin.
        """
        if len(xs) != len(ys) or not xs:
            raise ValueError(f"fit needs equal, non-empty xs and ys (got {len(xs)} and {len(ys)})")
        n = len(xs)
        if n == 1 or len(set(xs)) == 1:
            # One size only: assume cost proportional to the micro-batch size.
            mean_x = sum(xs) / n
            return Affine(0.0, max(0.0, sum(ys) / n / mean_x)) if mean_x else Affine(0.0, 0.0)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
        slope = max(0.0, sxy / sxx)
        intercept = my - slope * mx
        if intercept < 0.0:
            slope = max(0.0, sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs))
            intercept = 0.0
        return Affine(intercept, slope)


@dataclass(frozen=True)
class Spread:
    """How far a block's measured times scatter: the interquartile range of the timing rounds
    over their median (``timing.relative_spread``), per kind of work, the largest over the
    micro-batch sizes measured; 0 where not known (analytic profiles, profiles written before)."""

    forward: float = 0.0
    backward: float = 0.0
    backward_input: float = 0.0
    backward_weight: float = 0.0

    @property
    def widest(self) -> float:
        return max(self.forward, self.backward, self.backward_input, self.backward_weight)


_NONE = Affine(0.0, 0.0)


@dataclass(frozen=True)
class MemoryOption:
    """One way for a layer to keep fewer activations (``costs/activations/choices.py``): the module kinds it
    recomputes in the backward or offloads to the host (Megatron-LM's ``--recompute-modules``,
    ``--offload-modules``; ``graph/units.py``), counted from the layer's own ops."""

    recompute: tuple[str, ...] = ()  # module kinds recomputed (graph.units.RECOMPUTE_KINDS)
    offload: tuple[str, ...] = ()  # module kinds whose saved inputs go to the host (OFFLOAD_KINDS)
    saved_bytes: Affine = _NONE  # kept on the device per micro-batch under it
    recompute_s: Affine = _NONE  # the forward time run again in the backward
    recompute_flops: Affine = _NONE  # its FLOPs
    offload_bytes: Affine = _NONE  # copied to the host in the forward and back in the backward

    @property
    def name(self) -> str:
        """``recompute core_attn+mlp`` or ``offload qkv_linear``."""
        if self.recompute:
            return "recompute " + "+".join(self.recompute)
        return "offload " + "+".join(self.offload)


@dataclass(frozen=True)
class ExpertTimes:
    """Of a MoE block's times, its routed experts' compute (the ops ``costs.experts`` marks,
    the grouped GEMMs): what Megatron-Core's fine-grained schedule runs as the ``mlp``
    sub-module between the dispatch and the combine, the rest of the layer's compute running
    before the dispatch (``planner.cluster.experts.hidden_profile`` pairs the all-to-alls with
    them). Zero where not known (measured profiles, blocks without routed experts)."""

    forward: Affine = _NONE
    backward: Affine = _NONE  # input and weight gradients
    backward_input: Affine = _NONE  # input gradients (``--delay-wgrad-compute`` runs the weights' apart)

    def __bool__(self) -> bool:
        return any(a.intercept or a.slope for a in (self.forward, self.backward, self.backward_input))


@dataclass(frozen=True)
class BlockCost:
    """One block: the unit the solver places on a stage (about one layer of the model)."""

    name: str  # the user's module path, e.g. "layers.3", or the fx name of a loose op
    nodes: tuple[str, ...]  # fx node names in this block, in graph order
    params: int  # number of parameter elements the block owns (shared ones: first user)
    param_bytes: int  # bytes of those parameters
    forward_s: Affine  # forward time, seconds per micro-batch
    backward_s: Affine  # full backward time (input-grad + weight-grad)
    backward_input_s: Affine  # input-grad part of backward (zero-bubble "B")
    backward_weight_s: Affine  # weight-grad part of backward (zero-bubble "W")
    saved_bytes: Affine  # bytes saved for backward per micro-batch (activations)
    forward_flops: Affine = Affine(0.0, 0.0)  # counted FLOPs of one forward (analytic)
    backward_flops: Affine = Affine(0.0, 0.0)  # counted FLOPs of one full backward (analytic)
    # Bytes of parameters it uses that an earlier block owns (a tied LM head): a stage without
    # their owner holds its own copy, with gradients and optimizer state, as the executor does.
    shared_param_bytes: int = 0
    spread: Spread = Spread()  # the measured times' relative spread (0: not known)
    # Of ``params``, the routed experts' (priced under expert parallelism): their gradients are
    # reduced over the expert data-parallel group, not the data-parallel one (costs.experts).
    expert_params: int = 0
    experts_s: ExpertTimes = ExpertTimes()  # the routed experts' compute within the times above
    # A transformer layer (an attention core, graph/units.py): what Megatron-LM's "first k layers
    # of each stage" counts, and the ways it can keep fewer activations ((): none known).
    layer: bool = False
    memory: tuple[MemoryOption, ...] = ()
    # Bytes a stage holding this block keeps once, whatever the micro-batches in flight: an
    # offload's staging buffer (costs/activations/choices.py sets it on the profile a choice makes; 0 else).
    staging_bytes: Affine = _NONE
    # What autopipe's executor holds besides the saved tensors, measured (0: not known, analytic):
    # the bytes a split backward's B keeps for W per micro-batch (the gradients at the weight ops'
    # outputs), and the bytes a backward makes at its peak and frees (gradients flowing through).
    kept_bytes: Affine = _NONE
    backward_bytes: Affine = _NONE


@dataclass(frozen=True)
class TensorCost:
    """A tensor that flows between blocks (or from the model's inputs)."""

    name: str  # fx node name of the tensor
    src: int  # producing block index; -1 for a model input
    dsts: tuple[int, ...]  # consuming block indices, ascending
    bytes: Affine  # size at micro-batch size u
    dtype: str = "float32"
    shape: tuple[int, ...] = ()  # shape at micro-batch size 1 (batch dimension first)


@dataclass(frozen=True)
class Contention:
    """How much slower the host runs work when several single-thread workers run at once, as
    measured beside the profile (:mod:`autopipe.costs.measure.contention`): ``slowdown[i]`` is one of
    ``workers[i]`` workers' time per unit of work over one worker's alone, ``spread[i]`` how far
    that median may be off (relative). It holds the machine's own sharing (cores, caches, memory)
    and whatever else was running: a CPU-bound process beside the profile makes two workers
    about 1.5x slower on 2 cores. ``threads`` is the threads per rank the profile was measured on.
    The planner prices S ranks of a CPU plan at :meth:`factor` (S) times the profiled compute."""

    workers: tuple[int, ...] = ()  # ascending, the first 1 (slowdown 1 by definition)
    slowdown: tuple[float, ...] = ()
    spread: tuple[float, ...] = ()
    cores: int = 0  # os.cpu_count() of the host measured
    threads: int = 1  # threads per rank (the profile's)

    def __bool__(self) -> bool:
        return bool(self.workers)

    def slowdown_at(self, workers: float) -> tuple[float, float]:
        """(slowdown, spread) of ``workers`` at once: linear between the measured counts; past
        the largest, that one's slowdown times the oversubscription (``workers / largest``) once
        the largest filled the cores, else held."""
        if not self.workers or workers <= 1:
            return 1.0, 0.0
        ks = self.workers
        for i in range(1, len(ks)):
            if workers <= ks[i]:
                w = (workers - ks[i - 1]) / (ks[i] - ks[i - 1])
                return (
                    self.slowdown[i - 1] + w * (self.slowdown[i] - self.slowdown[i - 1]),
                    max(self.spread[i - 1], self.spread[i]),
                )
        over = workers / ks[-1] if ks[-1] >= self.cores else 1.0
        return self.slowdown[-1] * over, self.spread[-1]

    def factor(self, ranks: int) -> tuple[float, float]:
        """(compute factor, its relative spread) for ``ranks`` pipeline ranks of ``threads``
        threads each sharing this host, against the profile's one rank: slowdown at
        ``ranks x threads`` workers over slowdown at ``threads``; (1, 0) when not measured."""
        if not self.workers:
            return 1.0, 0.0
        many, spread_many = self.slowdown_at(ranks * self.threads)
        one, spread_one = self.slowdown_at(self.threads)
        return max(1.0, many / one), spread_many + spread_one


@dataclass(frozen=True)
class ExecutorCost:
    """What autopipe's executor spends besides the blocks' compute, measured beside a CPU profile
    (:mod:`autopipe.costs.executor`): ``action_s`` per F, B or W action, ``send_s`` on top per
    action that posts a send to another rank (:mod:`autopipe.simulate.sends`), each with its
    relative spread. Falsy where not measured; the planner then takes its defaults by device
    (``planner/defaults.py``)."""

    action_s: float = 0.0
    send_s: float = 0.0
    action_spread: float = 0.0
    send_spread: float = 0.0
    measured: bool = False

    def __bool__(self) -> bool:
        return self.measured


@dataclass(frozen=True)
class Profile:
    """Per-block costs of one model on one device; the planner's input."""

    model: str  # the model file spec it was made from, for people
    recipe: TraceRecipe  # how to rebuild and re-trace it exactly (the executor and emit need the same blocks)
    device: str  # e.g. "cpu (2 threads)" or "cuda: NVIDIA H200"
    torch_version: str
    dtype: str
    micro_batch_sizes: tuple[int, ...]  # the sizes that were measured or counted
    method: str  # "measured" or "analytic"
    blocks: tuple[BlockCost, ...]
    tensors: tuple[TensorCost, ...]
    shared_params: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (name, blocks using it)
    # The machine's 1-minute load average (os.getloadavg) before and after measuring; () not known.
    load_average: tuple[float, ...] = ()
    # Several ranks sharing this host, measured beside a CPU profile (Contention() where not).
    contention: Contention = Contention()
    # The executor's own cost per action and per remote send, measured beside a CPU profile (falsy where not).
    executor: ExecutorCost = ExecutorCost()
    version: int = PROFILE_VERSION

    @property
    def spread(self) -> float:
        """The widest relative spread of any block's measured times (0: none known)."""
        return max((b.spread.widest for b in self.blocks), default=0.0)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def slowed(self, factor: float) -> Profile:
        """This profile with every block's times ``factor`` times longer (ranks sharing a host,
        :meth:`Contention.factor`), a recomputed part's with them; spreads (relative), memory, FLOPs and
        tensors as they are."""

        def times(a: Affine) -> Affine:
            return Affine(a.intercept * factor, a.slope * factor)

        return replace(
            self,
            blocks=tuple(
                replace(
                    b,
                    forward_s=times(b.forward_s),
                    backward_s=times(b.backward_s),
                    backward_input_s=times(b.backward_input_s),
                    backward_weight_s=times(b.backward_weight_s),
                    experts_s=ExpertTimes(
                        *map(times, (b.experts_s.forward, b.experts_s.backward, b.experts_s.backward_input))
                    ),
                    memory=tuple(replace(o, recompute_s=times(o.recompute_s)) for o in b.memory),
                )
                for b in self.blocks
            ),
        )

    def to_json(self) -> str:
        raw = asdict(self)
        # fields added since version 2 began, left out at their defaults: a profile without error
        # bars (analytic, or written before) is written as it always was
        if not raw["load_average"]:
            del raw["load_average"]
        if not self.contention:
            del raw["contention"]
        if not self.executor:
            del raw["executor"]
        for block in raw["blocks"]:
            if not any(block["spread"].values()):
                del block["spread"]
            if not block["expert_params"]:
                del block["expert_params"]
            if not any(any(a.values()) for a in block["experts_s"].values()):
                del block["experts_s"]
            for field in ("layer", "memory"):  # left out where not known (measured before, no layers)
                if not block[field]:
                    del block[field]
            for option in block.get("memory", ()):  # each option keeps what it says: a recompute no copies
                for key in [k for k, v in option.items() if not v or (isinstance(v, dict) and not any(v.values()))]:
                    del option[key]
            for field in ("staging_bytes", "kept_bytes", "backward_bytes"):  # 0: left out
                if not any(block[field].values()):
                    del block[field]
        return json.dumps(raw, indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str | bytes, source: str = "profile") -> Profile:
        raw = parse_json(text, source, "a profile", ProfileError, _WRITTEN)
        profile = _profile_from_dict(raw, source)
        _check(profile, source)
        return profile

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, self.to_json())

    @staticmethod
    def load(path: str | Path) -> Profile:
        named = shown(path) if isinstance(path, (str, Path)) else ""
        missing = f"profile file not found: {named}; make one with 'autopipe profile MODEL -o {named}'"
        raw = read_json(path, "a profile", ProfileError, _WRITTEN, missing=missing)
        profile = _profile_from_dict(raw, named)
        _check(profile, named)
        return profile

    def check_blocks(self, blocks: Sequence[tuple[str, Sequence[str]]], source: str = "profile") -> None:
        """ProfileError unless ``blocks`` (name and fx nodes of each block the model traces
        into) are this profile's blocks: a hand-edited profile plans a model that is not there."""
        for i, b in enumerate(self.blocks):
            if i >= len(blocks):
                raise ProfileError(
                    f"{source} has {self.num_blocks} blocks, the model traces into {len(blocks)}: block {i} {b.name!r} "
                    "is not in the model; profile the model again"
                )
            name, nodes = blocks[i]
            if (b.name, b.nodes) != (name, tuple(nodes)):
                unknown = [n for n in b.nodes if n not in nodes]
                what = f"node {unknown[0]!r}, which" if unknown else f"{b.name!r}, which"
                raise ProfileError(
                    f"{source}: block {i} holds {what} the model's block {i} ({name!r}) does not; "
                    "profile the model again"
                )
        if len(blocks) > self.num_blocks:
            raise ProfileError(
                f"{source} has {self.num_blocks} blocks, the model traces into {len(blocks)}; profile the model again"
            )


def _affine(raw: Any) -> Affine:
    return Affine(float(raw["intercept"]), float(raw["slope"]))


def _spread(raw: Any) -> Spread:
    if raw is None:
        return Spread()
    if not isinstance(raw, dict):
        raise TypeError(f"a spread is {type(raw).__name__}, not an object")
    return Spread(**{k: float(raw.get(k, 0.0)) for k in ("forward", "backward", "backward_input", "backward_weight")})


_ZERO = {"intercept": 0.0, "slope": 0.0}


def _flag(raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise TypeError(f"layer is {raw!r}, not true or false")
    return raw


def _kinds(raw: Any, known: Sequence[str], what: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or any(not isinstance(k, str) or k not in known for k in raw):
        raise ValueError(f"{what} is {raw!r}, not a list of module kinds among {', '.join(known)}")
    return tuple(raw)


def _option(raw: Any) -> MemoryOption:
    if not isinstance(raw, dict):
        raise TypeError(f"a memory option is {type(raw).__name__}, not an object")
    option = MemoryOption(
        recompute=_kinds(raw.get("recompute", []), tuple(RECOMPUTE_KINDS), "memory.recompute"),
        offload=_kinds(raw.get("offload", []), tuple(OFFLOAD_KINDS), "memory.offload"),
        **{k: _affine(raw.get(k, _ZERO)) for k in ("saved_bytes", "recompute_s", "recompute_flops", "offload_bytes")},
    )
    if bool(option.recompute) == bool(option.offload):
        raise ValueError(
            f"a memory option names {raw.get('recompute')} recomputed and {raw.get('offload')} offloaded; "
            "it is one or the other"
        )
    return option


def _load(raw: Any) -> tuple[float, ...]:
    if not isinstance(raw, list) or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in raw):
        raise TypeError(f"load_average is {raw!r}, not a list of numbers")
    return tuple(float(x) for x in raw)


def _contention(raw: Any) -> Contention:
    if raw is None:
        return Contention()
    if not isinstance(raw, dict):
        raise TypeError(f"contention is {type(raw).__name__}, not an object")
    lists = {k: raw.get(k, []) for k in ("workers", "slowdown", "spread")}
    for k, v in lists.items():
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in v):
            raise TypeError(f"contention.{k} is {v!r}, not a list of numbers")
    return Contention(
        workers=tuple(int(x) for x in lists["workers"]),
        slowdown=tuple(float(x) for x in lists["slowdown"]),
        spread=tuple(float(x) for x in lists["spread"]),
        cores=int(raw.get("cores", 0)),
        threads=int(raw.get("threads", 1)),
    )


def _executor(raw: Any) -> ExecutorCost:
    if raw is None:
        return ExecutorCost()
    if not isinstance(raw, dict):
        raise TypeError(f"executor is {type(raw).__name__}, not an object")
    values = {k: raw.get(k, 0.0) for k in ("action_s", "send_s", "action_spread", "send_spread")}
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"executor.{k} is {v!r}, not a number")
    return ExecutorCost(**{k: float(v) for k, v in values.items()}, measured=bool(raw.get("measured", True)))


def _count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"a parameter count is {v!r}, not a whole number")
    return v


def _name(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"a name is {type(v).__name__} {v!r}, not a string")
    return v


def _experts(raw: Any) -> ExpertTimes:
    if raw is None:
        return ExpertTimes()
    return ExpertTimes(_affine(raw["forward"]), _affine(raw["backward"]), _affine(raw["backward_input"]))


def _profile_from_dict(raw: Any, source: str = "profile") -> Profile:
    if not isinstance(raw, dict) or "version" not in raw:
        raise ProfileError(
            f"{source} is not an autopipe profile (no 'version' field); make one with 'autopipe profile'"
        )
    if isinstance(raw["version"], bool) or raw["version"] not in _READS:
        raise ProfileError(
            f"{source} has profile version {raw['version']!r}, this autopipe reads versions "
            f"{' and '.join(map(str, _READS))}; profile the model again"
        )
    try:
        blocks = tuple(
            BlockCost(
                name=_name(b["name"]),
                nodes=tuple(_name(n) for n in b["nodes"]),
                params=int(b["params"]),
                param_bytes=int(b["param_bytes"]),
                forward_s=_affine(b["forward_s"]),
                backward_s=_affine(b["backward_s"]),
                backward_input_s=_affine(b["backward_input_s"]),
                backward_weight_s=_affine(b["backward_weight_s"]),
                saved_bytes=_affine(b["saved_bytes"]),
                forward_flops=_affine(b.get("forward_flops", {"intercept": 0, "slope": 0})),
                backward_flops=_affine(b.get("backward_flops", {"intercept": 0, "slope": 0})),
                shared_param_bytes=int(b.get("shared_param_bytes", 0)),
                spread=_spread(b.get("spread")),
                expert_params=_count(b.get("expert_params", 0)),
                experts_s=_experts(b.get("experts_s")),
                layer=_flag(b.get("layer", False)),
                memory=tuple(_option(o) for o in b.get("memory", ())),
                staging_bytes=_affine(b.get("staging_bytes", {"intercept": 0, "slope": 0})),
                kept_bytes=_affine(b.get("kept_bytes", {"intercept": 0, "slope": 0})),
                backward_bytes=_affine(b.get("backward_bytes", {"intercept": 0, "slope": 0})),
            )
            for b in raw["blocks"]
        )
        tensors = tuple(
            TensorCost(
                name=_name(t["name"]),
                src=int(t["src"]),
                dsts=tuple(int(d) for d in t["dsts"]),
                bytes=_affine(t["bytes"]),
                dtype=t.get("dtype", "float32"),
                shape=tuple(int(s) for s in t.get("shape", ())),
            )
            for t in raw["tensors"]
        )
        return Profile(
            model=raw["model"],
            recipe=TraceRecipe.from_dict(raw["recipe"] if raw["version"] >= 2 else raw),
            device=raw["device"],
            torch_version=raw["torch_version"],
            dtype=raw["dtype"],
            micro_batch_sizes=tuple(int(u) for u in raw["micro_batch_sizes"]),
            method=raw["method"],
            blocks=blocks,
            tensors=tensors,
            shared_params=tuple((str(n), tuple(int(i) for i in bs)) for n, bs in raw.get("shared_params", ())),
            load_average=_load(raw.get("load_average", [])),
            contention=_contention(raw.get("contention")),
            executor=_executor(raw.get("executor")),
            version=PROFILE_VERSION,  # read into this version's shape
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ProfileError(f"{source} is corrupt ({type(e).__name__}: {e}); profile the model again") from None


def _check(p: Profile, source: str) -> None:
    """One line for a profile that reads but cannot be planned: no blocks, a node in two
    blocks, a tensor between blocks that are not there, costs that are negative or not finite."""
    n = p.num_blocks
    if n == 0:
        raise ProfileError(f"{source} has no blocks; profile the model again")
    seen: dict[str, int] = {}
    for i, b in enumerate(p.blocks):
        if not b.nodes:
            raise ProfileError(f"{source}: block {i} ({b.name!r}) has no nodes; profile the model again")
        for node in b.nodes:
            if node in seen:
                raise ProfileError(
                    f"{source}: node {node!r} is in blocks {seen[node]} and {i}; profile the model again"
                )
            seen[node] = i
        for field in (
            "forward_s",
            "backward_s",
            "backward_input_s",
            "backward_weight_s",
            "saved_bytes",
            "staging_bytes",
            "kept_bytes",
            "backward_bytes",
        ):
            cost: Affine = getattr(b, field)
            if not all(math.isfinite(v) and v >= 0 for v in (cost.intercept, cost.slope)):
                raise ProfileError(
                    f"{source}: block {i} ({b.name!r}) has {field} {cost}; costs must be finite and >= 0, profile again"
                )
        for option in b.memory:
            for field in ("saved_bytes", "recompute_s", "recompute_flops", "offload_bytes"):
                cost = getattr(option, field)
                if not all(math.isfinite(v) and v >= 0 for v in (cost.intercept, cost.slope)):
                    raise ProfileError(
                        f"{source}: block {i} ({b.name!r}) has {option.name} {field} {cost}; costs must be finite "
                        "and >= 0, profile again"
                    )
        for kind, v in asdict(b.spread).items():
            if not (math.isfinite(v) and v >= 0):
                raise ProfileError(
                    f"{source}: block {i} ({b.name!r}) has spread.{kind} {v}; a spread must be finite and >= 0, "
                    "profile again"
                )
        if b.params < 0 or b.param_bytes < 0 or b.shared_param_bytes < 0:
            raise ProfileError(
                f"{source}: block {i} ({b.name!r}) has a negative parameter count; profile the model again"
            )
        if not 0 <= b.expert_params <= b.params:
            raise ProfileError(
                f"{source}: block {i} ({b.name!r}) has expert_params {b.expert_params}, expected 0 to its "
                f"{b.params} params; profile the model again"
            )
    for t in p.tensors:
        if not -1 <= t.src < n or any(not t.src < d < n for d in t.dsts):
            raise ProfileError(
                f"{source}: tensor {t.name!r} goes from block {t.src} to {list(t.dsts)}, but the blocks are "
                f"0 to {n - 1}; "
                "profile the model again"
            )
        if not all(math.isfinite(v) and v >= 0 for v in (t.bytes.intercept, t.bytes.slope)):
            raise ProfileError(
                f"{source}: tensor {t.name!r} has bytes {t.bytes}; sizes must be finite and >= 0, profile again"
            )
    if len(p.load_average) > 2 or not all(math.isfinite(x) and x >= 0 for x in p.load_average):
        raise ProfileError(
            f"{source} has load_average {list(p.load_average)}; the load averages before and after measuring are "
            "at most two "
            "finite numbers >= 0, profile again"
        )
    _check_contention(p.contention, source)
    _check_executor(p.executor, source)
    if not p.micro_batch_sizes or any(u < 1 for u in p.micro_batch_sizes):
        raise ProfileError(
            f"{source} has micro_batch_sizes {list(p.micro_batch_sizes)}; they must be positive, profile again"
        )


def _check_executor(e: ExecutorCost, source: str) -> None:
    if not all(math.isfinite(x) and 0 <= x <= 10.0 for x in (e.action_s, e.send_s)) or not all(
        math.isfinite(x) and 0 <= x <= 1e6 for x in (e.action_spread, e.send_spread)
    ):
        raise ProfileError(
            f"{source} has a bad executor object (action_s {e.action_s!r}, send_s {e.send_s!r}, spreads "
            f"{e.action_spread!r}, {e.send_spread!r}): seconds from 0 to 10 and spreads >= 0; profile again"
        )


def _check_contention(c: Contention, source: str) -> None:
    if not c:
        return
    n, ks = len(c.workers), c.workers
    ok = (
        len(c.slowdown) == n
        and len(c.spread) == n
        and ks[0] == 1
        and all(a < b for a, b in itertools.pairwise(ks))
        and all(math.isfinite(x) and 0 < x <= 1e6 for x in c.slowdown)
        and all(math.isfinite(x) and 0 <= x <= 1e6 for x in c.spread)
        and 1 <= c.cores <= 2**20
        and 1 <= c.threads <= 2**20
    )
    if not ok:
        raise ProfileError(
            f"{source} has a bad contention object (workers {list(ks)[:8]}, slowdown {list(c.slowdown)[:8]}): "
            "workers ascending from 1, one positive slowdown and one spread >= 0 per count, cores and threads >= 1; "
            "profile again"
        )
