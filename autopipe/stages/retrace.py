"""Trace a plan's model again for emitted stages: any micro-batch size, meaningful names.

A plan's own trace (``torch.export``) is static: every size is a constant, so aten-level stage
code would run at the plan's micro-batch size only, and its values are named after aten ops
(``linear_14``). For emitted stages the model is exported once more with symbolic sizes
(``torch.export.Dim.AUTO`` on the inputs' first two dims: the batch, and the sequence length
where the model allows; what the model pins stays static) and then

- cut where the plan cuts, by block name (a symbolic trace has other node names than the
  static one the plan's nodes come from; its blocks are checked to be the same);
- its values renamed: the model's outputs after the fields the model returns them under
  (``logits``, ``encoder_last_hidden_state``; a plain ``return logits`` by its variable), values
  that leave a block after the module that made them (``transformer_h_0``).

Symbolic sizes are recomputed inside each stage from its own inputs (``split.py``). When the
symbolic trace fails or groups differently, the static trace is used and the note says why;
when it works but the model fixes one of those dims (Mamba's scan loops over the sequence
length in Python), the note names each fixed dim, its size and the model's line that fixed it
(torch's record of the specialisation).
fx traces are returned unchanged: their code computes sizes from its inputs already.
A micro-batch of one sample would pin the batch size (torch.export specialises sizes 0 and
1), so such inputs are traced doubled along dim 0 and shapes reported at the plan's size.

Tests: tests/stages/test_emit.py.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch import nn

from autopipe.errors import TraceError
from autopipe.graph.blocks import ValueInfo
from autopipe.graph.outputs import graph_outputs
from autopipe.graph.trace import TracedModel, trace_model
from autopipe.plans import Plan

__all__ = ["Retrace", "retrace_for_emit"]


@dataclasses.dataclass(frozen=True)
class Retrace:
    """The trace to cut, the plan with that trace's node names, and what became symbolic."""

    traced: TracedModel
    plan: Plan
    symbolic: dict[str, list[int]]  # model input -> its symbolic dims
    note: str  # why the shapes stayed static, if they did


def retrace_for_emit(plan: Plan, model: nn.Module, inputs: Any, traced: TracedModel) -> Retrace:
    """``traced`` (the plan's static trace, fingerprint checked) made general for emitting. An fx
    trace that calls a function of the model file itself (a ``torch.fx.wrap``'d fused kernel, such
    as ``models/llama.py``'s ``rms_norm``: one node whose code is the model's, not torch's) is
    exported instead, when the export groups into the same blocks: stage code holds torch
    operations only."""
    if traced.tracer != "export" and not _calls_model_file(traced):
        return Retrace(traced, plan, {}, "")
    u = plan.micro_batch_size
    example = _doubled(inputs) if u == 1 else inputs
    try:
        recipe = dataclasses.replace(plan.recipe, tracer="export")
        dyn = trace_model(model, example, micro_batch_size=u, recipe=recipe, dynamic=True)
    except TraceError as e:
        return Retrace(
            traced, plan, {}, f"static shapes: the model does not export with symbolic sizes ({str(e)[:160]})"
        )
    names = [b.name for b in dyn.blocks]
    if names != [b.name for b in traced.blocks]:
        return Retrace(traced, plan, {}, "static shapes: with symbolic sizes the model groups into other blocks")
    dyn = _renamed(dyn, _meaningful_names(dyn, model))
    if u == 1:
        dyn = dataclasses.replace(dyn, values=_at_batch(dyn, 1))
    index = {n: i for i, n in enumerate(names)}
    stages = tuple(
        dataclasses.replace(s, nodes=tuple(n for b in s.blocks for n in dyn.blocks[index[b]].nodes))
        for s in plan.stages
    )
    return Retrace(dyn, dataclasses.replace(plan, stages=stages), _symbolic_dims(dyn), _pinned_note(dyn))


def _calls_model_file(traced: TracedModel) -> bool:
    """Whether the graph calls a function defined in the model file (graph/canon.py's
    ``autopipe_user_model_<n>_<stem>`` modules, model/load.py)."""
    return any(
        n.op == "call_function" and str(getattr(n.target, "__module__", "")).startswith("autopipe_user_model_")
        for n in traced.gm.graph.nodes
    )


def _doubled(inputs: Any) -> Any:
    return torch.utils._pytree.tree_map(
        lambda t: torch.cat([t, t]) if isinstance(t, torch.Tensor) and t.dim() > 0 else t, inputs
    )


def _batch_symbols(traced: TracedModel) -> set[Any]:
    found: set[Any] = set()
    for n in traced.gm.graph.nodes:
        v = n.meta.get("val")
        if (
            n.op == "placeholder"
            and isinstance(v, torch.Tensor)
            and v.dim() > 0
            and isinstance(v.shape[0], torch.SymInt)
        ):
            found.add(v.shape[0].node.expr)
    return found


def _at_batch(traced: TracedModel, size: int) -> dict[str, ValueInfo]:
    """Value shapes with the batch symbols at ``size`` (the trace ran at another size)."""
    batch = {s: size for s in _batch_symbols(traced)}
    out = dict(traced.values)
    for n in traced.gm.graph.nodes:
        v = n.meta.get("val")
        if n.name in out and isinstance(v, torch.Tensor):
            shape = tuple(_size_at(d, batch) for d in v.shape)
            numel = 1
            for d in shape:
                numel *= d
            out[n.name] = dataclasses.replace(out[n.name], shape=shape, bytes=numel * v.element_size())
    return out


def _size_at(d: int | torch.SymInt, batch: dict[Any, int]) -> int:
    if not isinstance(d, torch.SymInt):
        return int(d)
    import sympy  # type: ignore[import-untyped]  # torch's own dependency

    expr = sympy.sympify(sympy.sympify(d.node.expr).xreplace(batch))
    env = d.node.shape_env
    hints = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", {})
    return int(sympy.sympify(expr.xreplace(hints)))


def _symbolic_dims(traced: TracedModel) -> dict[str, list[int]]:
    out = {}
    for n in traced.gm.graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder" and isinstance(v, torch.Tensor):
            out[n.name] = [
                d for d, s in enumerate(v.shape) if isinstance(s, torch.SymInt) and not s.node.expr.is_number
            ]
    return out


def _pinned_note(traced: TracedModel) -> str:
    """Why the stages take only one size of an input's first two dims, in words: the dims the
    symbolic export fixed and the model's line that fixed each one (torch's record of it); ""
    when every such dim stayed symbolic."""
    pinned: list[tuple[str, int, int]] = []  # input, dim, its fixed size
    env = None
    for n in traced.gm.graph.nodes:
        v = n.meta.get("val")
        if n.op != "placeholder" or not isinstance(v, torch.Tensor):
            continue
        for d, size in enumerate(v.shape[:2]):
            if isinstance(size, torch.SymInt) and not size.node.expr.is_number:
                env = size.node.shape_env
            else:
                pinned.append((n.name, d, int(size)))
    if not pinned:
        return ""
    where = {(name, d): _where_fixed(env, name, d) if size > 1 else "" for name, d, size in pinned}
    parts = []
    for name, d, size in pinned:
        why = f" by {where[name, d]}" if where[name, d] else ""
        if size <= 1:
            why = " (torch.export fixes sizes 0 and 1)"
        elif not why:  # found equal to another fixed size: say which, and where that one was fixed
            why = next(
                (
                    f" (equal to {o} dim {od}, fixed by {where[o, od]})"
                    for o, od, z in pinned
                    if z == size and where[o, od]
                ),
                "",
            )
        parts.append(f"{name} dim {d} is fixed at {size}{why}")
    return (
        f"static shapes in part: {'; '.join(parts)}; the model's code needs that size as a number "
        "(a Python loop over it, a weight, view or buffer of that length), so torch.export kept it "
        "constant and the stages take inputs of that size only"
    )


def _where_fixed(env: Any, name: str, dim: int) -> str:
    """``file.py:line in function`` of the model's code where torch recorded fixing ``name``'s ``dim`` (following
    the symbol through the sizes it was found equal to, to the one set to a number), if it did."""
    ending = f"['{name}'].size()[{dim}]"
    sources = getattr(env, "var_to_sources", {}) if env is not None else {}
    sym = next(
        (s for s, found in sources.items() if any(str(getattr(x, "name", "")).endswith(ending) for x in found)), None
    )
    replacements, slocs = getattr(env, "replacements", {}), getattr(env, "replacements_slocs", {})
    for _ in range(len(replacements) + 1):
        to = replacements.get(sym)
        if to is None:
            return ""
        if not to.is_Symbol:
            where = str(slocs.get(sym, "")).strip().strip("()")
            file = where.split(":")[0]
            return "" if not file or (Path(torch.__file__).parent / file).is_file() else where  # torch's own line: no
        sym = to
    return ""


# --------------------------------------------------------------------------- names


def _meaningful_names(traced: TracedModel, model: nn.Module) -> dict[str, str]:
    """Old -> new node names: the model's outputs, then values that leave their block."""
    names: dict[str, str] = {}
    outputs, _ = graph_outputs(traced.gm)
    for node, name in zip(outputs, _output_names(traced.gm, model, len(outputs)), strict=True):
        if node is not None and name and node not in traced.input_names:
            names.setdefault(node, name)
    for n in traced.gm.graph.nodes:
        block = traced.block_of.get(n.name)
        if block is None or n.name in names or not traced.values[n.name].is_tensor:
            continue
        if any(traced.block_of.get(u.name, block) != block for u in n.users):
            path = _innermost_module(n)
            if path:
                names[n.name] = _identifier(path)
    return names


def _output_names(gm: torch.fx.GraphModule, model: nn.Module, count: int) -> list[str]:
    """Names of the model's flat outputs: ModelOutput/dict fields, else the returned variables."""
    spec = gm.meta.get("out_spec")
    if isinstance(spec, torch.utils._pytree.TreeSpec) and spec.num_leaves == count and not spec.is_leaf():
        try:
            rebuilt = torch.utils._pytree.tree_unflatten(list(range(count)), spec)
            paths = [p for p, _ in torch.utils._pytree.tree_flatten_with_path(rebuilt)[0]]
            keyed = [_identifier(torch.utils._pytree.keystr(p)) for p in paths]
        except Exception:  # a registered type without key paths: a flat dict's keys will do
            context = spec.context if isinstance(spec.context, (list, tuple)) else []
            keyed = [_identifier(str(k)) for k in context] if len(context) == count else []
        if keyed and all(k and not k[0].isdigit() for k in keyed):
            return keyed
    returned = _returned_variables(model)
    return returned if returned and len(returned) == count else [""] * count


def _returned_variables(model: nn.Module) -> list[str] | None:
    """``["logits"]`` for ``return logits``, ``["a", "b"]`` for ``return a, b`` (every return alike)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(type(model).forward)))
    except (OSError, TypeError, SyntaxError):
        return None
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and node.value is not None:
            items = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            if not all(isinstance(i, ast.Name) for i in items):
                return None
            found.add(tuple(i.id for i in items if isinstance(i, ast.Name)))
    return list(found.pop()) if len(found) == 1 else None


def _innermost_module(n: torch.fx.Node) -> str:
    stack = n.meta.get("nn_module_stack") or {}
    paths = [v[0] if isinstance(v, tuple) else str(v) for v in stack.values()]
    paths = [p for p in paths if p and not p.startswith("_empty_nn_module_stack")]
    return paths[-1] if paths else ""


def _identifier(text: str) -> str:
    name = re.sub(r"\W+", "_", text).strip("_")
    return f"v_{name}" if name[:1].isdigit() else name


def _renamed(traced: TracedModel, names: dict[str, str]) -> TracedModel:
    """``traced`` with nodes renamed (fx keeps names unique: a repeat gets ``_1``)."""
    by_name = {n.name: n for n in traced.gm.graph.nodes}
    done: dict[str, str] = {}
    for old, new in names.items():
        by_name[old]._rename(new)
        done[old] = by_name[old].name
    traced.gm.recompile()

    def f(name: str) -> str:
        return done.get(name, name)

    return dataclasses.replace(
        traced,
        blocks=tuple(dataclasses.replace(b, nodes=tuple(map(f, b.nodes))) for b in traced.blocks),
        block_of={f(k): v for k, v in traced.block_of.items()},
        values={f(k): v for k, v in traced.values.items()},
        input_names=tuple(map(f, traced.input_names)),
    )
