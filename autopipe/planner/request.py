"""What the planner is asked: :class:`PlanRequest`, its checks, and the decisions it allows.

A request pins what the user decided (devices, batch, memory limit, and optionally
micro-batches, schedule, virtual stages, recomputation) and says what the hardware costs
(link, the executor's cost per action); :func:`decisions` lists the (schedule, v, m) the
search may take, and :func:`validate` turns a request that cannot be planned into one clear
line. :mod:`autopipe.planner.defaults` fills in what the user left out, for the API and the CLI.

Words (the glossary; every module, flag and keyword uses them so):

- a *device* is one pipeline rank: ``autopipe plan --devices`` (or ``--stages``, the same),
  ``autopipe.plan(devices=)`` (or ``stages=``), ``PlanRequest.devices``, ``Plan.devices`` (S);
- a *stage* (or *chunk*) is one contiguous piece of the model: a device holds ``v`` of them
  (``virtual``) under the interleaved and V schedules, so S·v are cut in all
  (``Plan.stages``, ``PartitionProblem.stages``);
- the *pipeline depth* is the devices of one pipeline; with ``--gpus G`` (tensor x pipeline x
  data parallel) ``--stages``/``stages=`` pins it, and G = t x depth x D (``ParallelRequest.stages``);
- the *memory limit* is bytes per device: ``memory`` (API, ``--memory``), ``memory_limit``
  in requests, ``memory_limit_bytes`` in the plan file; each of a device's ``v`` stages gets
  ``memory_limit / v`` (``PartitionProblem.stage_memory_limit``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

from autopipe.costs.activations.choices import NO_CHOICE, MemoryChoice
from autopipe.costs.profile import MemoryOption, Profile
from autopipe.errors import InfeasibleError, PlanError
from autopipe.modes import Recompute
from autopipe.planner.pricing import Decision
from autopipe.plans import MAX_BATCH_SIZE, MAX_DEVICES, MAX_MICRO_BATCHES
from autopipe.schedules import ScheduleSpec, schedule_names, schedule_spec, search_order
from autopipe.schedules.targets import TARGETS, Target, target_spec
from autopipe.schedules.torch_limits import torch_refusal
from autopipe.units import check_int, format_bytes

__all__ = [
    "API_WORDS",
    "CHOICE_FIELDS",
    "DEFAULT_LINK",
    "LINK_FIELDS",
    "MAX_MICRO_BATCHES",
    "NO_CHOICES",
    "SEARCH_SCHEDULES",
    "TARGETS",
    "Choices",
    "Link",
    "PlanRequest",
    "Target",
    "Words",
    "check_target",
    "decisions",
    "divisors",
    "infeasible_error",
    "target_spec",
    "validate",
]

SEARCH_SCHEDULES = tuple(s.name for s in search_order() if s.searched)  # ties go to the first (ScheduleSpec.preference)


# MAX_MICRO_BATCHES (plans.py) is the most micro-batches autopipe plans or runs: a schedule is
# priced by simulating every one of them, so it keeps any request within seconds (2**16 take about 5 s).


@dataclass(frozen=True)
class Choices:
    """What the user may pin of a plan's decisions; ``None`` (and ``auto``) leave it to the search.

    One value taken whole by ``autopipe.plan``, ``autopipe.plan_profile``,
    ``autopipe.plan_cluster``, :class:`PlanRequest` and the tensor x pipeline x data request.
    """

    micro_batches: int | None = None  # m: micro-batches per iteration (per pipeline)
    schedule: str | None = None  # a schedule name (autopipe.schedules.schedule_names())
    virtual: int | None = None  # v: stages per device, for the interleaved and V schedules
    recompute: Recompute = Recompute.AUTO  # which stages recompute their activations
    target: str = "autopipe"  # the framework that runs the plan: the search keeps to what it runs (TARGETS)
    # The uniform memory choice (costs/activations/choices.py; the plan's fields of the same names): module
    # kinds recomputed in every layer, the first k layers of each stage recomputed, module kinds
    # offloaded. None leaves the form to the search; () or 0 rules it out; a value pins it (and
    # rules the other two out).
    recompute_modules: tuple[str, ...] | None = None
    recompute_layers: int | None = None
    offload_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:  # types here (the API's values); ranges in validate, in the caller's words
        for name in ("micro_batches", "virtual"):
            if getattr(self, name) is not None:
                check_int(getattr(self, name), name)
        for name in ("schedule", "target"):
            value = getattr(self, name)
            if not (isinstance(value, str) or (name == "schedule" and value is None)):
                raise PlanError(
                    f"{name} must be a name (a str), like {'1f1b' if name == 'schedule' else 'megatron'}, not {value!r}"
                )
        for name in ("recompute_modules", "offload_modules"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = tuple(v for v in value.replace(",", " ").split() if v != "none")
                object.__setattr__(self, name, value)
            if value is not None and (
                not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value)
            ):
                raise PlanError(f"{name} must be module kinds (strs), like ('core_attn', 'mlp'), not {value!r}")
            if value is not None:
                object.__setattr__(self, name, tuple(value))
        if self.recompute_layers is not None:
            check_int(self.recompute_layers, "recompute_layers", low=0)
        if isinstance(self.recompute, str) and self.recompute in Recompute._value2member_map_:
            object.__setattr__(
                self, "recompute", Recompute(self.recompute)
            )  # text in, the mode kept; bad text: validate says


@dataclass(frozen=True)
class Link:
    """What the hardware between neighbouring devices costs; ``None`` takes the default for the
    device (:mod:`autopipe.planner.defaults`)."""

    bandwidth: float | None = None  # bytes/s, one direction
    latency_s: float | None = None  # seconds per message
    action_overhead_s: float | None = None  # the executor's own time per F, B or W action
    send_overhead_s: float | None = None  # and per action that posts a send to another rank, on top

    def __post_init__(self) -> None:  # types here; ranges in validate, in the caller's words
        for name, like in (
            ("bandwidth", "25e9 for 25 GB/s"),
            ("latency_s", "20e-6 for 20 us"),
            ("action_overhead_s", "1e-3 for 1 ms"),
            ("send_overhead_s", "5e-4 for 0.5 ms"),
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                unit = "bytes per second" if name == "bandwidth" else "seconds"
                raise PlanError(
                    f"{name} must be a number of {unit}, like {like} (got {value!r}, a {type(value).__name__})"
                )


NO_CHOICES = Choices()  # every decision left to the search
DEFAULT_LINK = Link()  # every cost the device's default
CHOICE_FIELDS = tuple(f.name for f in fields(Choices))
LINK_FIELDS = tuple(f.name for f in fields(Link))


@dataclass(frozen=True)
class Words:
    """How errors name a request's fields: the API's keywords (``stages=4``, the default), or a
    front end's own names (the CLI's flags: ``--stages 4``, one table in ``cli/``)."""

    names: tuple[tuple[str, str], ...] = ()  # field -> how the caller says it; a field not here: its own name
    joiner: str = "="  # between a name and its value: stages=4; the CLI's " ": --stages 4

    def name(self, field: str) -> str:
        return dict(self.names).get(field, field)

    def said(self, field: str, value: object) -> str:
        return f"{self.name(field)}{self.joiner}{value}"


API_WORDS = Words()


@dataclass(frozen=True)
class PlanRequest:
    """What the user asks for, with every default decided (:func:`~autopipe.planner.defaults.plan_request`
    builds one from :class:`Choices` and a :class:`Link`); ``None`` leaves a decision to the search.

    The search reads the fields; :attr:`choices` and :attr:`link` give them back as the values.
    """

    devices: int  # S: pipeline devices (``--devices``/``--stages``, ``devices=``/``stages=``)
    batch_size: int  # samples per iteration (per pipeline)
    memory_limit: float  # bytes per device (``--memory``, ``memory=``)
    micro_batches: int | None = None
    schedule: str | None = None
    virtual: int | None = None  # stages per device, interleaved 1F1B only
    recompute: Recompute = Recompute.AUTO
    target: str = "autopipe"  # the framework that runs the plan (TARGETS): the schedules and recomputation searched
    link_bandwidth: float = 10e9  # bytes/s between neighbouring devices
    link_latency_s: float = 20e-6
    action_overhead_s: float = 0.0  # the executor's fixed cost per F, B or W (default_action_overhead)
    send_overhead_s: float = 0.0  # and per F or B that sends to another rank, on top (default_send_overhead)
    state_factor: float = 4.0  # bytes kept per parameter byte: weights, grads, Adam m and v
    alternatives: int = 5
    blocking_sends: tuple[str, ...] = ()  # schedules whose pipeline sends block the sender (Overlap.p2p off)
    recompute_modules: tuple[str, ...] | None = None  # the uniform memory choice, as Choices says
    recompute_layers: int | None = None
    offload_modules: tuple[str, ...] | None = None
    host_bandwidth: float = 0.0  # bytes/s to the host, one direction (offload; 0: no host link known)

    @property
    def choices(self) -> Choices:
        return Choices(
            self.micro_batches,
            self.schedule,
            self.virtual,
            self.recompute,
            self.target,
            self.recompute_modules,
            self.recompute_layers,
            self.offload_modules,
        )

    @property
    def link(self) -> Link:
        return Link(self.link_bandwidth, self.link_latency_s, self.action_overhead_s, self.send_overhead_s)

    @property
    def memory_pin(self) -> MemoryChoice | None:
        """The memory choice the request pins (none of the three forms when each is ruled out),
        or None where it leaves one to the search."""
        return pin_of(self.recompute_modules, self.recompute_layers, self.offload_modules)

    def pinned_to(self, choice: MemoryChoice) -> PlanRequest:
        """This request with the memory choice pinned to ``choice`` (how the search tries each)."""
        return replace(
            self, recompute_modules=choice.recompute, recompute_layers=choice.layers, offload_modules=choice.offload
        )


def pin_of(
    recompute_modules: tuple[str, ...] | None, recompute_layers: int | None, offload_modules: tuple[str, ...] | None
) -> MemoryChoice | None:
    """The :class:`MemoryChoice` the three fields pin (a value pins its form and rules the others
    out; all three ruled out pins none), or None where some form is left to the search;
    PlanError (one line) for two forms pinned at once or unknown module kinds."""
    given = [x for x in (recompute_modules, recompute_layers, offload_modules) if x]
    if given:
        return MemoryChoice(recompute_modules or (), offload_modules or (), recompute_layers or 0)
    if None in (recompute_modules, recompute_layers, offload_modules):
        return None
    return NO_CHOICE


def divisors(n: int, at_most: int = MAX_MICRO_BATCHES) -> list[int]:
    """The divisors of ``n`` up to ``at_most``, ascending: at most ``at_most`` steps, whatever
    ``n`` is (a batch of 10**15 has divisors up to 10**15; only micro-batch counts are asked for)."""
    return [d for d in range(1, min(n, at_most) + 1) if n % d == 0]


def _traceable(profile: Profile, u: int) -> bool:
    """Whether the executor's trace at micro-batch size ``u`` has the profile's graph.

    ``torch.export`` specialises dimensions of size 1, so it traces a micro-batch of 1 with
    another graph than larger ones: an export profile plans u = 1 only if it was measured at
    1 (alone, costs/measure/measured.py), and u > 1 only if it was not.
    """
    if profile.recipe.tracer != "export":
        return True
    return (u == 1) == (min(profile.micro_batch_sizes, default=2) == 1)


def decisions(profile: Profile, req: PlanRequest) -> list[Decision]:
    S, n = req.devices, profile.num_blocks
    ms = [req.micro_batches] if req.micro_batches else divisors(req.batch_size)
    ms = [m for m in ms if _traceable(profile, req.batch_size // m)]
    target = target_spec(req.target)
    allowed = target.recomputing() if req.recompute == "always" else target.schedules  # auto: the search splits it
    schedules = [s for s in ([req.schedule] if req.schedule else SEARCH_SCHEDULES) if s in allowed]
    on_torch = req.target in ("torch", "torchtitan")  # torchtitan runs torch's schedule classes
    torch_runs = (lambda name, m, v: torch_refusal(name, S, m, S * v) is None) if on_torch else None
    out = []
    memory = req.memory_pin or NO_CHOICE  # the search pins each choice it tries (planner/search.py)
    for m in ms:
        for name in schedules:
            spec = schedule_spec(name)
            if not spec.takes_virtual:
                out.append(Decision(name, 1, m, memory))
                continue
            vs = [req.virtual] if req.virtual else list(spec.virtual_choices)
            for v in vs:
                if spec.searchable(S, m, v) and S * v <= n:
                    out.append(Decision(name, v, m, memory))
    out = [d for d in out if torch_runs is None or torch_runs(d.schedule, d.micro_batches, d.virtual)]
    return out


# --------------------------------------------------------------------------- checks


def validate(profile: Profile, req: PlanRequest, words: Words = API_WORDS) -> None:
    """PlanError, one line naming the fields as ``words`` says (the API's keywords; the CLI's flags)."""
    _check_sizes(profile, req, words)
    _check_micro_batches(profile, req, words)
    _check_target(req, words)
    _check_memory(profile, req, words)
    spec, least = _check_schedule(profile, req, words)
    n, S, B = profile.num_blocks, req.devices, req.batch_size
    w, said = words.name, words.said
    if req.recompute not in ("auto", "never", "always"):
        raise PlanError(f"recompute must be auto, never or always (got {req.recompute!r})")
    if not req.link_bandwidth > 0 or req.link_latency_s < 0:
        raise PlanError("link bandwidth must be positive and latency non-negative")
    if not req.action_overhead_s >= 0:
        raise PlanError(f"{w('action_overhead_s')} must be zero or more (got {req.action_overhead_s})")
    if not req.send_overhead_s >= 0:
        raise PlanError(f"{w('send_overhead_s')} must be zero or more (got {req.send_overhead_s})")
    timed = [c for b in profile.blocks for c in (b.forward_s, b.backward_s)]
    if req.action_overhead_s == 0 and not any(c.intercept or c.slope for c in timed):
        raise PlanError(  # every plan would take 0 s: infinitely fast, and no choice between them
            "the profile's blocks take no time (every forward and backward 0 s) and nothing is charged per action; "
            "profile the model again, or give the executor's time per action "
            f"({said('action_overhead_s', '20us')})"
        )
    if not decisions(profile, req):
        if least > 1 and B < least:
            raise PlanError(
                f"{req.schedule} needs at least {least} micro-batches on {S} devices, "
                f"more than {said('batch_size', B)}; use {said('batch_size', least)} or more"
            )
        chunked = spec.name if spec is not None else " and ".join(s.name for s in search_order() if s.takes_virtual)
        raise PlanError(
            f"no schedule fits the request: {chunked} needs micro-batches divisible by {S} and {S} x v <= {n} blocks"
        )


def _check_sizes(profile: Profile, req: PlanRequest, words: Words) -> None:
    """Devices, blocks, batch and memory limit: each in range."""
    n, S, B = profile.num_blocks, req.devices, req.batch_size
    w, said = words.name, words.said
    if S < 1:
        raise PlanError(f"{w('stages')} must be at least 1 (got {S})")
    if n == 0:
        raise PlanError("the profile has no blocks, so there is nothing to cut; profile the model again")
    if S > n:
        raise PlanError(
            f"cannot cut {n} blocks into {S} stages; use {said('stages', n)} or fewer, "
            f"or finer blocks when profiling ({w('max_blocks')})"
        )
    if B < 1:
        raise PlanError(f"{w('batch_size')} must be at least 1 (got {B})")
    if B > MAX_BATCH_SIZE:
        raise PlanError(
            f"{said('batch_size', B)} is more than autopipe plans "
            f"(at most {MAX_BATCH_SIZE} = 2**31 samples per pipeline); use a smaller batch"
        )
    if S > MAX_DEVICES:
        raise PlanError(f"{said('stages', S)} is more than autopipe plans (at most {MAX_DEVICES} = 2**12); use fewer")
    if not req.memory_limit > 0:
        raise PlanError(f"{w('memory')} must be positive (got {req.memory_limit})")


def _check_micro_batches(profile: Profile, req: PlanRequest, words: Words) -> None:
    """A pinned micro-batch count divides the batch; the profile can price its micro-batch size."""
    B = req.batch_size
    w, said = words.name, words.said
    if req.micro_batches is not None:
        m = req.micro_batches
        if m < 1:
            raise PlanError(f"{w('micro_batches')} must be at least 1 (got {m})")
        if m > MAX_MICRO_BATCHES:
            raise PlanError(
                f"{said('micro_batches', m)} is more than autopipe plans "
                f"(at most {MAX_MICRO_BATCHES} = 2**16); use fewer"
            )
        if B % m:
            raise PlanError(f"batch size {B} is not divisible into {m} micro-batches; use one of {_some_divisors(B)}")
    if req.micro_batches is not None and not _traceable(profile, B // req.micro_batches):
        if B // req.micro_batches == 1:
            raise PlanError(
                "torch.export traced this model, and it traces a micro-batch of 1 with another graph; "
                f"use at most {B // 2} micro-batches (micro-batches of 2 or more)"
                if B > 1
                else "torch.export traced this model, and it traces a micro-batch of 1 with another graph; "
                f"use {said('batch_size', 2)} or more"
            )
        raise PlanError(
            "this profile measured micro-batches of 1 only, and torch.export traces larger ones with another graph; "
            f"profile with {said('micro_batch_sizes', '2,4')} to plan micro-batches of {B // req.micro_batches}"
        )
    if req.micro_batches is None and not any(_traceable(profile, B // m) for m in divisors(B)):
        raise PlanError(
            "torch.export traced this model, and it traces a micro-batch of 1 with another graph than this "
            f"profile's; use {said('batch_size', 2)} or more"
        )


def _check_memory(profile: Profile, req: PlanRequest, words: Words) -> None:
    """A pinned memory choice the recomputation mode, the target, the device and the profile allow."""
    w, said = words.name, words.said
    if req.recompute_layers is not None and req.recompute_layers < 0:
        raise PlanError(f"{w('recompute_layers')} must be 0 or more (got {req.recompute_layers})")
    pin = req.memory_pin
    if pin is None or pin.none:
        return
    recomputes = bool(pin.recompute or pin.layers)
    field = "recompute_modules" if pin.recompute else "recompute_layers" if pin.layers else "offload_modules"
    value = pin.layers if pin.layers else ",".join(pin.recompute or pin.offload)
    if recomputes and req.recompute != "auto":
        mode = "recompute=always" if req.recompute == "always" else "recompute=never"
        raise PlanError(
            f"{said(field, value)} and {w(mode)} contradict each other: a plan recomputes whole stages, "
            "some layers or some modules, one of them; give one"
        )
    target = target_spec(req.target)
    runs = (
        target.recomputes(pin.recompute)
        if pin.recompute
        else target.block_layers
        if pin.layers
        else target.offloads(pin.offload)
    )
    if not runs:
        raise PlanError(
            f"{said('target', req.target)} {said(field, value)}: {target.label} does not run it as priced "
            f"({target.searched()}); drop {w(field)} or plan for {said('target', 'autopipe')}"
        )
    layers = [b for b in profile.blocks if b.layer]
    if not layers:
        raise PlanError(
            f"{said(field, value)}: the profile has no transformer layer whose parts it knows (an attention core, "
            "graph/units.py); profile it again with this autopipe, or drop it"
        )
    if pin.offload and not req.host_bandwidth > 0:
        raise PlanError(
            f"{said(field, value)}: offloading needs the device's host link bandwidth (host_bandwidth in the "
            "device catalogue); plan for a catalogue GPU (--device h100) or drop it"
        )
    kinds = pin.recompute or pin.offload
    lacking = [b.name for b in layers if not _has(b.memory, pin.recompute, pin.offload)] if kinds else []
    if lacking:
        raise PlanError(
            f"{said(field, value)}: layer {lacking[0]} has no such module kind (its parts: graph/units.py); "
            "pick others or drop it"
        )


def _has(options: Sequence[MemoryOption], recompute: tuple[str, ...], offload: tuple[str, ...]) -> bool:
    if recompute:
        return any(o.recompute == recompute for o in options)
    return set(offload) <= {o.offload[0] for o in options if o.offload}


def _check_target(req: PlanRequest, words: Words) -> None:
    """:func:`check_target`, and a pinned micro-batch count torch's schedule classes take (torch, torchtitan)."""
    check_target(req.choices, words)
    if req.target in ("torch", "torchtitan") and req.schedule in schedule_names() and req.micro_batches is not None:
        spec = schedule_spec(req.schedule)
        vs = [req.virtual] if req.virtual else list(spec.virtual_choices)
        instead = f"plan for {words.said('target', 'autopipe')} (autopipe's engine runs every micro-batch count)"
        refusals = [
            torch_refusal(req.schedule, req.devices, req.micro_batches, req.devices * v, instead, words.said)
            for v in vs
        ]
        if all(refusals):
            raise PlanError(f"{words.said('target', req.target)}: {refusals[0]}")


def check_target(choices: Choices, words: Words = API_WORDS) -> None:
    """A known target, and a pinned schedule it runs (PlanError, one line naming the fields as ``words`` says)."""
    if choices.target not in TARGETS:
        raise PlanError(f"unknown target {choices.target!r}; use one of {', '.join(TARGETS)}")
    target = target_spec(choices.target)
    if (
        choices.schedule is not None
        and choices.schedule in schedule_names()
        and choices.schedule not in target.schedules
    ):
        runs = ", ".join(target.schedules[:-1]) + " and " + target.schedules[-1]
        raise PlanError(
            f"{words.said('target', choices.target)} {words.said('schedule', choices.schedule)}: {target.label} runs "
            f"{runs}; drop {words.name('schedule')} or pick one of them"
        )
    if choices.schedule is not None and choices.recompute == "always" and choices.schedule not in target.recomputing():
        why = (
            "recomputes nothing" if target.never_recomputes else f"runs {choices.schedule} only with nothing recomputed"
        )
        raise PlanError(
            f"{words.said('target', choices.target)} {words.said('schedule', choices.schedule)}: {target.label} "
            f"{why}, and every stage was asked to recompute; drop one of the two"
        )


def _check_schedule(profile: Profile, req: PlanRequest, words: Words) -> tuple[ScheduleSpec | None, int]:
    """A pinned schedule and virtual stages agree with each other, the devices and the micro-batches;
    returns its spec and its least micro-batch count."""
    n, S = profile.num_blocks, req.devices
    w, said = words.name, words.said
    if req.schedule is not None and req.schedule not in schedule_names():
        raise PlanError(f"unknown schedule {req.schedule!r}; use one of {', '.join(schedule_names())}")
    spec = schedule_spec(req.schedule) if req.schedule is not None else None
    if req.virtual is not None:
        if req.virtual < 1:
            raise PlanError(f"{w('virtual')} must be at least 1 (got {req.virtual})")
        if spec is not None and not spec.takes_virtual:
            chunked = ", ".join(s.name for s in search_order() if s.takes_virtual)
            raise PlanError(
                f"{w('virtual')} applies to the {chunked} schedules only (got {said('schedule', req.schedule)})"
            )
        if spec is not None and len(spec.virtual_choices) == 1 and req.virtual not in spec.virtual_choices:
            v = spec.virtual_choices[0]
            raise PlanError(
                f"{spec.name} runs {v} stages per device (got {said('virtual', req.virtual)}); "
                f"use {said('virtual', v)} or leave it out"
            )
        if S * req.virtual > n:
            raise PlanError(
                f"{S} devices x {req.virtual} virtual stages needs {S * req.virtual} blocks, the model has {n}"
            )
    if (
        spec is not None
        and spec.micro_batches_multiple_of_devices
        and req.micro_batches is not None
        and req.micro_batches % S
    ):
        raise PlanError(
            f"{spec.name} needs the micro-batch count to be a multiple of {S} stages (got {req.micro_batches})"
        )
    least = spec.least_micro_batches(S) if spec is not None else 1
    if req.micro_batches is not None and req.micro_batches < least:
        raise PlanError(
            f"{req.schedule} needs at least {least} micro-batches on {S} devices "
            f"(got {said('micro_batches', req.micro_batches)}); use {said('micro_batches', least)} or more"
        )
    return spec, least


def _some_divisors(n: int, shown: int = 12) -> str:
    """``"1, 2, 4, 8"``; ``"1, 2, 3, ..., 32768, 65536"`` when there are more than ``shown``."""
    ds = divisors(n)
    if len(ds) <= shown:
        return ", ".join(map(str, ds))
    return ", ".join(map(str, ds[: shown // 2])) + ", ..., " + ", ".join(map(str, ds[-(shown // 2) :]))


def infeasible_error(profile: Profile, req: PlanRequest, need: float) -> InfeasibleError:
    fixes = (
        "more stages or smaller micro-batches"
        if req.recompute != "never"
        else "more stages, recomputation, or smaller micro-batches"
    )
    need_text = (
        f"; the smallest limit that fits is {format_bytes(need, round_up=True)} per device"
        if math.isfinite(need)
        else ""
    )
    return InfeasibleError(
        f"no plan of {profile.num_blocks} blocks on {req.devices} devices fits "
        f"{format_bytes(req.memory_limit)} per device"
        f"{need_text} (or use {fixes})",
        min_memory_bytes=need if math.isfinite(need) else None,
    )
