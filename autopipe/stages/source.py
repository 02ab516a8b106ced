"""Write one stage's fx GraphModule as a standalone Python file that needs only torch.

``GraphModule.to_folder`` writes an absolute path to its weights into the code and pickles
every module it cannot print; the file written here instead

- rebuilds the module tree by name: plain containers are ``torch.nn.Module()``, leaf modules
  (``nn.Linear``, ``nn.Conv2d``, ...) are constructed from their ``repr`` -- checked at emit
  time to rebuild the same module (type, ``repr``, tensor names and shapes, plain attributes);
  loose parameters and buffers are ``torch.empty`` of the recorded shape and dtype;
- keeps whole the modules it cannot write as torch source (a ``--leaf`` class of the model's own
  code, a torch module with submodules such as ``nn.TransformerEncoderLayer``): the stage builds
  the plan's model from its model file on the meta device (shapes only) and takes each such
  module by its path (``get_submodule``), so only those stages import the model file
  (``MODEL_FILE``, an absolute path; ``build``/``load`` take ``model_file=`` when it moved);
- re-ties tensors that one stage reaches under two names (a tied embedding and LM head);
- holds the fx-generated ``forward`` verbatim, with an import for every global it uses
  (torch and the standard library only; user code in the graph is refused);
- finds its weights next to itself (``load()``), so the folder can be moved anywhere.

Every string from a plan or a model that enters the file (the docstring's model name, block
and value names; tensor and module names) is escaped (:func:`docstring_literal`) or written
with ``repr``: a plan is data, and importing a stage never runs text from it.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import io
import itertools
import sys
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch import nn

from autopipe.errors import EmitError

__all__ = ["ModelFile", "StageSource", "docstring_literal", "stage_source"]

_KNOWN_GLOBALS = {
    "torch": "import torch",
    "inf": "from math import inf",
    "nan": "from math import nan",
    "NoneType": "NoneType = type(None)",
    "device": "from torch import device",
    "fx_pytree": "import torch.fx._pytree as fx_pytree",
    "pytree": "import torch.utils._pytree as pytree",
}  # each line an import or an assignment (written after the imports)
_INDENT = "    "


@dataclass(frozen=True)
class ModelFile:
    """Where a stage builds the modules it keeps whole: the model file, its factory and kwargs."""

    path: str  # absolute
    factory: str
    kwargs: tuple[str, ...]  # "key=value" words, as the plan records them


@dataclass(frozen=True)
class StageSource:
    """The file's text and the stage's tensors by name (each tensor once; ``ties`` are aliases)."""

    text: str
    tensors: dict[str, torch.Tensor]  # local name -> tensor, in module order
    ties: dict[str, str]  # alias -> the name it shares a tensor with
    whole: dict[str, str]  # module path -> class name: modules taken whole from the model file


def stage_source(
    module: torch.fx.GraphModule,
    class_name: str,
    docstring: str | Callable[[dict[str, str]], str],
    weights_file: str | None,
    model_file: ModelFile | None = None,
) -> StageSource:
    """The Python source of ``module`` as class ``class_name`` with ``load()`` and ``build()``.

    A module that cannot be written as torch source is kept whole, taken from the model
    ``model_file`` builds; without one, EmitError. ``docstring`` may be a function of the modules
    kept whole (path -> class name)."""
    init: list[str] = []
    tensors: dict[str, torch.Tensor] = {}
    ties: dict[str, str] = {}
    seen: dict[int, str] = {}
    whole: dict[str, str] = {}
    _walk(module, "", init, tensors, ties, seen, whole, model_file)
    forward = _one_statement_a_line(module.code.strip("\n"))
    text = docstring(whole) if callable(docstring) else docstring
    imports = _imports(module, forward)
    head = [
        f"WEIGHTS = {weights_file!r}  # next to this file; None: emitted without weights",
        f"TIES = {ties!r}  # alias -> name: one tensor reached under both names",
    ]
    helpers = _HELPERS
    if whole:
        assert model_file is not None
        imports += ["import ast", "import importlib.util", "import sys"]
        head += [
            f"MODEL_FILE = {model_file.path!r}  # builds the modules kept whole (WHOLE); or pass model_file=",
            f"FACTORY = {model_file.factory!r}",
            f"MODEL_KWARGS = {list(model_file.kwargs)!r}  # the factory's keyword arguments, key=value",
            f"WHOLE = {whole!r}  # module path -> class: kept whole, taken from the model FACTORY builds",
        ]
        init = ["model = _whole_model(model_file)", *init]
        helpers = (
            _WHOLE_HELPERS
            + "\n"
            + _HELPERS.replace("CLASS()", "CLASS(model_file)")
            .replace('device="cpu"):', 'device="cpu", model_file=None):')
            .replace("path=None):", "path=None, model_file=None):")
            .replace("module.load_state_dict(state, strict=True, assign=True)", "_load_state(module, state)")
        )
    parts = [
        docstring_literal(text.strip() + "\n"),
        "",
        *_import_block(imports),
        "",
        *head,
        "",
        "",
        f"class {class_name}(torch.nn.Module):",
        f"{_INDENT}def __init__(self{', model_file=None' if whole else ''}):",
        f"{_INDENT * 2}super().__init__()",
        *(f"{_INDENT * 2}{line}" for line in init),
        f"{_INDENT * 2}_tie(self)",
        "",
        *(f"{_INDENT}{line}".rstrip() for line in forward.splitlines()),
        "",
        "",
        helpers.replace("CLASS", class_name).strip("\n"),
        "",
    ]
    return StageSource("\n".join(parts), tensors, ties, whole)


def docstring_literal(text: str) -> str:
    """``text`` as a triple-quoted string literal that evaluates back to ``text`` exactly.

    Newlines stay as they are, for a readable docstring; backslashes and quotes are escaped (so
    no quote ends the literal early), and every other character that is not printable (``\\r``,
    NUL, lone surrogates from undecodable bytes, line separators) is written as its escape.
    """
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n" or ch.isprintable():
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1])
    return '"""' + "".join(out) + '"""'


def _walk(
    m: nn.Module,
    prefix: str,
    init: list[str],
    tensors: dict[str, torch.Tensor],
    ties: dict[str, str],
    seen: dict[int, str],
    whole: dict[str, str],
    model_file: ModelFile | None = None,
) -> None:
    for name, t in [*m._parameters.items(), *m._buffers.items()]:
        if t is None:
            continue
        full = f"{prefix}{name}"
        if id(t) in seen:
            ties[full] = seen[id(t)]
            init.append(
                f"_tensor(self, {full!r}, {tuple(t.shape)!r}, {t.dtype}, parameter={isinstance(t, nn.Parameter)})"
            )
            continue
        seen[id(t)] = full
        tensors[full] = t
        if isinstance(t, nn.Parameter):
            init.append(
                f"_tensor(self, {full!r}, {tuple(t.shape)!r}, {t.dtype}, "
                f"parameter=True, requires_grad={t.requires_grad})"
            )
        else:
            init.append(f"_tensor(self, {full!r}, {tuple(t.shape)!r}, {t.dtype}, parameter=False)")
    for name, child in m._modules.items():
        if child is None:
            continue
        full = f"{prefix}{name}"
        if type(child) is nn.Module:
            init.append(f"_module(self, {full!r}, torch.nn.Module())")
            _walk(child, f"{full}.", init, tensors, ties, seen, whole, model_file)
            continue
        expr = _constructor(full, child)
        if expr is None:
            whole[full] = type(child).__name__
            if model_file is None:
                raise EmitError(_no_model_file(full, child))
            expr = f"_whole(model, {full!r}, {type(child).__name__!r})"
        init.append(f"_module(self, {full!r}, {expr})")
        for sub, t in [*child.named_parameters(remove_duplicate=False), *child.named_buffers(remove_duplicate=False)]:
            local = f"{full}.{sub}"
            if id(t) in seen:
                ties[local] = seen[id(t)]
            else:
                seen[id(t)] = local
                tensors[local] = t


def _constructor(path: str, m: nn.Module) -> str | None:
    """``torch.nn.Linear(in_features=4, ...)``, checked to rebuild a module like ``m``; None when
    ``m`` cannot be written so (a class of the model's own code, a torch module with
    submodules, one whose ``repr`` does not rebuild it): the stage keeps it whole."""
    cls = type(m)
    text = repr(m)
    if getattr(torch.nn, cls.__name__, None) is not cls or "\n" in text:
        return None
    expr = f"torch.nn.{text}"
    try:
        with torch.device("meta"):
            rebuilt = eval(expr, {"torch": torch})
    except Exception:
        return None
    return expr if _same_module(m, rebuilt) else None


def _no_model_file(path: str, m: nn.Module) -> str:
    cls = type(m).__name__
    kind = "a module of the model's own code" if getattr(torch.nn, cls, None) is not type(m) else "a torch module"
    return (
        f"module {path} ({cls}, {kind}) is kept whole on its stage, which then builds it from the plan's "
        "model file, and this plan names none (it was planned from Python); plan a model file "
        "(autopipe.plan('MODEL.py', ...)) and emit that plan"
    )


def _same_module(a: nn.Module, b: nn.Module) -> bool:
    if type(a) is not type(b) or repr(a) != repr(b):
        return False
    shapes_a = {k: tuple(v.shape) for k, v in a.state_dict(keep_vars=True).items()}
    shapes_b = {k: tuple(v.shape) for k, v in b.state_dict(keep_vars=True).items()}
    if shapes_a != shapes_b:
        return False
    plain = (bool, int, float, str, tuple, type(None))
    for key, value in vars(a).items():
        if key.startswith("_") or key == "training" or not isinstance(value, plain):
            continue
        if getattr(b, key, object()) != value:
            return False
    return True


def _one_statement_a_line(code: str) -> str:
    """``code`` with each ``a; b`` line (fx frees values as ``y = f(x);  x = None``) written as
    two lines at the same indent, so the emitted file passes a linter as it is."""
    cuts: dict[int, list[int]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.OP and tok.string == ";":
            cuts.setdefault(tok.start[0], []).append(tok.start[1])
    lines = code.split("\n")
    out: list[str] = []
    for row, line in enumerate(lines, start=1):
        if row not in cuts:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        bounds = [0, *cuts[row], len(line)]
        pieces = [line[a + (a > 0) : b].strip() for a, b in itertools.pairwise(bounds)]
        out.extend(indent + piece for piece in pieces if piece)
    return "\n".join(out)


def _import_block(lines: list[str]) -> list[str]:
    """``import os`` and ``lines`` in the order isort (ruff's ``I``) keeps: the standard library,
    then torch, each ``import x`` before ``from x import a, b`` (one line per module); then the
    assignments among ``lines``."""
    straight: set[str] = set()
    froms: dict[str, set[str]] = {}
    for line in ["import os", *lines]:
        if line.startswith("from "):
            mod, names = line[len("from ") :].split(" import ", 1)
            froms.setdefault(mod, set()).add(names)
        elif line.startswith("import "):
            straight.add(line)
    block: list[str] = []
    for stdlib in (True, False):
        section = sorted((x for x in straight if _is_stdlib(x.split()[1]) == stdlib), key=str.lower) + [
            f"from {mod} import {', '.join(sorted(names, key=_isort_name))}"
            for mod, names in sorted(froms.items(), key=lambda kv: kv[0].lower())
            if _is_stdlib(mod) == stdlib
        ]
        block += ([""] if block and section else []) + section
    assignments = sorted({line for line in lines if not line.startswith(("import ", "from "))})
    return block + (["", *assignments] if assignments else [])


def _is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def _isort_name(name: str) -> tuple[int, str, str]:
    """isort's order of the names in one ``from`` import: CONSTANTS, Classes, then the rest."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name.lower(), name)


def _names_used(code: str) -> set[str]:
    """The names ``code`` reads (not keyword arguments or attributes that share a name)."""
    return {node.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name)}


def _imports(module: torch.fx.GraphModule, code: str) -> list[str]:
    lines = ["import torch"]
    used = _names_used(code)
    for name, obj in module.graph.python_code("self").globals.items():
        if name == "torch" or name not in used:
            continue
        if name in _KNOWN_GLOBALS:
            lines.append(_KNOWN_GLOBALS[name])
        elif getattr(builtins, name, None) is obj:
            continue
        else:
            lines.extend(_import_line(name, obj).split("\n"))
    return lines


def _import_line(name: str, obj: Any) -> str:
    mod = getattr(obj, "__name__", None) if isinstance(obj, type(sys)) else getattr(obj, "__module__", None)
    qual = None if isinstance(obj, type(sys)) else getattr(obj, "__qualname__", None)
    top = (mod or "").split(".")[0]
    if (
        not mod
        or (top != "torch" and top not in sys.stdlib_module_names)
        or (qual is None and not isinstance(obj, type(sys)))
    ):
        raise EmitError(
            f"the stage's code calls {name} ({mod or type(obj).__name__}), which is not part of torch or the standard "
            "library; plan with --tracer export so the graph holds torch operations only"
        )
    if qual is None:
        return f"import {mod} as {name}"
    found: Any = importlib.import_module(mod)
    for part in qual.split("."):
        found = getattr(found, part, None)
    if found is not obj:
        raise EmitError(
            f"the stage's code calls {name}, which cannot be imported as {mod}.{qual}; plan with --tracer export"
        )
    if "." not in qual:
        return f"from {mod} import {qual}" + ("" if qual == name else f" as {name}")
    return f"import {mod}\n{name} = {mod}.{qual}"


_WHOLE_HELPERS = '''
_IMPORTED = {}  # model file path -> its module, imported once per process


def _whole_model(model_file=None):
    """The model FACTORY in MODEL_FILE (or ``model_file``) builds, on the meta device: shapes only."""
    path = os.path.abspath(MODEL_FILE if model_file is None else model_file)
    module = _IMPORTED.get(path)
    if module is None:
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"this stage keeps {', '.join(WHOLE)} whole, built from the model file {path}, "
                "which is not there; pass model_file= to build() or load()"
            )
        name = f"autopipe_stage_model_{len(_IMPORTED)}_{__name__.replace('.', '_')}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        folder = os.path.dirname(path)
        sys.path.insert(0, folder)  # for the siblings the model file imports, while it runs only
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        finally:
            if folder in sys.path:
                sys.path.remove(folder)
        _IMPORTED[path] = module
    kwargs = {}
    for item in MODEL_KWARGS:  # as autopipe read them: Python literals, else the raw string
        key, _, raw = item.partition("=")
        try:
            kwargs[key.strip()] = ast.literal_eval(raw.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            kwargs[key.strip()] = raw
    with torch.device("meta"):
        return getattr(module, FACTORY)(**kwargs)


def _whole(model, path, cls):
    """The module at ``path`` of ``model``, checked to be a ``cls``, on the current device (empty)."""
    module = model.get_submodule(path)
    if type(module).__name__ != cls:
        raise TypeError(f"the model file's module {path} is a {type(module).__name__}, not a {cls}; emit again")
    return module.to_empty(device=torch.empty(0).device)


def _load_state(module, state):
    """``state`` into ``module`` by assignment; buffers kept out of state_dict are set as well."""
    known = module.state_dict(keep_vars=True).keys()
    module.load_state_dict({k: v for k, v in state.items() if k in known}, strict=True, assign=True)
    for key in state.keys() - known:
        parent, _, field = key.rpartition(".")
        owner = module.get_submodule(parent) if parent else module
        if field not in owner._buffers:
            raise KeyError(f"the weights hold {key}, which this stage does not have")
        owner._buffers[field] = state[key]
'''

_HELPERS = '''
def build(device="cpu"):
    """The stage with uninitialised weights (torch.empty) on ``device``."""
    with torch.device(device):
        return CLASS()


def load(device="cpu", path=None):
    """The stage with its weights, read from ``path`` (default: WEIGHTS next to this file)."""
    if path is None:
        if WEIGHTS is None:
            raise FileNotFoundError("this stage was emitted without weights; use build() and load your own")
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), WEIGHTS)
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file

        state = load_file(str(path), device=str(device))
    else:
        state = torch.load(path, map_location=device, weights_only=True)
    for alias, name in TIES.items():
        state[alias] = state[name]
    with torch.device("meta"):
        module = CLASS()
    module.load_state_dict(state, strict=True, assign=True)
    _tie(module)
    return module


def _module(root, path, module):
    """Put ``module`` at dotted ``path`` below ``root``."""
    parent, _, name = path.rpartition(".")
    owner = root.get_submodule(parent) if parent else root
    owner.add_module(name, module)


def _tensor(root, path, shape, dtype, parameter, requires_grad=True):
    parent, _, name = path.rpartition(".")
    owner = root.get_submodule(parent) if parent else root
    value = torch.empty(shape, dtype=dtype)
    if parameter:
        owner.register_parameter(name, torch.nn.Parameter(value, requires_grad=requires_grad))
    else:
        owner.register_buffer(name, value)


def _tie(root):
    for alias, name in TIES.items():
        parent, _, field = alias.rpartition(".")
        owner = root.get_submodule(parent) if parent else root
        tied = isinstance(getattr(owner, field), torch.nn.Parameter)
        value = root.get_parameter(name) if tied else root.get_buffer(name)
        setattr(owner, field, value)
'''
