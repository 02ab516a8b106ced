"""Trace a model into a torch.fx graph and group its nodes into blocks.

Two tracers sit behind one interface, both giving a flat ``torch.fx.GraphModule``:

- ``fx``: ``torch.fx.symbolic_trace`` — fast, keeps leaf modules whole (``leaf_modules``), but
  fails on most current Hugging Face models (``**kwargs`` forwards, item assignment on proxies).
- ``export``: ``torch.export.export(strict=False)`` — what real-world models need and what
  torch.distributed.pipelining builds on; nodes carry ``nn_module_stack`` so blocks still
  follow the user's modules.

``auto`` tries ``fx`` then ``export`` and records which one worked. Which tracer, which
modules to keep whole and how many blocks at most come in one
:class:`~autopipe.graph.recipe.TraceRecipe` (its model file and fingerprint are its callers'
business: they build the model and check what the trace hashes to). A trace is specialised to
one micro-batch size: every tensor's shape and dtype is known (export's fake values, or fake
tensor propagation for fx), and plain Python values that cross block boundaries (sizes) are
folded into constants, so only tensors flow between blocks.

The nodes are then grouped into blocks, the units the solver places on stages, following the
user's modules (``blocks.py``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch import nn

from autopipe.errors import TraceError
from autopipe.graph.blocks import Block, BlockEdge, ValueInfo, group_blocks
from autopipe.graph.propagate import MetaShapes
from autopipe.graph.recipe import DEFAULT_RECIPE, TraceRecipe
from autopipe.graph.training import follow_training
from autopipe.model.usercode import guarded, too_small_for_batchnorm

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["Block", "TracedModel", "ValueInfo", "fx_node_names", "quiet_torch", "structure_hash", "trace_model"]

TRACERS = ("auto", "fx", "export")
CREATED = "autopipe_created"  # gm.meta key: the nodes the fx tracer made, in order (see _trace_fx)


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
    edges: tuple[BlockEdge, ...]  # the block graph's edges (see ``graph``)
    fallback_reason: str = ""  # why ``auto`` fell back to export, if it did

    @functools.cached_property
    def graph(self) -> nx.DiGraph:
        """The block graph (networkx, imported when asked for); edge attrs: bytes, tensors."""
        import networkx as nx

        g = nx.DiGraph()
        for b in self.blocks:
            g.add_node(b.index, name=b.name)
        for e in self.edges:
            g.add_edge(e.src, e.dst, bytes=e.bytes, tensors=list(e.tensors))
        return g

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def fingerprint(self) -> str:
        """Hash of the block structure and parameter shapes (not values, not batch size)."""
        params = [(name, tuple(p.shape), str(p.dtype)) for name, p in self.gm.named_parameters(remove_duplicate=False)]
        return structure_hash(self.tracer, params, [(b.name, b.nodes) for b in self.blocks])


def structure_hash(
    tracer: str, params: Sequence[tuple[str, tuple[int, ...], str]], blocks: Sequence[tuple[str, Sequence[str]]]
) -> str:
    """:meth:`TracedModel.fingerprint` of a trace by ``tracer`` with ``params`` (name, shape,
    dtype; any order) and ``blocks`` (name, nodes; in order)."""
    h = hashlib.sha256()
    h.update(tracer.encode())
    for name, shape, dtype in sorted(params):
        h.update(f"{name}:{shape}:{dtype};".encode())
    for name, nodes in blocks:
        h.update(f"{name}:{','.join(nodes)};".encode())
    return h.hexdigest()[:16]


def trace_model(
    model: nn.Module,
    inputs: Any,
    *,
    micro_batch_size: int,
    recipe: TraceRecipe = DEFAULT_RECIPE,
    source: Path | None = None,
    dynamic: bool = False,
) -> TracedModel:
    """Trace ``model`` on ``inputs`` (one micro-batch of ``micro_batch_size``) into blocks.

    ``recipe`` says how: its ``tracer``, ``leaf_modules`` and ``max_blocks``. ``source`` is the
    user's model file: errors point at its lines first. ``dynamic`` (export only): the inputs'
    first two dims are symbolic where the model allows (``torch.export.Dim.AUTO``), so the
    graph computes sizes from its inputs instead of holding them as constants -- for emitted
    stages that take any micro-batch size; planning traces stay static.
    """
    tracer, leaf_modules, max_blocks = recipe.tracer, recipe.leaf_modules, recipe.max_blocks
    if tracer not in TRACERS:
        raise TraceError(f"unknown tracer {tracer!r}; use one of: {', '.join(TRACERS)}")
    if micro_batch_size < 1:
        raise TraceError(f"micro-batch size must be at least 1 (got {micro_batch_size})")
    if max_blocks is not None and max_blocks < 1:
        raise TraceError(f"--blocks must be at least 1 (got {max_blocks})")
    _check_leaf_names(model, leaf_modules)
    # untimed: tracing time grows with the model; what it raises beyond an Exception (SystemExit, a
    # BaseException of the user's) is one line too
    with guarded("the model's forward (tracing)", source or Path("<model>"), timed=False), _buffers_kept(model):
        return _trace(model, inputs, micro_batch_size, tracer, leaf_modules, max_blocks, source, dynamic)


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
    dynamic: bool = False,
) -> TracedModel:
    gm: torch.fx.GraphModule | None = None
    used, reason = tracer, ""
    errors: list[tuple[str, BaseException]] = []
    if tracer in ("auto", "fx") and not dynamic:
        try:
            gm = _trace_fx(model, inputs, leaf_modules)
            used = "fx"
        except Exception as e:
            errors.append(("fx", e))
            reason = _describe_failure(e, source)
    if gm is None and tracer in ("auto", "export"):
        try:
            gm = _trace_export(model, inputs, dynamic)
            used = "export"
        except Exception as e:
            errors.append(("export", e))
    if gm is None:
        raise _trace_failure(errors, source)
    follow_training(gm, model.training)
    g = group_blocks(gm, model, leaf_modules, max_blocks)
    return TracedModel(
        gm=gm,
        tracer=used,
        micro_batch_size=micro_batch_size,
        blocks=g.blocks,
        block_of=g.block_of,
        values=g.values,
        input_names=tuple(n.name for n in gm.graph.nodes if n.op == "placeholder"),
        shared_params=g.shared_params,
        edges=g.edges,
        fallback_reason=reason if used == "export" and tracer == "auto" else "",
    )


# --------------------------------------------------------------------------- tracers


def _trace_fx(model: nn.Module, inputs: Any, leaf_modules: Sequence[str]) -> torch.fx.GraphModule:
    graph, created = _fx_graph(model, inputs, leaf_modules)
    gm = torch.fx.GraphModule(model, graph)
    gm.meta[CREATED] = created  # graph.shallow names a deeper graph from it
    _propagate_shapes(gm, inputs)
    return gm


def fx_node_names(model: nn.Module, inputs: Any, leaf_modules: Sequence[str] = ()) -> tuple[str, ...] | None:
    """The names of every node the fx tracer makes for ``model``, in order (before any is
    folded or dropped), without running it; None when fx cannot trace it."""
    try:
        return tuple(name for _, _, name in _fx_graph(model, inputs, leaf_modules)[1])
    except Exception:
        return None


def _fx_graph(
    model: nn.Module, inputs: Any, leaf_modules: Sequence[str]
) -> tuple[torch.fx.Graph, tuple[tuple[str, str, str], ...]]:
    """fx's graph of ``model`` and the nodes it made: (candidate name, module path, name given)."""
    leaves = set(leaf_modules)
    created: list[tuple[str, str, str]] = []

    class _Tracer(torch.fx.Tracer):
        names: tuple[dict[int, str], dict[int, str]] | None = None  # id -> name of parameters, buffers

        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return type(m).__name__ in leaves or super().is_leaf_module(m, qualname)

        def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
            """fx's own, with the name of a parameter or buffer looked up in a table made once:
            fx walks every module of the model for each tensor attribute a forward reads, which
            takes seconds for a deep model that reads its weights as attributes (a norm's
            ``self.weight``, a MoE layer's grouped experts). The first name of each tensor, as fx
            finds it; the proxies and their cache are fx's."""
            if not isinstance(attr_val, torch.Tensor):
                return super().getattr(attr, attr_val, parameter_proxy_cache)
            if self.names is None:
                params: dict[int, str] = {}
                buffers: dict[int, str] = {}
                for n, p in self.root.named_parameters():
                    params.setdefault(id(p), n)
                for n, b in self.root.named_buffers():
                    buffers.setdefault(id(b), n)
                self.names = (params, buffers)
            name = self.names[0].get(id(attr_val)) if isinstance(attr_val, nn.Parameter) else None
            if name is None and self.proxy_buffer_attributes:
                name = self.names[1].get(id(attr_val))
            if name is None:
                return attr_val
            if name not in parameter_proxy_cache:
                factory = (
                    None
                    if not self.param_shapes_constant
                    else lambda node: torch.fx.proxy.ParameterProxy(self, node, name, attr_val)  # type: ignore[arg-type]
                )
                parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {}, proxy_factory_fn=factory)
            return parameter_proxy_cache[name]

        def call_module(self, m: nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
            try:
                return super().call_module(m, forward, args, kwargs)
            except Exception as e:  # the innermost module's except runs first: it names the module
                _mark_failure(e, _path_of(self, m), m)
                raise

        def create_node(
            self, kind: str, target: Any, args: Any, kwargs: Any, name: str | None = None, type_expr: Any = None
        ) -> torch.fx.Node:
            node = super().create_node(kind, target, args, kwargs, name, type_expr)
            created.append(
                (name if name is not None else self.graph._target_to_str(target), self.scope.module_path, node.name)
            )
            return node

    concrete: dict[str, Any] | None = None
    if isinstance(inputs, dict):
        # Keyword inputs: trace only the arguments that are given.
        import inspect

        params = inspect.signature(model.forward).parameters
        concrete = {k: None for k in params if k not in inputs and params[k].default is not inspect.Parameter.empty}
    try:
        return _Tracer().trace(model, concrete_args=concrete), tuple(created)
    except Exception as e:  # failed in no submodule: in the model's own forward
        _mark_failure(e, "", model)
        raise


FAILED_IN = "_autopipe_fx_module"  # attribute of an fx failure: (module path, class, takes **kwargs)


def _mark_failure(e: BaseException, path: str, module: nn.Module) -> None:
    """Note on ``e`` the module fx was tracing when it failed, unless an inner one is noted."""
    if not hasattr(e, FAILED_IN):
        import inspect

        try:
            params = inspect.signature(module.forward).parameters.values()
            var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        except (TypeError, ValueError):
            var_kw = False
        with contextlib.suppress(AttributeError, TypeError):
            setattr(e, FAILED_IN, (path, type(module).__name__, var_kw))


def _path_of(tracer: torch.fx.Tracer, m: nn.Module) -> str:
    try:
        return tracer.path_of_module(m)
    except NameError:
        return ""


def _propagate_shapes(gm: torch.fx.GraphModule, inputs: Any) -> None:
    """Record each node's value in ``node.meta['val']``: fake tensors first, a real run if not."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    args = _flat_args(gm, inputs)
    if any(isinstance(a, torch.Tensor) and a.is_meta for a in args):
        # Meta tensors carry shapes only: running the graph on them is shape propagation,
        # and three times faster than fake tensors; repeated leaf-module calls run once.
        MetaShapes(gm).run(*args)
        return
    try:
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with quiet_torch("shapes were taken from a real run, and times are measured"):
            FakeTensorProp(gm, mode).propagate(*fake_args)
    except Exception:  # fake tensors fail with many types; the real run decides
        # Data-dependent leaf modules (and ops without a fake kernel) cannot run on fake
        # tensors: run the graph for real, whose errors do propagate.
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


def _trace_export(model: nn.Module, inputs: Any, dynamic: bool = False) -> torch.fx.GraphModule:
    args = () if isinstance(inputs, dict) else tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    kwargs = inputs if isinstance(inputs, dict) else None
    shapes = None
    if dynamic:
        auto = torch.export.Dim.AUTO

        def dims(t: Any) -> Any:
            return {d: auto for d in range(min(2, t.dim()))} if isinstance(t, torch.Tensor) else None

        shapes = tuple(torch.utils._pytree.tree_map(dims, v) for v in (*args, *(kwargs or {}).values()))
    # torch.export prints the partial graph to stderr when it fails; the error says enough.
    quiet = quiet_torch("the model's own fallback for it was traced and priced")
    with quiet, warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, args, kwargs=kwargs, strict=False, dynamic_shapes=shapes)
    gm = ep.module(check_guards=False)
    # The unlifted module wraps the graph in pytree flattening; keep the flat graph only.
    flat = torch.fx.GraphModule(gm, gm.graph)
    flat.meta["out_spec"] = getattr(gm, "_out_spec", None)  # the model's output structure
    flat.graph._codegen = torch.fx.graph.CodeGen()
    for node in list(flat.graph.nodes):
        if node.op == "call_module" and str(node.target).startswith("_guards"):
            flat.graph.erase_node(node)
    flat.graph.eliminate_dead_code()
    flat.recompile()
    return flat


META_FAILED = "failed while attempting to run meta for %s"  # torch's fake-tensor log line
log = logging.getLogger("autopipe")


class _Swallow(logging.Filter):
    """Drops every record of the logger it filters; keeps the ops whose meta kernel failed."""

    def __init__(self) -> None:
        super().__init__()
        self.failed: dict[str, str] = {}  # op -> torch's reason, first line

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == META_FAILED and isinstance(record.args, tuple) and record.args:
            error = record.exc_info[1] if record.exc_info else None
            reason = (
                str(error).strip().splitlines()[0][:160]
                if error is not None and str(error).strip()
                else "no reason given"
            )
            self.failed.setdefault(str(record.args[0]), reason)
        return False


@contextlib.contextmanager
def quiet_torch(fallback: str) -> Iterator[None]:
    """Silence torch's own log lines (fake-tensor tracebacks, dynamo, symbolic shapes, export)
    while tracing or counting; levels and filters are restored after. An op whose meta kernel
    failed is told once, as one ``autopipe`` warning: the op, torch's reason and ``fallback``
    (how it was priced instead). Errors still raise."""
    names = [n for n in logging.root.manager.loggerDict if n == "torch" or n.startswith("torch.")]
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    swallow = _Swallow()
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
        lg.addFilter(swallow)
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.ERROR)  # to see what failed
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeFilter(swallow)
            lg.setLevel(level)
        for op, reason in swallow.failed.items():
            log.warning("torch's meta kernel for %s failed (%s); %s", op, reason, fallback)


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
    failed = getattr(e, FAILED_IN, None)
    if failed is not None:
        path, cls, _ = failed
        where += f" in {path} ({cls})" if path else f" in {cls}, the model itself"
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
    for _, e in errors:  # the micro-batch, not the tracer: no --leaf helps
        if (small := too_small_for_batchnorm(e)) is not None:
            return TraceError(small)
    parts = [f"{name}: {_describe_failure(e, source)}" for name, e in errors]
    fx = [getattr(e, FAILED_IN) for name, e in errors if name == "fx" and hasattr(e, FAILED_IN)]
    if fx and len(errors) == 1:  # --tracer fx: say which module, and what to do about it
        path, cls, var_kw = fx[0]
        if not path:
            takes = ", whose forward takes **kwargs, which fx cannot trace" if var_kw else ""
            hint = f"fx fails in the model's own forward ({cls}{takes}), where no --leaf helps; use --tracer export"
        else:
            hint = f"pass --leaf {cls} to keep {path} whole on one stage, or use --tracer export"
        return TraceError(f"could not trace the model ({'; '.join(parts)}); {hint}")
    module = _failing_module(errors)
    hint = (
        f"make the module whose forward breaks tracing a leaf, e.g. --leaf {module} (it then stays whole on one stage)"
        if module
        else "make the module whose forward breaks tracing a leaf with --leaf ClassName "
        "(it then stays whole on one stage)"
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
