"""``autopipe emit``: a plan's stages as standalone folders, and ``merge`` to put them back.

    autopipe emit plan.json -o stages/        # stages/stage0/, stages/stage1/, ..., manifest.json
    autopipe merge stages/ -o model.pt        # the original model's state_dict, bit for bit

Layout (``S*v`` stages, ``j = 0 .. S*v-1``; interleaved plans place stage j on rank ``j % S``)::

    stages/manifest.json        routing, shapes, parameter names, schedule (see below)
    stages/stagej/__init__.py   ``from .stage import StageJ, build, load``
    stages/stagej/stage.py      the stage module's source: needs only torch (and the model file,
                                for a stage that keeps a module whole: ``needs_model_file`` below)
    stages/stagej/weights.pt    its parameters and buffers (absent with --no-weights)
    stages/unused.pt            state the model holds but no stage reads (only if there is any)

Weights are written with ``torch.save`` as a plain ``{name: tensor}`` dict and read back with
``torch.load(weights_only=True)`` -- the format that needs nothing but torch, which is the
promise of an emitted folder. ``weights_format="safetensors"`` writes ``weights.safetensors``
instead (then reading them needs the safetensors package). Buffers are included, persistent or
not, since the stage needs them to run; the manifest records which ones the model's own
``state_dict`` holds, so ``merge`` rebuilds exactly that.

The manifest (``manifest.json``) lists, per stage in order: its inputs (name, shape and dtype at
the plan's micro-batch size, and the stage that makes each one, -1 for a model input) and
outputs (with every stage that reads each one, ``"output"`` for the model output), and its
tensors with the original model's names (a tied weight is listed in each stage that uses it,
``shared: true``, under every name the model gives it). ``transfers`` lists every value sent
from one stage to another, skip connections (not to the next stage) marked. Plus the
schedule, micro-batch count and size, and the model's state_dict keys in order. For an
export-traced model, ``symbolic_dims`` (model input -> dims the stages take at any size) and
``shapes_note`` (why shapes stayed static, if any did: the whole trace, or the dims the model
fixes and the line that fixes each, as Mamba's scan fixes the sequence length): see ``retrace.py``.
``needs_model_file`` (absent in older manifests): null when every stage needs only torch; else
``{"path", "factory", "kwargs", "stages", "modules"}``: the model file (absolute) the listed
stages import to build the modules they keep whole (``modules``: path -> class), as ``--leaf``
classes or torch modules with submodules (``source.py``).

The folder is built next to its destination and renamed into place, so a failure never leaves
half an emit; a non-empty destination is replaced only with ``force``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autopipe._io import VERSION, check_output_folder, shown, torch_save
from autopipe.errors import EmitError, OutputError, TraceError
from autopipe.graph.trace import TracedModel
from autopipe.plans import Plan
from autopipe.stages.rebuild import SEED, rebuild_model, trace_for_plan
from autopipe.stages.retrace import retrace_for_emit
from autopipe.stages.source import ModelFile, docstring_literal, stage_source
from autopipe.stages.split import OUTPUT, Split, StageModule, split_model
from autopipe.stages.whole import check_whole

__all__ = ["MANIFEST", "check_destination", "emit", "emit_stages"]

MANIFEST = "manifest.json"
FORMAT = "autopipe-stages"
FORMAT_VERSION = 2  # 2: unused state lists each tensor's shape and dtype, as stages do
WEIGHT_FORMATS = ("pt", "safetensors")
Progress = Callable[[str, int, int], None]  # progress(what, done, total), as costs.measure.measured's


def _silent(what: str, done: int, total: int) -> None:
    pass


def emit(
    plan: Plan,
    folder: str | Path,
    *,
    force: bool = False,
    weights: bool = True,
    state_dict: str | Path | None = None,
    weights_format: str = "pt",
    base: str | Path | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Rebuild the plan's model (seeded, or with ``state_dict``'s weights), split it, write it.

    ``weights=False`` builds the model on the meta device: nothing is materialised and no
    weights are written. ``progress(what, done, total)`` is told each step. Returns the manifest.
    """
    check_destination(folder, force, keep=(state_dict,))
    (progress or _silent)("rebuilding the model", 0, 0)
    loaded = rebuild_model(plan, weights=state_dict, meta=not weights, base=base)
    inputs = loaded.make_inputs(plan.micro_batch_size)
    seed = None if state_dict is not None or not weights else SEED
    try:
        return emit_stages(
            plan,
            loaded.model,
            inputs,
            folder,
            force=force,
            weights=weights,
            weights_format=weights_format,
            source=loaded.spec.path,
            seed=seed,
            progress=progress,
            model_file=ModelFile(str(loaded.spec.path.resolve()), loaded.spec.factory, plan.recipe.model_kwargs),
        )
    except TraceError as e:
        if weights or not plan.recipe.leaf_modules:
            raise
        # Tracing runs the kept-whole modules' own forward; on meta tensors a data-dependent one
        # fails, and the trace's advice (--leaf, which the plan has) would send the user in a circle.
        why = re.search(r"could not trace the model \((.*?)\); ", str(e))
        raise EmitError(
            f"without weights the model is built on the meta device, where the modules the plan keeps whole "
            f"({', '.join(plan.recipe.leaf_modules)}) run while tracing, and"
            f" {why.group(1) if why else 'one fails'}; emit with the weights (drop --no-weights, weights=False)"
        ) from None


def emit_stages(
    plan: Plan,
    model: nn.Module,
    example_inputs: Any,
    folder: str | Path,
    *,
    force: bool = False,
    weights: bool = True,
    weights_format: str = "pt",
    source: Path | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
    model_file: ModelFile | None = None,
) -> dict[str, Any]:
    """Split ``model`` (traced on one micro-batch ``example_inputs``) by ``plan`` into ``folder``.

    ``model_file``: where stages that keep a module whole build it (None: such a stage is refused)."""
    tell = progress or _silent
    if weights_format not in WEIGHT_FORMATS:
        raise EmitError(f"unknown weights format {weights_format!r}; use one of: {', '.join(WEIGHT_FORMATS)}")
    if weights and any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        raise EmitError("the model is on the meta device, so it has no weights to write; emit with --no-weights")
    dest = check_destination(folder, force, keep=(source,))
    tell("tracing and splitting the model", 0, 0)
    traced, split, shapes = _general_split(
        plan, model, example_inputs, trace_for_plan(plan, model, example_inputs, source)
    )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        manifest = _write(plan, model, traced, split, tmp, weights, weights_format, seed, tell, model_file)
        manifest.update(shapes)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        _publish(tmp, dest, force)
    except OSError as e:  # a full disk, a quota, a file size limit: the old folder stays as it was
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(f"cannot write the stages to {shown(dest)}: {e.strerror or e}; nothing was changed") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _general_split(
    plan: Plan, model: nn.Module, inputs: Any, traced: TracedModel
) -> tuple[TracedModel, Split, dict[str, Any]]:
    """The plan's stages from a trace with symbolic sizes and meaningful names where the model
    allows (``retrace.py``), else from ``traced``; and what the manifest says about shapes."""
    general = retrace_for_emit(plan, model, inputs, traced)
    note = general.note
    if general.traced is not traced:
        try:
            return (
                general.traced,
                split_model(general.traced, general.plan),
                {"symbolic_dims": general.symbolic, "shapes_note": general.note},
            )
        except Exception as e:  # a size no stage input carries: the static trace still works
            note = f"static shapes: {str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__}"
    return traced, split_model(traced, plan), {"symbolic_dims": {}, "shapes_note": note}


def check_destination(folder: str | Path, force: bool, keep: Iterable[str | Path | None] = ()) -> Path:
    """The destination as a Path; EmitError if it is a file, or a non-empty folder without
    ``force``, or one ``force`` would delete while it holds the current folder or a file of
    ``keep`` (the plan, its model file, the weights read); OutputError if it cannot be made there
    (see :func:`autopipe._io.check_output_folder`)."""
    dest = Path(folder)
    if dest.exists() and not dest.is_dir():
        raise EmitError(f"{dest} is a file, not a folder; name a new folder for the stages")
    check_output_folder(dest, "stages folder")
    if dest.is_dir() and any(dest.iterdir()):
        if not force:
            count = sum(1 for _ in dest.iterdir())
            raise EmitError(
                f"{dest} is not empty ({count} entries); emit into a new folder or pass --force to replace it"
            )
        inside = dest.resolve()
        held = [("the current folder", Path.cwd())] + [("the file", Path(k)) for k in keep if k is not None]
        for what, path in held:
            where = path.resolve()
            if where == inside or inside in where.parents:
                said = "" if what == "the current folder" else f" {shown(path)}"
                raise EmitError(f"{shown(dest)} holds {what}{said}, which --force would delete; emit into a new folder")
    return dest


def _publish(tmp: Path, dest: Path, force: bool) -> None:
    """Rename ``tmp`` to ``dest``; one emit at a time per parent folder (a lock on it, no lock file)."""
    mask = os.umask(0)
    os.umask(mask)
    tmp.chmod(0o777 & ~mask)  # mkdtemp made it private
    parent = os.open(dest.parent, os.O_RDONLY)
    try:
        fcntl.flock(parent, fcntl.LOCK_EX)  # another emit into the same folder waits for this rename
        if dest.is_dir():
            if not any(dest.iterdir()):
                dest.rmdir()
            else:
                check_destination(dest, force)  # it may have filled up meanwhile
                old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
                dest.rename(old)
                tmp.rename(dest)
                shutil.rmtree(old, ignore_errors=True)
                return
        tmp.rename(dest)
    finally:
        os.close(parent)  # and with it the lock


# --------------------------------------------------------------------------- writing


def _write(
    plan: Plan,
    model: nn.Module,
    traced: TracedModel,
    split: Split,
    out: Path,
    weights: bool,
    fmt: str,
    seed: int | None,
    tell: Progress,
    model_file: ModelFile | None,
) -> dict[str, Any]:
    names_of: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names_of.setdefault(id(t), []).append(name)
    state_keys = list(model.state_dict().keys())
    persistent = set(state_keys)
    users: dict[int, set[int]] = {}
    for st in split.stages:
        for t in [*st.module.parameters(), *st.module.buffers()]:
            users.setdefault(id(t), set()).add(st.index)

    stages: list[dict[str, Any]] = []
    covered: set[str] = set()
    whole: dict[int, dict[str, str]] = {}
    for st in split.stages:
        tell("writing stages", st.index, len(split.stages))
        entry, kept = _write_stage(plan, st, split, traced, out, weights, fmt, names_of, persistent, users, model_file)
        covered.update(o for t in entry["tensors"] for o in t["original"])
        stages.append(entry)
        if kept:
            whole[st.index] = kept
    needs = _needs_model_file(model_file, split, whole)

    unused = [k for k in state_keys if k not in covered]
    if unused and weights:
        state = model.state_dict()
        _save({k: _compact(state[k]) for k in unused}, out / f"unused.{fmt}", fmt)
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "autopipe": VERSION,
        "model": plan.model,
        "model_file": plan.recipe.model_file,
        "factory": plan.recipe.factory,
        "model_kwargs": list(plan.recipe.model_kwargs),
        "tracer": traced.tracer,
        "fingerprint": plan.recipe.fingerprint,
        "schedule": plan.schedule,
        "devices": plan.devices,
        "virtual": plan.virtual,
        "micro_batches": plan.micro_batches,
        "micro_batch_size": plan.micro_batch_size,
        "batch_size": plan.batch_size,
        "weights": fmt if weights else None,
        "seed": seed,
        "inputs": [{"name": n, **_value(traced, n)} for n in split.input_names],
        "outputs": [{"name": n, "stage": _maker(split, n)} for n in split.output_names if n is not None],
        "output_is_tuple": split.output_is_tuple,
        "stages": stages,
        "transfers": _transfers(split, traced),
        "shared": [
            {"original": names_of.get(_param_id(split, name), [name]), "stages": list(ss)}
            for name, ss in split.shared_params
        ],
        "state_dict": state_keys,
        "unused": _unused(unused, model, fmt if weights else None) if unused else None,
        "needs_model_file": needs,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def _write_stage(
    plan: Plan,
    st: StageModule,
    split: Split,
    traced: TracedModel,
    out: Path,
    weights: bool,
    fmt: str,
    names_of: dict[int, list[str]],
    persistent: set[str],
    users: dict[int, set[int]],
    model_file: ModelFile | None,
) -> tuple[dict[str, Any], dict[str, str]]:
    package, cls = f"stage{st.index}", f"Stage{st.index}"
    weights_file = f"weights.{fmt}" if weights else None
    inputs = [{"name": n, **_value(traced, n), "from": src} for n, src in zip(st.inputs, st.sources, strict=True)]
    outputs = [
        {"name": n, **_value(traced, n), "to": ["output" if r == OUTPUT else r for r in sends]}
        for n, sends in zip(st.outputs, st.sends, strict=True)
    ]
    blocks = plan.stages[st.index].blocks
    src = stage_source(
        st.module,
        cls,
        lambda whole: _docstring(plan, st, cls, package, blocks, inputs, outputs, weights_file, whole),
        weights_file,
        model_file,
    )
    folder = out / package
    folder.mkdir()
    (folder / "stage.py").write_text(src.text, encoding="utf-8")
    (folder / "__init__.py").write_text(
        docstring_literal(f"Stage {st.index} of {plan.model}, emitted by autopipe (source: stage.py).") + "\n\n"
        f"from .stage import {cls}, build, load\n\n__all__ = [{cls!r}, 'build', 'load']\n",
        encoding="utf-8",
    )
    if weights:
        _save({k: _compact(t) for k, t in src.tensors.items()}, folder / weights_file, fmt)  # type: ignore[operator]
    tensors = []
    local = {**src.tensors, **{alias: src.tensors[name] for alias, name in src.ties.items()}}
    for name, t in local.items():
        original = names_of.get(id(t), [])
        tensors.append(
            {
                "name": name,
                "original": original,
                "kind": "parameter" if isinstance(t, nn.Parameter) else "buffer",
                "persistent": any(o in persistent for o in original),
                "shared": len(users.get(id(t), ())) > 1,
                "tied_to": src.ties.get(name),
                "shape": list(t.shape),
                "dtype": _dtype(t.dtype),
            }
        )
    return {
        "index": st.index,
        "rank": st.rank,
        "package": package,
        "class": cls,
        "module": f"{package}/stage.py",
        "weights": f"{package}/{weights_file}" if weights_file else None,
        "blocks": list(blocks),
        "inputs": inputs,
        "outputs": outputs,
        "tensors": tensors,
    }, src.whole


def _needs_model_file(
    model_file: ModelFile | None, split: Split, whole: dict[int, dict[str, str]]
) -> dict[str, Any] | None:
    """The manifest's ``needs_model_file``, once the model file is checked to build the modules
    the stages keep whole (``whole``: stage index -> path -> class); None when none does."""
    if not whole:
        return None
    assert model_file is not None  # else stage_source refused the module
    check_whole(model_file, {i: (split.stages[i].module, kept) for i, kept in whole.items()})
    return {
        "path": model_file.path,
        "factory": model_file.factory,
        "kwargs": list(model_file.kwargs),
        "stages": sorted(whole),
        "modules": {path: cls for kept in whole.values() for path, cls in kept.items()},
    }


def _docstring(
    plan: Plan,
    st: StageModule,
    cls: str,
    package: str,
    blocks: tuple[str, ...],
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    weights_file: str | None,
    whole: dict[str, str],
) -> str:
    n = len(plan.stages)
    span = blocks[0] if len(blocks) == 1 else f"{blocks[0]} .. {blocks[-1]}"

    def row(v: dict[str, Any], where: str) -> str:
        return f"    {v['name']}  {tuple(v['shape'])} {v['dtype']}  {where}"

    ins = [row(v, "model input" if v["from"] == -1 else f"from stage {v['from']}") for v in inputs]
    outs = [
        row(v, "to " + ", ".join("the model output" if t == "output" else f"stage {t}" for t in v["to"]))
        for v in outputs
    ]
    args, results = ", ".join(v["name"] for v in inputs), ", ".join(v["name"] for v in outputs)
    how = f"weights from {weights_file} next to this file" if weights_file else "emitted without weights: use build()"
    return "\n".join(
        [
            f"Stage {st.index} of {n} (rank {st.rank}) of {plan.model}, emitted by autopipe {VERSION}.",
            "",
            f"Blocks: {span}. Plan: {plan.schedule}, {plan.micro_batches} micro-batches of {plan.micro_batch_size}.",
            "Needs only torch. Shapes below are at the plan's micro-batch size."
            if not whole
            else "Needs torch and the model file MODEL_FILE, which builds the modules this stage keeps\n"
            "whole: " + ", ".join(f"{path} ({c})" for path, c in whole.items()) + ".\n"
            "Shapes below are at the plan's micro-batch size.",
            "",
            "Inputs (argument order):",
            *ins,
            "Outputs (forward returns this tuple):",
            *outs,
            "",
            "Use (with the emit folder on sys.path):",
            "",
            f"    import {package}",
            f"    module = {package}.load()  # {how}",
            f"    ({results},) = module({args})",
        ]
    )


def _unused(names: list[str], model: nn.Module, fmt: str | None) -> dict[str, Any]:
    state = model.state_dict(keep_vars=True)
    tensors = [{"name": k, "shape": list(state[k].shape), "dtype": _dtype(state[k].dtype)} for k in names]
    return {"file": f"unused.{fmt}" if fmt else None, "names": names, "tensors": tensors}


def _value(traced: TracedModel, name: str) -> dict[str, Any]:
    info = traced.values.get(name)
    if info is None or not info.is_tensor:
        return {"shape": None, "dtype": None}
    return {"shape": list(info.shape), "dtype": info.dtype}


def _maker(split: Split, name: str) -> int:
    return next(st.index for st in split.stages if name in st.outputs)


def _transfers(split: Split, traced: TracedModel) -> list[dict[str, Any]]:
    out = []
    for st in split.stages:
        for name, sends in zip(st.outputs, st.sends, strict=True):
            for r in sends:
                if r != OUTPUT:
                    out.append(
                        {"value": name, "from": st.index, "to": r, "skip": r != st.index + 1, **_value(traced, name)}
                    )
    return out


def _param_id(split: Split, name: str) -> int:
    for st in split.stages:
        for n, p in st.module.named_parameters(remove_duplicate=False):
            if n == name:
                return id(p)
    return -1


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached; copied when it views a larger storage (which torch.save would write whole)."""
    t = t.detach()
    if t.untyped_storage().nbytes() != t.numel() * t.element_size() or not t.is_contiguous():
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def _save(tensors: dict[str, torch.Tensor], path: Path, fmt: str) -> None:
    if fmt == "safetensors":
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise EmitError(
                "weights format safetensors needs the safetensors package; pip install safetensors or use pt"
            ) from None
        try:
            save_file(tensors, str(path))
        except OSError:
            raise
        except Exception as e:  # safetensors reports a failed write as its own error
            raise OSError(f"safetensors failed: {str(e).strip()[:200]}") from None
    else:
        torch_save(tensors, path)
