"""Load a model file written in autopipe's model-file convention (see DESIGN.md).

A model file is plain Python::

    def build_model(**kwargs) -> torch.nn.Module: ...        # required (the factory)
    def example_inputs(batch_size: int, **kwargs): ...       # required: Tensor | tuple | dict
    def example_targets(batch_size: int, **kwargs): ...      # optional
    def loss_fn(output, targets) -> torch.Tensor: ...        # optional (default: output mean)
    def train_data(batch_size: int, **kwargs): ...           # optional: an iterable of (inputs, targets)

named as ``path/to/model.py[:factory]`` with factory keyword arguments ``-k key=value``.
``example_inputs``, ``example_targets`` and ``train_data`` receive the factory kwargs they
declare, so a file can size its batch from ``vocab_size`` or ``seq_len``. ``train_data``
yields the batches ``autopipe run`` trains on (targets None when ``loss_fn`` ignores them).

Everything that can go wrong -- the file, its import, its functions, the model rejecting its
own inputs, an ``example_inputs`` whose tensors are not ``batch_size`` long in their first
dimension, user code calling ``sys.exit`` -- raises :class:`~autopipe.errors.ModelLoadError`
with one line naming the user's function, their message and their ``file:line``.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import itertools
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from autopipe.errors import FactoryArgumentError, ModelLoadError
from autopipe.model.meta import SkipMetaFills
from autopipe.model.spec import DEFAULT_FACTORY, ModelSpec, parse_kwargs
from autopipe.model.usercode import display_path, exception_summary, first_line, guarded

__all__ = [
    "DEFAULT_FACTORY",
    "LoadedModel",
    "ModelSpec",
    "call_model",
    "check_model_runs",
    "default_loss",
    "describe_inputs",
    "load_model",
    "parse_kwargs",
]

_module_ids = itertools.count()


# ----------------------------------------------------------------------------- loaded model


@dataclass(frozen=True)
class LoadedModel:
    """A built model with the callables that feed it, ready to trace, profile or run."""

    spec: ModelSpec
    model: torch.nn.Module
    make_inputs: Callable[[int], object]  # batch_size -> example inputs (on the model's device)
    make_targets: Callable[[int], object] | None  # batch_size -> targets; None when undefined
    loss_fn: Callable[[object, object], torch.Tensor]  # the file's loss_fn, or default_loss
    has_targets: bool
    make_train_data: Callable[[int], Iterable[Any]] | None = None  # batch_size -> the file's train_data


def call_model(model: Callable[..., Any], inputs: object) -> Any:
    """Feed example inputs to a model: tuple -> ``model(*inputs)``, mapping -> ``model(**inputs)``,
    anything else (a tensor) -> ``model(inputs)``."""
    if isinstance(inputs, tuple):
        return model(*inputs)
    if isinstance(inputs, Mapping):
        return model(**inputs)
    return model(inputs)


def _tensor_leaves(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, Mapping):
        return [t for v in obj.values() for t in _tensor_leaves(v)]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in _tensor_leaves(v)]
    return []


def default_loss(output: object, targets: object = None) -> torch.Tensor:
    """The loss used when the model file defines none: the sum, over the floating-point tensors
    in ``output`` (nested tuples, lists, dicts), of each tensor's mean. Ignores ``targets``."""
    leaves = [t for t in _tensor_leaves(output) if t.is_floating_point() or t.is_complex()]
    if not leaves:
        raise ModelLoadError(
            f"the model output ({type(output).__name__}) holds no floating-point tensor, so the default loss "
            "(output mean) does not apply; define loss_fn(output, targets) in the model file"
        )
    total = leaves[0].real.mean() if leaves[0].is_complex() else leaves[0].mean()
    for t in leaves[1:]:
        total = total + (t.real.mean() if t.is_complex() else t.mean())
    return total


def describe_inputs(inputs: object) -> str:
    """``"(8, 64) int64"``; tuples comma-separated, dicts as ``name: shape dtype``."""
    if isinstance(inputs, torch.Tensor):
        dims = ", ".join(str(d) for d in inputs.shape)
        shape = f"({dims},)" if inputs.dim() == 1 else f"({dims})"
        return f"{shape} {str(inputs.dtype).removeprefix('torch.')}"
    if isinstance(inputs, Mapping):
        return ", ".join(f"{k}: {describe_inputs(v)}" for k, v in inputs.items())
    if isinstance(inputs, (tuple, list)):
        return ", ".join(describe_inputs(v) for v in inputs) if inputs else "()"
    return type(inputs).__name__


def _to_device(obj: object, device: torch.device) -> object:
    if isinstance(obj, torch.Tensor):
        return _meta_view(obj) if device.type == "meta" else obj.to(device)
    if isinstance(obj, tuple):
        items: list[Any] = [_to_device(v, device) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)  # namedtuple or tuple
    if isinstance(obj, list):
        return [_to_device(v, device) for v in obj]
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def _meta_view(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the meta device with its storage, strides and offset: a slice of a larger batch
    keeps that batch alive in a real run, and the analytic profile counts it the same way."""
    if t.is_meta:
        return t
    numel = t.untyped_storage().nbytes() // max(1, t.element_size())
    base = torch.empty(numel, dtype=t.dtype, device="meta")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


# ----------------------------------------------------------------------------- importing


def _import_file(path: Path) -> ModuleType:
    """Execute the model file as a fresh module with a unique name (loading a file twice gives two
    independent modules). The module stays in sys.modules so dataclasses and pickling work."""
    shown = str(path)
    if not path.exists():
        where = "" if path.is_absolute() else f" (looked relative to {Path.cwd()})"
        raise ModelLoadError(f"model file not found: {shown}{where}; check the path")
    if path.is_dir():
        raise ModelLoadError(
            f"{shown} is a directory, not a model file; name the .py file inside it (e.g. {path / 'model.py'})"
        )
    if path.suffix != ".py":
        raise ModelLoadError(
            f"{shown} is not a Python file; a model file is a .py file defining "
            f"{DEFAULT_FACTORY}() and example_inputs()"
        )
    resolved = path.resolve()
    source = _read_source(resolved, shown)
    not_python = (
        f"{shown} is not Python source (a binary file?); a model file is a .py file "
        f"defining {DEFAULT_FACTORY}() and example_inputs()"
    )
    if b"\x00" in source:
        raise ModelLoadError(not_python)
    try:
        code = compile(source, str(resolved), "exec", dont_inherit=True)
    except SyntaxError as e:
        if not e.lineno:  # not a line's fault: undecodable bytes, say
            raise ModelLoadError(f"{not_python} ({e.msg})") from e
        raise ModelLoadError(f"syntax error in {shown}:{e.lineno}: {e.msg}") from e
    except ValueError as e:
        raise ModelLoadError(f"cannot compile {shown}: {first_line(e)}") from e

    stem = re.sub(r"\W", "_", path.stem)
    name = f"autopipe_user_model_{next(_module_ids)}_{stem}"
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None:
        raise ModelLoadError(f"cannot import {shown} as a Python module; check that it is a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # The model file may import a sibling module (``from layers import Block``), as it would when
    # run as a script. Its folder goes at the front of sys.path for the duration of exec only and
    # is removed right after; sys.path is never changed permanently.
    folder = str(resolved.parent)
    sys.path.insert(0, folder)
    try:
        with guarded(
            f"importing {shown}",
            path,
            exited=lambda summary: f"{shown} {summary} while being imported; a model file must not exit",
        ):
            try:
                exec(code, module.__dict__)
            except SyntaxError as e:  # in a sibling module the file imports
                where = display_path(e.filename or shown, path)
                raise ModelLoadError(f"syntax error in {where}:{e.lineno}: {e.msg} (imported by {shown})") from e
            except ImportError as e:
                raise ModelLoadError(
                    f"importing {shown} failed: {exception_summary(e, path)}; "
                    "install the missing package or fix the import"
                ) from e
    except BaseException:
        sys.modules.pop(name, None)
        raise
    finally:
        if sys.path and sys.path[0] == folder:
            del sys.path[0]
        elif folder in sys.path:
            sys.path.remove(folder)
    return module


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"))


def _read_source(resolved: Path, shown: str) -> bytes:
    """The file's bytes, opened without blocking and refused in one line unless it is a regular
    file: a FIFO would block the read for ever, a device never end."""
    try:
        fd = os.open(resolved, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise ModelLoadError(f"cannot read model file {shown}: {e.strerror or e}") from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((said for test, said in _KINDS if test(mode)), "not a regular file")
            raise ModelLoadError(f"{shown} is {kind}, not a model file; name a regular .py file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError as e:
        raise ModelLoadError(f"cannot read model file {shown}: {e.strerror or e}") from e
    finally:
        os.close(fd)


def _optional(module: ModuleType, name: str, path: Path, hint: str) -> Callable[..., Any] | None:
    fn = getattr(module, name, None)
    if fn is not None and not callable(fn):
        raise ModelLoadError(f"{name} in {path} is a {type(fn).__name__}, not a function; {hint}")
    return fn


def _required(module: ModuleType, name: str, path: Path, hint: str) -> Callable[..., Any]:
    fn = _optional(module, name, path, hint)
    if fn is None:
        raise ModelLoadError(f"{path} has no function {name!r}; {hint}")
    return fn


def _accepted(fn: Callable[..., Any]) -> tuple[list[str] | None, list[str]]:
    """Keyword names ``fn`` accepts, in signature order (None: any, it has ``**kwargs``), and the
    required ones."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None, []
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None, []
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = [p.name for p in params if p.kind in kinds]
    required = [p.name for p in params if p.kind in kinds and p.default is p.empty]
    return names, required


def _check_factory_kwargs(fn: Callable[..., Any], name: str, kwargs: Mapping[str, object]) -> None:
    """Reject kwargs the factory's signature cannot take, before calling it (clearer than the
    TypeError the call would raise)."""
    accepted, required = _accepted(fn)
    if accepted is None:
        return
    unknown = [k for k in kwargs if k not in accepted]
    missing = [k for k in required if k not in kwargs]
    if unknown:
        takes = ", ".join(accepted) if accepted else "no arguments"
        close = difflib.get_close_matches(unknown[0], accepted, n=1)
        hint = f"; did you mean -k {close[0]}=...?" if close else ""
        message = f"{name}() does not take {', '.join(unknown)} (it takes: {takes}){hint}"
    elif missing:
        message = f"{name}() needs {', '.join(missing)}; pass " + " ".join(f"-k {k}=VALUE" for k in missing)
    else:
        return
    raise FactoryArgumentError(
        message, factory=name, is_class=inspect.isclass(fn), missing=tuple(missing), unknown=tuple(unknown)
    )


def _bound(fn: Callable[..., Any], kwargs: Mapping[str, object]) -> dict[str, object]:
    accepted, _ = _accepted(fn)
    return {k: v for k, v in kwargs.items() if k != "batch_size" and (accepted is None or k in accepted)}


def _call_user(fn: Callable[..., Any], name: str, path: Path, /, *args: object, **kwargs: object) -> Any:
    """``fn(*args, **kwargs)`` under the guard (positional-only: a factory may take ``name=`` or ``path=``)."""
    with guarded(name, path):
        return fn(*args, **kwargs)


def _batch_maker(
    fn: Callable[..., Any],
    name: str,
    path: Path,
    kwargs: Mapping[str, object],
    device: torch.device | None,
    check_batch: bool = False,
) -> Callable[[int], object]:
    bound = _bound(fn, kwargs)

    def make(batch_size: int) -> object:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ModelLoadError(f"batch size must be a positive integer (got {batch_size!r})")
        # Made where the file makes them, then moved: a file seeding a CPU torch.Generator must
        # not fail under a CUDA default device.
        out = _call_user(fn, f"{name}({batch_size})", path, batch_size, **bound)
        if out is None:
            raise ModelLoadError(
                f"{name}({batch_size}) in {path} returned None; return a Tensor, a tuple of positional inputs "
                "or a dict of keyword inputs"
            )
        if check_batch:
            wrong = [t for t in _tensor_leaves(out) if t.dim() >= 1 and t.shape[0] != batch_size]
            if wrong:
                raise ModelLoadError(
                    f"{name}({batch_size}) in {path} returned a tensor of shape {tuple(wrong[0].shape)}, whose first "
                    f"dimension is not the batch size {batch_size}; make {name} use its batch_size argument"
                )
        return _to_device(out, device) if device is not None else out

    return make


def _user_loss(fn: Callable[..., Any], path: Path) -> Callable[[object, object], torch.Tensor]:
    def loss(output: object, targets: object) -> torch.Tensor:
        with guarded("loss_fn", path, timed=False):  # called each step: the run's timeout bounds it
            value = fn(output, targets)
        if not isinstance(value, torch.Tensor):
            raise ModelLoadError(
                f"loss_fn in {path} returned a {type(value).__name__}, not a Tensor; return a scalar tensor"
            )
        return value

    return loss


def load_model(
    spec: str, kwargs: Mapping[str, object] | None = None, *, device: str | torch.device | None = None
) -> LoadedModel:
    """Import ``spec`` (``path/to/model.py[:factory]``), build its model with ``kwargs``.

    With ``device`` the model and its example batches are created on that device
    (``"meta"``: shapes only, no memory, for analytic planning).
    """
    mspec = ModelSpec.parse(spec, kwargs)
    path = mspec.path
    module = _import_file(path)
    how = f"define {DEFAULT_FACTORY}(**kwargs) -> nn.Module or name another with {path}:factory"
    factory = _required(module, mspec.factory, path, how)
    inputs_fn = _required(
        module, "example_inputs", path, "define example_inputs(batch_size) returning a Tensor, tuple or dict"
    )
    targets_fn = _optional(module, "example_targets", path, "define example_targets(batch_size) or remove the name")
    loss = _optional(module, "loss_fn", path, "define loss_fn(output, targets) -> Tensor or remove the name")
    data_fn = _optional(
        module, "train_data", path, "define train_data(batch_size) yielding (inputs, targets) or remove the name"
    )

    _check_factory_kwargs(factory, mspec.factory, mspec.kwargs)
    dev = torch.device(device) if device is not None else None
    with (
        dev if dev is not None else nullcontext(),
        SkipMetaFills() if dev is not None and dev.type == "meta" else nullcontext(),
    ):
        model = _call_user(factory, mspec.factory, path, **mspec.kwargs)
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(
            f"{mspec.factory}() in {path} returned a {type(model).__name__}, not a torch.nn.Module; return the model"
        )
    if dev is not None and dev.type != "meta":
        model = model.to(dev)

    return LoadedModel(
        spec=mspec,
        model=model,
        make_inputs=_batch_maker(inputs_fn, "example_inputs", path, mspec.kwargs, dev, check_batch=True),
        make_targets=_batch_maker(targets_fn, "example_targets", path, mspec.kwargs, dev) if targets_fn else None,
        loss_fn=_user_loss(loss, path) if loss is not None else default_loss,
        has_targets=targets_fn is not None,
        make_train_data=_data_maker(data_fn, path, mspec.kwargs) if data_fn is not None else None,
    )


def _data_maker(fn: Callable[..., Any], path: Path, kwargs: Mapping[str, object]) -> Callable[[int], Iterable[Any]]:
    """``train_data(batch_size, **the kwargs it declares)``, errors as one line naming the file."""
    bound = _bound(fn, kwargs)

    def make(batch_size: int) -> Iterable[Any]:
        data = _call_user(fn, f"train_data({batch_size})", path, batch_size, **bound)
        if not isinstance(data, Iterable):
            raise ModelLoadError(
                f"train_data({batch_size}) in {path} returned a {type(data).__name__}; return an iterable "
                "of (inputs, targets) batches"
            )
        return data

    return make


def check_model_runs(loaded: LoadedModel, batch_size: int) -> None:
    """Run one forward (no grad) on ``make_inputs(batch_size)`` and the loss on its output.

    Raises ModelLoadError naming the input shapes and the user's line when the model rejects
    its own example inputs.
    """
    path = loaded.spec.path
    inputs = loaded.make_inputs(batch_size)
    targets = loaded.make_targets(batch_size) if loaded.make_targets is not None else None
    with torch.no_grad():
        with guarded(
            "the model's forward",
            path,
            raised=lambda summary: (
                f"the model rejected its example inputs (input shapes: {describe_inputs(inputs)}): {summary}"
            ),
            exited=lambda summary: f"the model's forward {summary}; return or raise instead of exiting",
        ):
            output = call_model(loaded.model, inputs)
        value = loaded.loss_fn(output, targets)
    if value.numel() != 1:
        where = "loss_fn" if loaded.loss_fn is not default_loss else "the default loss"
        raise ModelLoadError(
            f"{where} returned a tensor of shape {tuple(value.shape)}, not a scalar; reduce it (e.g. .mean())"
        )
