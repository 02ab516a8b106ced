"""Trace a model into a torch.fx graph and group its nodes into blocks.

Two tracers sit behind one interface, both giving a flat ``torch.fx.GraphModule``:

- ``fx``: ``torch.fx.symbolic_trace`` — fast, keeps leaf modules whole (``leaf_modules``), but
  fails on most current Hugging Face models (``**kwargs`` forwards, item assignment on proxies).
- ``export``: ``torch.export.export(strict=False)`` — what real-world models need and what
  torch.distributed.pipelining builds on; nodes carry ``nn_module_stack`` so blocks still
  follow the user's modules.

``auto`` tries ``fx`` then ``export`` and records which one worked. A trace is specialised to
one micro-batch size: every tensor's shape and dtype is known (export's fake values, or fake
tensor propagation for fx), and plain Python values that cross block boundaries (sizes) are
folded into constants, so only tensors flow between blocks.

Blocks — the units the solver places on stages — follow the user's modules: a node belongs to
the outermost module on its module path that is a *layer* (a child of a ``ModuleList`` /
``Sequential`` / ``ModuleDict``, not itself such a container) or that holds no layers at all
(an embedding, a head). Loose ops and tiny parameter-free modules fold into a neighbour. For a
GPT that gives embeddings, one block per transformer layer, the final norm and the head.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import operator
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import torch
import torch.fx
from torch import nn

from autopipe.errors import TraceError

__all__ = ["Block", "TracedModel", "ValueInfo", "trace_model"]

TRACERS = ("auto", "fx", "export")
_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)
_COMPUTE_OPS = ("call_module", "call_function", "call_method")
_MAX_BLOCKS = 2000  # never hand the solver more blocks than this


@dataclass(frozen=True)
class ValueInfo:
    """Shape, dtype and size of a node's value (tensors; 0 bytes for anything else)."""

    shape: tuple[int, ...]
    dtype: str
    bytes: int
    is_tensor: bool


@dataclass(frozen=True)
class Block:
    """A contiguous run of fx nodes that the solver places as one unit."""

    index: int
    name: str  # the user's module path ("blocks.3"), or the loose op's name
    module_type: str  # class name of that module ("" for loose ops)
    nodes: tuple[str, ...]  # fx node names, graph order
    params: tuple[str, ...]  # parameter names this block owns (a shared one: its first user)


@dataclass(frozen=True)
class TracedModel:
    """A model traced at one micro-batch size and grouped into blocks."""

    gm: torch.fx.GraphModule
    tracer: str  # "fx" or "export"
    micro_batch_size: int
    blocks: tuple[Block, ...]
    block_of: dict[str, int]  # fx node name -> block index (compute nodes only)
    values: dict[str, ValueInfo]  # fx node name -> its value's shape/dtype/bytes
    input_names: tuple[str, ...]  # placeholder names, in order
    shared_params: tuple[tuple[str, tuple[int, ...]], ...]  # (param, blocks using it)
    graph: nx.DiGraph = field(repr=False)  # block graph; edge attrs: bytes, tensors
    fallback_reason: str = ""  # why ``auto`` fell back to export, if it did

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def fingerprint(self) -> str:
        """Hash of the block structure and parameter shapes (not values, not batch size)."""
        h = hashlib.sha256()
        h.update(self.tracer.encode())
        for name, p in sorted(self.gm.named_parameters(remove_duplicate=False)):
            h.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
        for b in self.blocks:
            h.update(f"{b.name}:{','.join(b.nodes)};".encode())
        return h.hexdigest()[:16]


def trace_model(
    model: nn.Module,
    inputs: Any,
    *,
    micro_batch_size: int,
    tracer: str = "auto",
    leaf_modules: Sequence[str] = (),
    max_blocks: int | None = None,
    source: Path | None = None,
) -> TracedModel:
    """Trace ``model`` on ``inputs`` (one micro-batch of ``micro_batch_size``) into blocks.

    ``source`` is the user's model file: errors point at its lines first.
    """
    if tracer not in TRACERS:
        raise TraceError(f"unknown tracer {tracer!r}; use one of: {', '.join(TRACERS)}")
    if micro_batch_size < 1:
        raise TraceError(f"micro-batch size must be at least 1 (got {micro_batch_size})")
    if max_blocks is not None and max_blocks < 1:
        raise TraceError(f"--blocks must be at least 1 (got {max_blocks})")
    _check_leaf_names(model, leaf_modules)
    with _buffers_kept(model):
        return _trace(model, inputs, micro_batch_size, tracer, leaf_modules, max_blocks, source)


@contextlib.contextmanager
def _buffers_kept(model: nn.Module) -> Iterator[None]:
    """Tracing runs the model (shape propagation), which would bump BatchNorm's running
    statistics; put every buffer back as it was, so the user's model is left bit for bit."""
    saved = [(b, b.clone()) for b in model.buffers() if not b.is_meta]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, copy in saved:
                b.copy_(copy)


def _trace(
    model: nn.Module,
    inputs: Any,
    micro_batch_size: int,
    tracer: str,
    leaf_modules: Sequence[str],
    max_blocks: int | None,
    source: Path | None,
) -> TracedModel:
    gm: torch.fx.GraphModule | None = None
    used, reason = tracer, ""
    errors: list[tuple[str, BaseException]] = []
    if tracer in ("auto", "fx"):
        try:
            gm = _trace_fx(model, inputs, leaf_modules)
            used = "fx"
        except Exception as e:
            errors.append(("fx", e))
            reason = _describe_failure(e, source)
    if gm is None and tracer in ("auto", "export"):
        try:
            gm = _trace_export(model, inputs)
            used = "export"
        except Exception as e:
            errors.append(("export", e))
    if gm is None:
        raise _trace_failure(errors, source)
    values = _value_infos(gm)
    keys = _node_keys(gm, model, set(leaf_modules))
    groups = _group(gm, keys, values, max_blocks)
    _fold_constants_across_blocks(gm, groups, values)
    blocks, block_of, shared = _make_blocks(gm, model, groups)
    graph = _block_graph(gm, blocks, block_of, values)
    return TracedModel(
        gm=gm,
        tracer=used,
        micro_batch_size=micro_batch_size,
        blocks=blocks,
        block_of=block_of,
        values=values,
        input_names=tuple(n.name for n in gm.graph.nodes if n.op == "placeholder"),
        shared_params=shared,
        graph=graph,
        fallback_reason=reason if used == "export" and tracer == "auto" else "",
    )


# --------------------------------------------------------------------------- tracers


def _trace_fx(model: nn.Module, inputs: Any, leaf_modules: Sequence[str]) -> torch.fx.GraphModule:
    leaves = set(leaf_modules)

    class _Tracer(torch.fx.Tracer):
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return type(m).__name__ in leaves or super().is_leaf_module(m, qualname)

    concrete: dict[str, Any] | None = None
    if isinstance(inputs, dict):
        # Keyword inputs: trace only the arguments that are given.
        import inspect

        params = inspect.signature(model.forward).parameters
        concrete = {k: None for k in params if k not in inputs and params[k].default is not inspect.Parameter.empty}
    graph = _Tracer().trace(model, concrete_args=concrete)
    gm = torch.fx.GraphModule(model, graph)
    _propagate_shapes(gm, inputs)
    return gm


def _propagate_shapes(gm: torch.fx.GraphModule, inputs: Any) -> None:
    """Record each node's value in ``node.meta['val']``: fake tensors first, a real run if not."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    args = _flat_args(gm, inputs)
    if any(isinstance(a, torch.Tensor) and a.is_meta for a in args):
        # Meta tensors carry shapes only: running the graph on them is shape propagation,
        # and three times faster than fake tensors (a 175B GPT in under two seconds).
        _RecordValues(gm).run(*args)
        return
    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        FakeTensorProp(gm, mode).propagate(*fake_args)
    except Exception:
        # Data-dependent leaf modules cannot run on fake tensors: run them for real.
        _RecordValues(gm).run(*args)


class _RecordValues(torch.fx.Interpreter):
    def run_node(self, n: torch.fx.Node) -> Any:
        with torch.no_grad():
            result = super().run_node(n)
        n.meta["val"] = result
        return result


def _flat_args(gm: torch.fx.GraphModule, inputs: Any) -> list[Any]:
    names = [n.target for n in gm.graph.nodes if n.op == "placeholder"]
    if isinstance(inputs, dict):
        return [inputs.get(str(name).lstrip("*")) for name in names]
    if isinstance(inputs, (tuple, list)):
        return list(inputs)
    return [inputs]


def _trace_export(model: nn.Module, inputs: Any) -> torch.fx.GraphModule:
    args = () if isinstance(inputs, dict) else tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    kwargs = inputs if isinstance(inputs, dict) else None
    with _quiet_torch():
        ep = torch.export.export(model, args, kwargs=kwargs, strict=False)
    gm = ep.module(check_guards=False)
    # The unlifted module wraps the graph in pytree flattening; keep the flat graph only.
    flat = torch.fx.GraphModule(gm, gm.graph)
    flat.graph._codegen = torch.fx.graph.CodeGen()
    for node in list(flat.graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            flat.graph.erase_node(node)
    flat.graph.eliminate_dead_code()
    flat.recompile()
    return flat


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """Silence torch's own log lines and warnings while exporting (errors still raise)."""
    names = [n for n in logging.root.manager.loggerDict if n == "torch" or n.startswith("torch.")]
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        # torch.export prints the partial graph to stderr when it fails; the error says enough.
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _check_leaf_names(model: nn.Module, leaf_modules: Sequence[str]) -> None:
    classes = {type(m).__name__ for m in model.modules()}
    for name in leaf_modules:
        if name not in classes:
            some = ", ".join(sorted(classes)[:8])
            raise TraceError(f"--leaf {name}: the model has no module of that class (it has: {some}, ...)")


def _describe_failure(e: BaseException, source: Path | None) -> str:
    frame = _innermost_frame(e, source)
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    where = f" at {frame}" if frame else ""
    return f"{type(e).__name__}{where}: {first[:200]}"


def _innermost_frame(e: BaseException, source: Path | None) -> str | None:
    """file:line of the innermost frame in ``source``, else outside torch (a library's code)."""
    torch_dir = str(Path(torch.__file__).parent)
    here = str(Path(__file__).parent)
    in_source, outside = None, None
    for fs in traceback.extract_tb(e.__traceback__):
        if source is not None and Path(fs.filename).resolve() == source.resolve():
            in_source = f"{source}:{fs.lineno}"
        elif not fs.filename.startswith((torch_dir, here, "<")):
            outside = f"{fs.filename}:{fs.lineno}"
    return in_source or outside


def _trace_failure(errors: list[tuple[str, BaseException]], source: Path | None) -> TraceError:
    parts = [f"{name}: {_describe_failure(e, source)}" for name, e in errors]
    module = _failing_module(errors)
    hint = (
        f"make the module whose forward breaks tracing a leaf, e.g. --leaf {module} (it then stays whole on one stage)"
        if module
        else "make the module whose forward breaks tracing a leaf with --leaf ClassName (it then stays whole on one stage)"
    )
    return TraceError(f"could not trace the model ({'; '.join(parts)}); {hint}")


def _failing_module(errors: list[tuple[str, BaseException]]) -> str | None:
    """Class name of the innermost nn.Module whose forward was running when tracing failed."""
    for _name, e in errors:
        tb = e.__traceback__
        found = None
        while tb is not None:
            frame = tb.tb_frame
            self_obj = frame.f_locals.get("self")
            if isinstance(self_obj, nn.Module) and frame.f_code.co_name == "forward":
                found = type(self_obj).__name__
            tb = tb.tb_next
        if found:
            return found
    return None


# --------------------------------------------------------------------------- values


def _value_infos(gm: torch.fx.GraphModule) -> dict[str, ValueInfo]:
    out = {}
    for n in gm.graph.nodes:
        v = n.meta.get("val", n.meta.get("example_value"))
        if isinstance(v, torch.Tensor):
            out[n.name] = ValueInfo(tuple(int(s) for s in v.shape), str(v.dtype).removeprefix("torch."), _nbytes(v), True)
        else:
            leaves = [t for t in torch.utils._pytree.tree_leaves(v) if isinstance(t, torch.Tensor)]
            out[n.name] = ValueInfo((), "", sum(_nbytes(t) for t in leaves), False)
    return out


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel()) * t.element_size()


# --------------------------------------------------------------------------- blocks


def _module_path(node: torch.fx.Node) -> list[str]:
    stack = node.meta.get("nn_module_stack") or {}
    path = []
    for v in stack.values():
        p = v[0] if isinstance(v, tuple) else str(v)
        if p and not p.startswith("_empty_nn_module_stack") and p not in path:
            path.append(p)
    if node.op == "call_module" and str(node.target) not in path:
        path.append(str(node.target))
    return path


def _node_keys(gm: torch.fx.GraphModule, model: nn.Module, leaves: set[str]) -> dict[str, str | None]:
    """For each compute node: the module path of the block it belongs to (None: loose op)."""
    modules = dict(model.named_modules())
    layers = {
        f"{name}.{child}" if name else child
        for name, m in modules.items()
        if isinstance(m, _CONTAINERS) and len(m._modules) >= 2
        for child in m._modules
    }
    holds_layers = {p for layer in layers for p in _prefixes(layer)[:-1]}
    keys: dict[str, str | None] = {}
    for n in gm.graph.nodes:
        if n.op not in _COMPUTE_OPS:
            continue
        key = None
        for p in _module_path(n):
            m = modules.get(p)
            if m is None:
                continue
            if type(m).__name__ in leaves:
                key = p
                break
            if p in layers and not (isinstance(m, _CONTAINERS) and p in holds_layers):
                key = p
                break
            if p not in holds_layers:
                key = p
                break
        keys[n.name] = key
    return keys


def _prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _group(
    gm: torch.fx.GraphModule, keys: dict[str, str | None], values: dict[str, ValueInfo], max_blocks: int | None
) -> list[tuple[str, list[torch.fx.Node]]]:
    """Runs of consecutive nodes with one key; loose ops and tiny modules join a neighbour."""
    groups: list[tuple[str | None, list[torch.fx.Node]]] = []
    owner: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op not in _COMPUTE_OPS:
            continue
        key = keys[n.name]
        # Unpacking a tuple stays with the node that made the tuple, so only tensors cross.
        if n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node) and n.args[0].name in owner:
            if not values[n.args[0].name].is_tensor:
                groups[owner[n.args[0].name]][1].append(n)
                owner[n.name] = owner[n.args[0].name]
                continue
        if groups and groups[-1][0] == key:
            groups[-1][1].append(n)
        else:
            groups.append((key, [n]))
        owner[n.name] = len(groups) - 1
    # Loose runs join the block before them (or after, at the start).
    merged: list[tuple[str, list[torch.fx.Node]]] = []
    pending: list[torch.fx.Node] = []
    for key, nodes in groups:
        if key is None or (merged and _is_tiny(gm, nodes) and merged[-1][0] != key):
            if merged:
                merged[-1][1].extend(nodes)
            else:
                pending.extend(nodes)
            continue
        if merged and merged[-1][0] == key:
            merged[-1][1].extend(pending + nodes)
        else:
            merged.append((key, pending + nodes))
        pending = []
    if pending:
        if merged:
            merged[-1][1].extend(pending)
        else:
            merged.append(("model", pending))
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    for _, nodes in merged:
        nodes.sort(key=lambda n: order[n.name])
    limit = min(max_blocks or _MAX_BLOCKS, _MAX_BLOCKS)
    return _merge_to(merged, limit)


def _is_tiny(gm: torch.fx.GraphModule, nodes: list[torch.fx.Node]) -> bool:
    """A parameter-free run of at most two ops (an activation, a pool, a dropout)."""
    if len(nodes) > 2:
        return False
    for n in nodes:
        if n.op == "call_module" and any(True for _ in gm.get_submodule(str(n.target)).parameters()):
            return False
        if any(isinstance(a, torch.fx.Node) and a.op == "get_attr" for a in n.all_input_nodes):
            return False
    return True


def _merge_to(groups: list[tuple[str, list[torch.fx.Node]]], limit: int) -> list[tuple[str, list[torch.fx.Node]]]:
    """Merge neighbours (the smallest pair first) until there are at most ``limit`` groups."""
    groups = [(k, list(v)) for k, v in groups]
    while len(groups) > limit:
        sizes = [len(groups[i][1]) + len(groups[i + 1][1]) for i in range(len(groups) - 1)]
        i = sizes.index(min(sizes))
        a, b = groups[i], groups[i + 1]
        groups[i : i + 2] = [(_join_names(a[0], b[0]), a[1] + b[1])]
    return groups


def _join_names(a: str, b: str) -> str:
    first = a.split("..")[0]
    last = b.split("..")[-1]
    return first if first == last else f"{first}..{last}"


def _fold_constants_across_blocks(
    gm: torch.fx.GraphModule, groups: list[tuple[str, list[torch.fx.Node]]], values: dict[str, ValueInfo]
) -> None:
    """Replace non-tensor values (sizes, dtypes) used in another block by their constant."""
    where = {n.name: i for i, (_, nodes) in enumerate(groups) for n in nodes}
    changed = False
    for i, (_, nodes) in enumerate(groups):
        for n in nodes:
            if values[n.name].is_tensor:
                continue
            v = n.meta.get("val")
            for user in list(n.users):
                if user.name in where and where[user.name] != i and _is_constant(v):
                    user.args = torch.fx.node.map_arg(user.args, lambda a, n=n, v=v: v if a is n else a)  # type: ignore[misc]
                    user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda a, n=n, v=v: v if a is n else a)  # type: ignore[misc]
                    changed = True
    if changed:
        for _, nodes in groups:
            nodes[:] = [n for n in nodes if n.users or n.op != "call_function" or not _is_pure_size(n)]
        gm.graph.eliminate_dead_code()
        gm.recompile()
        alive = {n.name for n in gm.graph.nodes}
        for _, nodes in groups:
            nodes[:] = [n for n in nodes if n.name in alive]


def _is_pure_size(n: torch.fx.Node) -> bool:
    return n.target in (getattr, operator.getitem) or str(n.target).startswith("aten.sym_size")


def _is_constant(v: Any) -> bool:
    if isinstance(v, (bool, int, float, str, torch.dtype, torch.device, type(None))):
        return True
    if isinstance(v, (tuple, list, torch.Size)):
        return all(_is_constant(x) for x in v)
    return False


def _make_blocks(
    gm: torch.fx.GraphModule, model: nn.Module, groups: list[tuple[str, list[torch.fx.Node]]]
) -> tuple[tuple[Block, ...], dict[str, int], tuple[tuple[str, tuple[int, ...]], ...]]:
    modules = dict(model.named_modules())
    param_ids = {id(p): name for name, p in gm.named_parameters()}
    block_of: dict[str, int] = {}
    users: dict[str, list[int]] = {}
    seen_names: dict[str, int] = {}
    names = []
    for i, (key, nodes) in enumerate(groups):
        count = seen_names.get(key, 0)
        seen_names[key] = count + 1
        names.append(key if count == 0 else f"{key}@{count}")
        for n in nodes:
            block_of[n.name] = i
            for p in _params_of(gm, n):
                name = param_ids.get(id(p))
                if name is not None and i not in users.setdefault(name, []):
                    users[name].append(i)
    owned: dict[int, list[str]] = {}
    for name, bs in users.items():
        owned.setdefault(bs[0], []).append(name)
    blocks = tuple(
        Block(
            index=i,
            name=names[i],
            module_type=type(modules[key]).__name__ if key in modules else "",
            nodes=tuple(n.name for n in nodes),
            params=tuple(sorted(owned.get(i, []))),
        )
        for i, (key, nodes) in enumerate(groups)
    )
    shared = tuple(sorted((name, tuple(bs)) for name, bs in users.items() if len(bs) > 1))
    return blocks, block_of, shared


def _params_of(gm: torch.fx.GraphModule, n: torch.fx.Node) -> list[nn.Parameter]:
    found: list[nn.Parameter] = []
    if n.op == "call_module":
        found.extend(gm.get_submodule(str(n.target)).parameters())
    for a in n.all_input_nodes:
        if a.op == "get_attr":
            v = _fetch_attr(gm, str(a.target))
            if isinstance(v, nn.Parameter):
                found.append(v)
    return found


def _fetch_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _block_graph(
    gm: torch.fx.GraphModule, blocks: tuple[Block, ...], block_of: dict[str, int], values: dict[str, ValueInfo]
) -> nx.DiGraph:
    """Blocks as a DAG; an edge i -> j carries the tensors made in i and read in j, with bytes."""
    g = nx.DiGraph()
    for b in blocks:
        g.add_node(b.index, name=b.name)
    for n in gm.graph.nodes:
        src = block_of.get(n.name, -1) if n.op != "placeholder" else -1
        if n.op not in _COMPUTE_OPS and n.op != "placeholder":
            continue
        for dst in sorted({block_of[u.name] for u in n.users if u.name in block_of}):
            if dst == src or src < -1:
                continue
            if src >= 0:
                if not g.has_edge(src, dst):
                    g.add_edge(src, dst, bytes=0, tensors=[])
                g.edges[src, dst]["bytes"] += values[n.name].bytes
                g.edges[src, dst]["tensors"].append(n.name)
    return g
