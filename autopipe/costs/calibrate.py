"""Fit the roofline's efficiencies to a measured profile: ``autopipe calibrate PROFILE``.

The analytic model prices every op as ``max(flops / (peak * ce), bytes / (bw * me)) + o``
(``costs.analytic.op_time``). Given a Profile measured on the present device, the model it came
from is counted again on the meta device (same tracer, same blocks: the fingerprints must
match), and the compute efficiency ``ce``, memory efficiency ``me`` and per-op overhead ``o``
are chosen to minimise the squared log error of every block's forward and backward time at
every measured micro-batch size (a grid over ``ce`` and ``me``, the best ``o`` for each):
relative errors, so small blocks count as much as large ones. ``ce`` is the profile dtype's
``eff_max``: a GEMM runs at ``ce * s / (s + s_half)`` (``DeviceSpec.efficiency``), the curve's
shape ``s_half`` kept from the device entry, unless the profile has enough to fit it too (at
least :data:`CURVE_POINTS` block times whose GEMM sizes span a factor of 4 or more: then
``s_half`` is chosen from :data:`S_HALVES` as well). The device's other dtypes scale by the
same ratio, keeping their shapes.

The result is stored as a device file entry (the shape of ``devices.json``, plus how it was
fitted) under the calibration store (``$AUTOPIPE_CALIBRATION_DIR``, else
``~/.cache/autopipe/calibration``) as ``<device>.json``, or where ``-o`` says; the analytic
profile for that device then uses it (:func:`stored_calibration`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from autopipe._io import atomic_write_text, shown
from autopipe.costs.analytic import ModelCounts, count_model
from autopipe.costs.counting import OpCount, op_dtype
from autopipe.costs.devices import DeviceSpec, device_spec, match_device, read_device_file
from autopipe.costs.profile import Profile
from autopipe.errors import ProfileError

__all__ = ["Calibration", "calibrate", "calibration_dir", "fit_efficiency", "save_calibration", "stored_calibration"]

_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_GRID = np.geomspace(0.02, 1.0, 40)
_OVERHEADS = np.concatenate(([0.0], np.geomspace(1e-7, 1e-3, 61)))
CURVE_POINTS = 16  # block times needed to fit the curve's s_half as well as eff_max
S_HALVES = (0.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0)


@dataclass(frozen=True)
class Calibration:
    spec: DeviceSpec  # the device with fitted efficiencies and overhead
    profile: str  # the measured profile's model
    observations: int  # block times fitted
    median_error: float  # median |predicted / measured - 1| after the fit
    max_error: float


def calibration_dir() -> Path:
    env = os.environ.get("AUTOPIPE_CALIBRATION_DIR")
    return Path(env) if env else Path.home() / ".cache" / "autopipe" / "calibration"


def calibrate(
    profile: Profile,
    *,
    model: str | None = None,
    device_files: Sequence[str | Path] = (),
    counts: ModelCounts | None = None,
) -> Calibration:
    """Fit the efficiencies of the device ``profile`` was measured on (see the module docstring).

    The fit counts the model's ops, which imports its model file: ``model`` names that file
    (``path/to/model.py[:factory]``, built with the profile's kwargs), as ``autopipe calibrate
    --model`` does. A profile is data, so the model file it records is never imported on its word."""
    if profile.method != "measured":
        raise ProfileError(
            f"calibrate needs a measured profile (this one is {profile.method}); make one with 'autopipe profile MODEL'"
        )
    name = match_device(profile.device, device_files)
    if name is None:
        raise ProfileError(
            f"profile device {profile.device!r} matches no catalogue entry; add one whose 'match' names it "
            "(--device-file)"
        )
    base = device_spec(name, device_files)
    recipe = profile.recipe
    if counts is None:
        if model is None:
            raise ProfileError(
                "calibrate needs model='path/to/model.py', the model file the profile was made from: counting its "
                f"ops imports it, and a profile is data, so the file it names ({recipe.model_file!r}) is not imported"
            )
        counts = _count(profile, model)
    if counts.traces[0].fingerprint() != recipe.fingerprint:
        raise ProfileError(
            "the profile was made from another model than the one counted (the fingerprints differ); give the "
            "model file it was made from, or profile again"
        )
    ops: list[Sequence[OpCount]] = []
    measured: list[float] = []
    for k, u in enumerate(counts.sizes):
        for i, b in enumerate(profile.blocks):
            c = counts.counts[k][i]
            for seq, t in ((c.forward, b.forward_s(u)), (c.backward, b.backward_s(u))):
                if t > 0 and seq:
                    ops.append(seq)
                    measured.append(t)
    if not measured:
        raise ProfileError("the profile has no block times to calibrate with; profile the model again")
    spec, errors = fit_efficiency(base, counts.precision.compute, ops, measured, counts.precision.linear)
    return Calibration(spec, profile.model, len(measured), float(np.median(errors)), float(np.max(errors)))


def _count(profile: Profile, model: str) -> ModelCounts:
    """The ops of ``model`` (a file the caller named) built as ``profile`` records, counted on meta."""
    from autopipe.model.load import load_model
    from autopipe.model.spec import ModelSpec

    recipe = profile.recipe
    spec = ModelSpec.parse(model, recipe.model_spec().kwargs)
    if spec.factory != recipe.factory:
        raise ProfileError(
            f"the profile was made with factory {recipe.factory!r}, not {spec.factory!r}; name it: "
            f"{shown(spec.path)}:{recipe.factory}"
            if recipe.factory.isidentifier()
            else f"the profile names factory {recipe.factory!r}, not a Python name; profile the model again"
        )
    loaded = load_model(f"{spec.path}:{spec.factory}", spec.kwargs, device="meta")
    return count_model(
        loaded, micro_batch_sizes=profile.micro_batch_sizes, dtype=_DTYPES.get(profile.dtype, "fp32"), recipe=recipe
    )


def fit_efficiency(
    base: DeviceSpec, compute: str, ops: Sequence[Sequence[OpCount]], measured: Sequence[float], linear: str = ""
) -> tuple[DeviceSpec, np.ndarray]:
    """``base`` with the (ce, me, o) that minimise the squared log error, and ``s_half`` too
    where the observations can tell it (module docstring); and the relative errors."""
    flat = [op for seq in ops for op in seq]
    sizes = [op.size for op in flat if op.size > 0 and op.flops > 0]
    fit_shape = len(measured) >= CURVE_POINTS and bool(sizes) and max(sizes) >= 4 * min(sizes)
    own = next((h for d, _, h in base.compute_curve if d == compute), None)
    halves = sorted({*S_HALVES, *([own] if own is not None else [])}) if fit_shape else [own]
    flat_m = np.array([op.bytes / base.memory_bandwidth for op in flat])
    owner = np.repeat(np.arange(len(ops)), [len(seq) for seq in ops])
    n_ops = np.array([len(seq) for seq in ops], dtype=float)
    y = np.log(np.asarray(measured))
    best: tuple[float, float, float, float, DeviceSpec] = (math.inf, 1.0, 1.0, 0.0, base)
    for s_half in halves:
        shaped = base if s_half is None else base.with_curve(compute, base.plateau(compute), s_half)
        flat_c = _compute_at_unit(shaped, compute, linear, flat)
        for ce in _GRID:
            for me in _GRID:
                work = np.bincount(owner, np.maximum(flat_c / ce, flat_m / me), minlength=len(ops))
                pred = work[None, :] + _OVERHEADS[:, None] * n_ops[None, :]  # (overheads, observations)
                loss = ((np.log(np.maximum(pred, 1e-12)) - y[None, :]) ** 2).sum(axis=1)
                j = int(np.argmin(loss))
                if loss[j] < best[0]:
                    best = (float(loss[j]), float(ce), float(me), float(_OVERHEADS[j]), shaped)
    _, ce, me, o, shaped = best
    spec = shaped.calibrated(ce, me, o, compute)
    flat_c = _compute_at_unit(shaped, compute, linear, flat)
    fitted = np.bincount(owner, np.maximum(flat_c / ce, flat_m / me), minlength=len(ops)) + o * n_ops
    return spec, np.abs(fitted / np.asarray(measured) - 1.0)


def _compute_at_unit(spec: DeviceSpec, compute: str, linear: str, ops: Sequence[OpCount]) -> np.ndarray:
    """Each op's compute seconds on ``spec`` were ``compute``'s ``eff_max`` 1 (every efficiency
    scaled by the same ratio): divided by a candidate ``ce``, its time at that ``eff_max``."""
    unit = spec.plateau(compute)
    peaks = {d: spec.peak(d) for d in {compute, linear or compute}}
    out = []
    for op in ops:
        d = op_dtype(op, compute, linear)
        out.append(op.flops * op.work / (peaks[d] * spec.efficiency(d, op.size)) * unit if op.flops else 0.0)
    return np.array(out)


def _entry(cal: Calibration) -> dict[str, Any]:
    s = cal.spec
    return {
        s.name: {
            "description": s.description,
            "match": list(s.match),
            "aliases": list(s.aliases),
            "peak_flops": dict(s.peak_flops),
            "memory_bytes": s.memory_bytes,
            "memory_bandwidth": s.memory_bandwidth,
            "nvlink_bandwidth": s.nvlink_bandwidth,
            "network_bandwidth": s.network_bandwidth,
            "devices_per_node": s.devices_per_node,
            "link_latency_s": s.link_latency_s,
            "compute_efficiency": s.compute_efficiency,
            "compute_curve": {d: {"eff_max": e, "s_half": h} for d, e, h in s.compute_curve},
            "memory_efficiency": s.memory_efficiency,
            "op_overhead_s": s.op_overhead_s,
            "host_bandwidth": s.host_bandwidth,
            "calibrated_from": cal.profile,
            "observations": cal.observations,
            "median_error": cal.median_error,
            "max_error": cal.max_error,
        }
    }


def save_calibration(cal: Calibration, path: str | Path | None = None) -> Path:
    """Write ``cal`` as a device file entry (default: the store, ``<device>.json``)."""
    target = Path(path) if path is not None else calibration_dir() / f"{cal.spec.name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, json.dumps(_entry(cal), indent=1, sort_keys=True))
    return target


def stored_calibration(spec: DeviceSpec, path: str | Path | None = None) -> DeviceSpec:
    """``spec`` as calibrated in ``path`` (default: the store's ``<name>.json``), if it exists."""
    target = Path(path) if path is not None else calibration_dir() / f"{spec.name}.json"
    if path is None and not target.is_file():
        return spec
    entries = read_device_file(target, "calibration file", "write it again with 'autopipe calibrate'")
    if spec.name in entries:
        return entries[spec.name]
    if len(entries) == 1 and path is not None:
        only = next(iter(entries.values()))
        return replace(
            spec,
            compute_efficiency=only.compute_efficiency,
            compute_curve=only.compute_curve,
            memory_efficiency=only.memory_efficiency,
            op_overhead_s=only.op_overhead_s,
        )
    raise ProfileError(f"calibration file {target} has no entry for device {spec.name} (it has: {', '.join(entries)})")
