"""Accelerator specs: what the analytic cost model prices a block's FLOPs and bytes with.

The catalogue is a data file, ``autopipe/costs/devices.json`` (A100 40/80 GB, H100 SXM, H800, H200;
figures from NVIDIA's datasheets, dense, no sparsity), which users extend with entries of the
same shape in their own file: ``--device-file my.json`` or ``AUTOPIPE_DEVICES=my.json``
(several files joined by ``os.pathsep``); a user entry with a catalogue name replaces it.
``cpu`` is not in the file: it is measured on the spot (a matmul benchmark per dtype and a
memcpy), so it describes this machine.

Every figure is per device and one direction: peak dense FLOP/s per compute dtype, memory size
and bandwidth, the link to devices in the same node (NVLink) and to other nodes (the device's
share of the network, e.g. one 400 Gb/s InfiniBand NIC per GPU: 50 GB/s). The efficiencies
and the per-op overhead say how close real kernels get to the peaks (the roofline of
Williams et al. 2009, per op); ``autopipe calibrate`` fits them on the present device.

A matmul's compute efficiency depends on its size: a GEMM with a small dimension fills few
tiles and waves of the GPU (NVIDIA's *Matrix Multiplication Background User's Guide*: tile
and wave quantization) and reaches less of the peak. Per compute dtype, an entry's
``compute_curve`` gives ``{"eff_max": E, "s_half": S}``, and a GEMM of size
``s = (M K N) ** (1/3)`` (the side of the square GEMM with its FLOPs; ``OpCount.size``) runs at::

    efficiency(dtype, s) = E * s / (s + S)

a saturating curve: ``E`` for large GEMMs, half of it at ``s = S``. Other ops that count FLOPs
(fused attention, convolutions: no GEMM shape) and every op of a dtype without a curve run at
the flat ``compute_efficiency``, so an old entry with only ``compute_efficiency`` means a flat
curve, as before.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autopipe._io import read_json, shown
from autopipe.errors import InputError

__all__ = [
    "CATALOGUE_FILE",
    "DTYPES",
    "DeviceError",
    "DeviceSpec",
    "device_files_from_env",
    "device_spec",
    "known_devices",
    "load_catalogue",
    "match_device",
    "measure_cpu",
    "read_cluster_file",
    "read_device_file",
]

CATALOGUE_FILE = Path(__file__).with_name("devices.json")
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")  # compute dtypes a spec gives peaks for
ENV_VAR = "AUTOPIPE_DEVICES"
CLUSTER_KEYS = {  # --cluster FILE's keys -> (solve.parallel.Cluster field, what it is)
    "devices_per_node": ("devices_per_node", "devices joined by NVLink in one node"),
    "nvlink_bandwidth": ("nvlink_bandwidth", "bytes/s per device within a node, one direction"),
    "network_bandwidth": ("network_bandwidth", "bytes/s per device across nodes, one direction"),
    "nvlink_latency_s": ("link_latency_s", "seconds per message within a node"),
    "network_latency_s": ("network_latency_s", "seconds per message across nodes"),
}


class DeviceError(InputError):
    """An unknown device name, or a device file that cannot be read."""


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator (all rates per device, one direction)."""

    name: str  # catalogue key, e.g. "h100"
    description: str
    peak_flops: tuple[tuple[str, float], ...]  # (compute dtype, dense FLOP/s), sorted by dtype
    memory_bytes: float
    memory_bandwidth: float  # bytes/s, device memory
    nvlink_bandwidth: float  # bytes/s to a device in the same node
    network_bandwidth: float  # bytes/s to a device in another node
    devices_per_node: int
    link_latency_s: float = 10e-6
    compute_efficiency: float = 0.6  # fraction of peak FLOP/s an op reaches (flat: dtypes without a curve)
    memory_efficiency: float = 0.7  # fraction of memory bandwidth a memory-bound op reaches
    op_overhead_s: float = 5e-6  # fixed cost per op (kernel launch, dispatch)
    match: tuple[str, ...] = ()  # substrings of torch's device name that mean this device
    aliases: tuple[str, ...] = ()
    compute_curve: tuple[tuple[str, float, float], ...] = ()  # (dtype, eff_max, s_half), sorted by dtype
    host_bandwidth: float = 0.0  # bytes/s to the host's memory, one direction (activation offload; 0: unknown)

    def efficiency(self, dtype: str, size: float = 0.0) -> float:
        """Fraction of ``dtype``'s peak an op reaches: a GEMM of ``size`` (``OpCount.size``) on the
        dtype's curve (module docstring); ``size`` 0 (not a GEMM) or no curve: the flat efficiency."""
        for name, eff_max, s_half in self.compute_curve:
            if name == dtype and size > 0:
                return eff_max * size / (size + s_half) if s_half > 0 else eff_max
        return self.compute_efficiency

    def plateau(self, dtype: str) -> float:
        """``dtype``'s ``eff_max`` (what its largest GEMMs reach); the flat efficiency without a curve."""
        return next((e for d, e, _ in self.compute_curve if d == dtype), self.compute_efficiency)

    def compute_scaled(self, factor: float) -> DeviceSpec:
        """Every compute efficiency (flat and each curve's ``eff_max``) times ``factor``, at most 1;
        the curves keep their shape (``s_half``)."""
        curve = tuple((d, min(1.0, e * factor), h) for d, e, h in self.compute_curve)
        return replace(self, compute_efficiency=min(1.0, self.compute_efficiency * factor), compute_curve=curve)

    def peak(self, dtype: str) -> float:
        """Peak dense FLOP/s for compute dtype ``dtype`` (fp32, tf32, bf16, fp16, fp8)."""
        table = dict(self.peak_flops)
        if dtype in table:
            return table[dtype]
        if dtype == "tf32" and "fp32" in table:
            return table["fp32"]
        if dtype == "fp16" and "bf16" in table:
            return table["bf16"]
        hint = " (fp8 needs an FP8 GPU: h100, h800, h200)" if dtype == "fp8" else ""
        raise DeviceError(
            f"device {self.name} gives no peak for {dtype}{hint}; add peak_flops.{dtype} to its entry "
            f"(it has: {', '.join(table)})"
        )

    def calibrated(
        self, compute_efficiency: float, memory_efficiency: float, op_overhead_s: float, dtype: str = ""
    ) -> DeviceSpec:
        """The spec with fitted efficiencies: ``compute_efficiency`` is ``dtype``'s ``eff_max``
        (its flat efficiency where it has no curve), and every other compute efficiency scales by
        the same ratio, as one device-wide factor (curves keep their ``s_half``)."""
        return replace(
            self.compute_scaled(compute_efficiency / self.plateau(dtype)),
            memory_efficiency=memory_efficiency,
            op_overhead_s=op_overhead_s,
        )

    def with_curve(self, dtype: str, eff_max: float, s_half: float) -> DeviceSpec:
        """The spec with ``dtype``'s curve set to (``eff_max``, ``s_half``)."""
        rest = [c for c in self.compute_curve if c[0] != dtype]
        return replace(self, compute_curve=tuple(sorted((*rest, (dtype, eff_max, s_half)))))


def _spec(name: str, raw: Mapping[str, Any], source: str) -> DeviceSpec:
    if not isinstance(raw, Mapping):
        raise DeviceError(f"device {name!r} in {source} must be an object (see {CATALOGUE_FILE})")
    curve = _curve(name, raw.get("compute_curve", {}), source)
    try:
        peaks = raw["peak_flops"]
        spec = DeviceSpec(
            name=name,
            description=str(raw.get("description", name)),
            peak_flops=tuple(sorted((str(k), float(v)) for k, v in peaks.items())),
            memory_bytes=float(raw["memory_bytes"]),
            memory_bandwidth=float(raw["memory_bandwidth"]),
            nvlink_bandwidth=float(raw["nvlink_bandwidth"]),
            network_bandwidth=float(raw["network_bandwidth"]),
            devices_per_node=int(raw.get("devices_per_node", 8)),
            link_latency_s=float(raw.get("link_latency_s", 10e-6)),
            compute_efficiency=float(raw.get("compute_efficiency", 0.6)),
            memory_efficiency=float(raw.get("memory_efficiency", 0.7)),
            op_overhead_s=float(raw.get("op_overhead_s", 5e-6)),
            match=tuple(str(m) for m in raw.get("match", ())),
            aliases=tuple(str(a).lower() for a in raw.get("aliases", ())),
            compute_curve=curve,
            host_bandwidth=float(raw.get("host_bandwidth", 0.0)),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise DeviceError(
            f"device {name!r} in {source} is incomplete ({type(e).__name__}: {e}); "
            "give peak_flops, memory_bytes, memory_bandwidth, nvlink_bandwidth, network_bandwidth "
            f"(see {CATALOGUE_FILE})"
        ) from None
    rates = (spec.memory_bytes, spec.memory_bandwidth, spec.nvlink_bandwidth, spec.network_bandwidth)
    effs = (spec.compute_efficiency, spec.memory_efficiency)
    if (
        min(rates) <= 0
        or any(v <= 0 for _, v in spec.peak_flops)
        or spec.devices_per_node < 1
        or not all(0 < e <= 1 for e in effs)
        or not 0 <= spec.host_bandwidth < float("inf")
    ):
        raise DeviceError(f"device {name!r} in {source}: sizes and rates must be positive and efficiencies in (0, 1]")
    return spec


def _curve(name: str, raw: Any, source: str) -> tuple[tuple[str, float, float], ...]:
    """An entry's ``compute_curve``: ``{dtype: {"eff_max": E, "s_half": S}}`` (module docstring)."""
    where = f"device {name!r} in {source}: compute_curve"
    if not isinstance(raw, dict):
        raise DeviceError(f'{where} must be an object like {{"bf16": {{"eff_max": 0.75, "s_half": 128}}}}')
    out = []
    for dtype, point in raw.items():
        if dtype.startswith("_"):
            continue
        if dtype not in DTYPES:
            raise DeviceError(f"{where} names dtype {dtype!r}; use one of: {', '.join(DTYPES)}")
        if not isinstance(point, dict) or set(point) - {"eff_max", "s_half", "source"} or "eff_max" not in point:
            raise DeviceError(f'{where}.{dtype} must be {{"eff_max": E, "s_half": S}} (got {point!r})')
        e, h = point["eff_max"], point.get("s_half", 0.0)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (e, h))
        if not numbers or not 0 < e <= 1 or not 0 <= h < 1e12:
            raise DeviceError(f"{where}.{dtype}: eff_max must be in (0, 1] and s_half >= 0 (got {e!r}, {h!r})")
        out.append((str(dtype), float(e), float(h)))
    return tuple(sorted(out))


def read_device_file(path: Path, what: str = "device file", again: str = "") -> dict[str, DeviceSpec]:
    """The named devices in a device file (``what``, ``again``: a calibration file is one too)."""
    again = again or f"write one like {CATALOGUE_FILE}"
    missing = f"{what} not found: {shown(path)}; {again}"
    raw = read_json(path, f"a {what}", DeviceError, again, missing=missing)
    if not isinstance(raw, dict):
        raise DeviceError(f"{what} {path} must hold an object of named devices, like {CATALOGUE_FILE}")
    return {k.lower(): _spec(k.lower(), v, str(path)) for k, v in raw.items() if not k.startswith("_")}


def device_files_from_env() -> tuple[Path, ...]:
    """The user's device files named by ``AUTOPIPE_DEVICES`` (``os.pathsep``-separated)."""
    text = os.environ.get(ENV_VAR, "")
    return tuple(Path(p) for p in text.split(os.pathsep) if p.strip())


def load_catalogue(device_files: Sequence[str | Path] = ()) -> dict[str, DeviceSpec]:
    """The built-in catalogue, then ``AUTOPIPE_DEVICES``' files, then ``device_files``."""
    out = read_device_file(CATALOGUE_FILE)
    for path in (*device_files_from_env(), *map(Path, device_files)):
        out.update(read_device_file(path))
    return out


def known_devices(device_files: Sequence[str | Path] = ()) -> tuple[str, ...]:
    return ("cpu", *sorted(load_catalogue(device_files)))


def device_spec(name: str, device_files: Sequence[str | Path] = ()) -> DeviceSpec:
    """The spec called ``name`` (or one of its aliases; any case); ``cpu`` is measured now."""
    key = name.strip().lower()
    catalogue = load_catalogue(device_files)
    if key in catalogue:
        return catalogue[key]
    for spec in catalogue.values():
        if key in spec.aliases:
            return spec
    if key == "cpu":
        return measure_cpu()
    raise DeviceError(
        f"unknown device {name!r}; known devices: {', '.join(known_devices(device_files))} "
        "(add yours with --device-file)"
    )


def match_device(torch_name: str, device_files: Sequence[str | Path] = ()) -> str | None:
    """Catalogue name for a profile's device string (``"cuda: NVIDIA H200"`` -> ``"h200"``)."""
    if torch_name.startswith("cpu"):
        return "cpu"
    for spec in load_catalogue(device_files).values():
        if any(m.lower() in torch_name.lower() for m in spec.match):
            return spec.name
    return None


@functools.lru_cache(maxsize=1)
def measure_cpu() -> DeviceSpec:
    """This CPU, measured now (about a second): matmul FLOP/s per dtype and memcpy bandwidth.

    Peaks are what a 512 x 512 matmul reaches with torch's current thread count, so the
    efficiencies start at 1; ``autopipe calibrate`` fits them to a measured profile.
    """
    import torch

    def flops(dtype: torch.dtype) -> float:
        n = 512
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        best = _best_time(lambda: torch.mm(a, b), 5)
        return 2.0 * n**3 / best

    src = torch.empty(64 * 2**20, dtype=torch.uint8)  # past the caches
    dst = torch.empty_like(src)
    copy_s = _best_time(lambda: dst.copy_(src), 5)
    fp32, bf16 = flops(torch.float32), flops(torch.bfloat16)
    memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return DeviceSpec(
        name="cpu",
        description=f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads (measured)",
        peak_flops=(("bf16", bf16), ("fp16", bf16), ("fp32", fp32), ("tf32", fp32)),  # sorted, as read from files
        memory_bytes=memory,
        memory_bandwidth=2.0 * src.numel() / copy_s,  # read + write
        nvlink_bandwidth=4e9,  # processes on one host (gloo), as solve.defaults.default_link
        network_bandwidth=1.25e9,  # 10 Gb/s Ethernet
        devices_per_node=max(1, os.cpu_count() or 1),
        link_latency_s=120e-6,
        compute_efficiency=1.0,
        memory_efficiency=1.0,
        op_overhead_s=10e-6,
    )


def _best_time(fn: Any, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def read_cluster_file(path: str | Path) -> dict[str, float]:
    """A cluster description (``--cluster FILE``): a JSON object with any of
    ``devices_per_node``, ``nvlink_bandwidth``, ``network_bandwidth`` (bytes/s, or text like
    ``"450GB/s"``), ``nvlink_latency_s``, ``network_latency_s``; what it leaves out stays the
    catalogue device's. Returns ``solve.parallel.Cluster`` field -> value."""
    from autopipe.errors import PlanError
    from autopipe.units import parse_rate

    p = Path(path)
    again = f"write a JSON object with {', '.join(CLUSTER_KEYS)}"
    raw = read_json(p, "a cluster file", DeviceError, again, missing=f"cluster file not found: {shown(p)}; {again}")
    if not isinstance(raw, dict):
        raise DeviceError(f"cluster file {p} must hold one JSON object with {', '.join(CLUSTER_KEYS)}")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if key.startswith("_"):
            continue
        if key not in CLUSTER_KEYS:
            raise DeviceError(f"cluster file {p}: {key!r} is not a cluster field; use {', '.join(CLUSTER_KEYS)}")
        field, what = CLUSTER_KEYS[key]
        try:
            number = parse_rate(value, key) if isinstance(value, str) and key.endswith("bandwidth") else value
        except PlanError as e:
            raise DeviceError(f"cluster file {p}: {e}") from None
        ok = isinstance(number, (int, float)) and not isinstance(number, bool) and 0 < number < 1e300
        if key == "devices_per_node":
            ok = ok and isinstance(number, int)
        elif key.endswith("latency_s"):
            ok = isinstance(number, (int, float)) and not isinstance(number, bool) and 0 <= number < 1e300
        if not ok:
            raise DeviceError(f"cluster file {p}: {key} is {value!r}, expected a positive number ({what})")
        out[field] = number
    return out
