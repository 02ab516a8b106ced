"""What a plan request leaves unsaid, decided once for ``autopipe.plan`` and ``autopipe plan``.

The API and the CLI each parse their own inputs (keywords; flags) into typed values and call
:func:`plan_request` (or :func:`parallel_request` for ``--gpus``), so every default is chosen
here and the two cannot drift:

- devices: the visible GPUs when there are two or more, else 4 (:func:`default_devices`);
- memory limit: the analytic device's memory, else the memory of the profile's device (the
  first GPU's, or this host's RAM; :func:`device_memory`);
- link: the analytic device's NVLink bandwidth and latency, else by the profile's device
  (:func:`default_link`);
- the executor's cost per action and, on top, per action that sends to another rank: the
  profile's measured (``Profile.executor``, :mod:`autopipe.costs.executor`), else by the
  profile's device (:func:`default_action_overhead`, :func:`default_send_overhead`);
- a measured CPU profile's ranks sharing this host: the compute of S ranks priced at the
  profile's measured contention factor for S (:func:`host_shared`);
- bytes kept per parameter byte: 16 bytes per parameter for an analytic profile (mixed
  precision + Adam, :mod:`autopipe.costs.analytic`), else ``PlanRequest.state_factor``
  (:func:`state_factor_of`);
- the analytic dtype (:func:`default_dtype`) and the micro-batch sizes profiled for a plan
  (:func:`plan_micro_batch_sizes`).

Torch is imported only inside the functions that ask it about devices.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from autopipe.costs.profile import Profile
from autopipe.planner.request import DEFAULT_LINK, NO_CHOICES, Choices, Link, PlanRequest
from autopipe.plans import Plan

if TYPE_CHECKING:
    from autopipe.costs.devices import DeviceSpec
    from autopipe.modes import Sharding
    from autopipe.planner.parallel import ParallelRequest
    from autopipe.plans import Overlap

__all__ = [
    "DEFAULT_DEVICES_WITHOUT_GPUS",
    "default_action_overhead",
    "default_devices",
    "default_dtype",
    "default_link",
    "default_micro_batch_sizes",
    "default_send_overhead",
    "device_memory",
    "element_size",
    "host_bandwidth_of",
    "host_shared",
    "parallel_request",
    "plan_micro_batch_sizes",
    "plan_request",
    "state_factor_of",
    "with_host_sharing",
]

DEFAULT_DEVICES_WITHOUT_GPUS = 4
PLAN_PROFILE_MAX_SIZE = 8  # profiling for a plan measures micro-batches of at most this many samples
ANALYTIC_MICRO_BATCH_SIZES = (2, 4)  # counted when planning analytically without --micro-batch-sizes


def plan_request(
    profile: Profile,
    *,
    devices: int | None,
    batch_size: int,
    memory_limit: float | None,
    choices: Choices = NO_CHOICES,
    link: Link = DEFAULT_LINK,
    device: DeviceSpec | None = None,
) -> PlanRequest:
    """The request for one pipeline; ``None`` takes the default (module docstring).

    ``device`` is the catalogue device an analytic plan is for (its memory and links).
    """
    bandwidth, latency = _link(profile, device)
    return PlanRequest(
        devices=default_devices() if devices is None else devices,
        batch_size=batch_size,
        memory_limit=_memory_limit(profile, device) if memory_limit is None else memory_limit,
        micro_batches=choices.micro_batches,
        schedule=choices.schedule,
        virtual=choices.virtual,
        recompute=choices.recompute,
        target=choices.target,
        link_bandwidth=bandwidth if link.bandwidth is None else link.bandwidth,
        link_latency_s=latency if link.latency_s is None else link.latency_s,
        action_overhead_s=_action_overhead(profile, link),
        send_overhead_s=_send_overhead(profile, link),
        state_factor=state_factor_of(profile),
        recompute_modules=choices.recompute_modules,
        recompute_layers=choices.recompute_layers,
        offload_modules=choices.offload_modules,
        host_bandwidth=host_bandwidth_of(profile, device),
    )


def parallel_request(
    profile: Profile,
    *,
    gpus: int,
    batch_size: int,
    memory_limit: float | None,
    stages: int | None = None,
    choices: Choices = NO_CHOICES,
    link: Link = DEFAULT_LINK,
    device: DeviceSpec | None = None,
    device_files: Sequence[str | Path] = (),
    shard_optimizer: bool = False,
    sharding: Sharding | None = None,
    shard_group: int | None = None,
    overlap: Overlap | None = None,
) -> ParallelRequest:
    """The request for ``gpus`` devices split into S stages x D replicas (``--gpus``).

    Without an analytic ``device``, the cluster is the catalogue device the profile was
    measured on, else ``gpus`` devices on one node joined by :func:`default_link`.
    ``link.bandwidth`` replaces both the NVLink and the network bandwidth. ``stages`` pins the
    pipeline depth (of each replica).
    """
    from autopipe.costs.analytic import BYTES_PER_PARAM
    from autopipe.costs.devices import device_spec, match_device
    from autopipe.planner.parallel import Cluster, ParallelRequest

    memory = _memory_limit(profile, device) if memory_limit is None else memory_limit
    spec = device
    if spec is None:
        name = match_device(profile.device, device_files)
        spec = device_spec(name, device_files) if name is not None else None
    if spec is not None:
        cluster = Cluster.of(spec, gpus)
    else:
        bw, lat = default_link(profile.device)
        cluster = Cluster(gpus, gpus, bw, bw, lat)
    if link.bandwidth is not None or link.latency_s is not None:
        cluster = Cluster(
            gpus,
            cluster.devices_per_node,
            cluster.nvlink_bandwidth if link.bandwidth is None else link.bandwidth,
            cluster.network_bandwidth if link.bandwidth is None else link.bandwidth,
            cluster.link_latency_s if link.latency_s is None else link.latency_s,
        )
    per_param = BYTES_PER_PARAM if profile.method == "analytic" else PlanRequest.state_factor * element_size(profile)
    return ParallelRequest(
        cluster,
        batch_size,
        memory,
        bytes_per_param=per_param,
        shard_optimizer=shard_optimizer,
        stages=stages,
        choices=choices,
        action_overhead_s=_action_overhead(profile, link),
        send_overhead_s=_send_overhead(profile, link),
        sharding=sharding,
        shard_group=shard_group,
        overlap=overlap,
        host_bandwidth=spec.host_bandwidth if spec is not None else 0.0,
    )


def host_bandwidth_of(profile: Profile, device: DeviceSpec | None, device_files: Sequence[str | Path] = ()) -> float:
    """Bytes/s from a device to its host (what activation offload moves over): the analytic
    device's, else the catalogue's for the GPU the profile was measured on; 0 when unknown
    (a CPU: nothing to offload to), and then nothing is offloaded."""
    if device is not None:
        return device.host_bandwidth
    from autopipe.costs.devices import device_spec, known_devices, match_device

    if "(analytic" in profile.device:  # "h100: NVIDIA H100 SXM5 80GB (analytic, bf16)": the catalogue's name first
        name: str | None = profile.device.split(":")[0]
        name = name if name in known_devices(device_files) else None
    else:
        name = match_device(profile.device, device_files) if profile.device.startswith("cuda") else None
    return device_spec(name, device_files).host_bandwidth if name is not None else 0.0


def host_shared(profile: Profile, request: PlanRequest) -> tuple[Profile, PlanRequest, float, float]:
    """``profile`` and ``request`` priced for ``request.devices`` ranks sharing this host, the
    factor and its relative spread: a measured CPU profile with a contention measurement
    (``Profile.contention``, :mod:`autopipe.costs.measure.contention`) has its block times and the
    executor's costs per action and per send multiplied by ``Contention.factor(devices)``; any other profile
    is returned as it is, with factor 1 and spread 0. The factor is the same for every
    candidate of the request, so it moves no choice; its spread belongs in the plan's
    uncertainty (:func:`with_host_sharing`), not among the blocks' (which rank candidates)."""
    if profile.method != "measured" or not profile.device.startswith("cpu") or not profile.contention:
        return profile, request, 1.0, 0.0
    factor, spread = profile.contention.factor(request.devices)
    if factor == 1.0:
        return profile, request, 1.0, spread
    factor = round(factor, 4)
    return (
        profile.slowed(factor),
        replace(
            request,
            action_overhead_s=request.action_overhead_s * factor,
            send_overhead_s=request.send_overhead_s * factor,
        ),
        factor,
        spread,
    )


def with_host_sharing(plan: Plan, factor: float, spread: float) -> Plan:
    """``plan`` recording the host-sharing ``factor`` its times include and its uncertainty
    widened by the factor's ``spread``: (1 + u)(1 + spread) - 1."""
    if factor == 1.0 and spread == 0.0:
        return plan
    u = plan.uncertainty
    return replace(plan, host_sharing=factor, uncertainty=u + spread + u * spread)


def default_devices() -> int:
    """The visible GPUs when there are two or more, else :data:`DEFAULT_DEVICES_WITHOUT_GPUS`."""
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return n if n >= 2 else DEFAULT_DEVICES_WITHOUT_GPUS


def device_memory(device: str) -> float:
    """Bytes of memory of a profile's device: the first GPU's for ``cuda...``, else this host's RAM."""
    if device.startswith("cuda"):
        import torch

        return float(torch.cuda.get_device_properties(0).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def default_action_overhead(device: str) -> float:
    """Seconds the executor spends on an action besides its computation and its sends (Python,
    starting an autograd call), by the profile's device, where the profile did not measure it.

    CPU ranks: 0.15 ms, as ``bench/bench_overhead.py`` measured on a quiet development machine
    for the actions that post no send to another rank (0.03-0.29 ms beyond their compute; 1F1B's
    stage 0 B +0.09 ms). GPUs: 0 until measured there (host work mostly overlaps the kernels);
    pass ``--action-overhead``.
    """
    return 1.5e-4 if device.startswith("cpu") else 0.0


def default_send_overhead(device: str) -> float:
    """Seconds an action that posts a send to another rank costs on top of
    :func:`default_action_overhead` (copying the tensor out, handing it to the transport, the
    transport's threads taking the core), by the profile's device, where the profile did not
    measure it.

    CPU ranks over gloo: 0.45 ms, as ``bench/bench_overhead.py`` measured on a quiet development
    machine (actions that send 0.44-0.90 ms beyond their compute, against 0.03-0.29 ms for those
    that do not: 1F1B's stage 0 F +0.63 ms, its B +0.09 ms). GPUs: 0 until measured there (NCCL
    posts from the host while the kernels run); pass ``--send-overhead``.
    """
    return 4.5e-4 if device.startswith("cpu") else 0.0


def default_link(device: str) -> tuple[float, float]:
    """(bandwidth bytes/s, latency s) between neighbouring devices, by the profile's device.

    GPUs: 50 GB/s and 10 us (between PCIe 5.0 x16 and NVLink: a conservative default);
    CPU processes talking over gloo on one host: 4 GB/s and 120 us, as ``bench/bench_link.py``
    measured on the development machine (3.2-4.1 GB/s, 110-190 us; run it for yours and pass
    ``--bandwidth`` / ``--latency``).
    """
    if device.startswith("cuda"):
        return 50e9, 10e-6
    return 4e9, 120e-6


def state_factor_of(profile: Profile) -> float:
    """Device bytes kept per parameter byte (weights, gradients, optimizer state)."""
    if profile.method == "analytic":
        from autopipe.costs.analytic import state_factor

        return state_factor(profile)
    return PlanRequest.state_factor


def element_size(profile: Profile) -> float:
    """Bytes of one stored parameter (4 when the profile has no parameters)."""
    params = sum(b.params for b in profile.blocks)
    return sum(b.param_bytes for b in profile.blocks) / params if params else 4.0


def default_dtype(device: DeviceSpec) -> str:
    """The training precision an analytic plan assumes: fp32 on a CPU, bf16 on an accelerator."""
    return "fp32" if device.name == "cpu" else "bf16"


def default_micro_batch_sizes(batch_size: int) -> tuple[int, ...]:
    """Two or three sizes up to ``batch_size`` for the affine cost fit: B/4, B/2, B.

    ``8 -> (2, 4, 8)``, ``6 -> (1, 3, 6)``, ``2 -> (1, 2)``, ``1 -> (1,)``.
    """
    return tuple(sorted({s for s in (batch_size // 4, batch_size // 2, batch_size) if s >= 1}))


def plan_micro_batch_sizes(batch_size: int, available: int | None = None) -> tuple[int, ...]:
    """The micro-batch sizes measured when planning a model not profiled yet: those of
    :func:`default_micro_batch_sizes` for the batch, at most :data:`PLAN_PROFILE_MAX_SIZE`
    samples and at most the ``available`` samples of a given example batch."""
    return default_micro_batch_sizes(min(batch_size, available or batch_size, PLAN_PROFILE_MAX_SIZE))


def _memory_limit(profile: Profile, device: DeviceSpec | None) -> float:
    return device.memory_bytes if device is not None else device_memory(profile.device)


def _action_overhead(profile: Profile, link: Link) -> float:
    if link.action_overhead_s is not None:
        return link.action_overhead_s
    return profile.executor.action_s if profile.executor else default_action_overhead(profile.device)


def _send_overhead(profile: Profile, link: Link) -> float:
    if link.send_overhead_s is not None:
        return link.send_overhead_s
    return profile.executor.send_s if profile.executor else default_send_overhead(profile.device)


def _link(profile: Profile, device: DeviceSpec | None) -> tuple[float, float]:
    return default_link(profile.device) if device is None else (device.nvlink_bandwidth, device.link_latency_s)
