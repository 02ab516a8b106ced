"""Train and eval stay distinct in traced graphs: mode-dependent ops read ``self.training``.

Tracing runs the model once, in whatever mode it is in, and records the mode as a constant:
``torch.export`` writes ``aten.dropout(x, 0.1, True)`` and ``aten.batch_norm(..., True, ...)``;
``torch.fx`` records ``F.dropout(x, p=0.1, training=True)`` for a functional dropout (dropout
*modules* stay modules under fx and follow ``.eval()`` on their own). A stage cut from such a
graph would drop out in eval mode too. :func:`follow_training` rewrites every such flag into one
``get_attr`` of ``training``, so the generated code reads::

    training = self.training
    dropout = torch.ops.aten.dropout.default(linear, 0.1, training)

and the graph module, every stage split from it and every emitted stage honour
``.train()`` / ``.eval()`` as the original model does. The graph module takes the model's
mode, so a trace computes what the model computed. (``get_attr`` nodes are not compute nodes:
blocks, and so plans and fingerprints, are unchanged.)

Attention written ``sdpa(q, k, v, dropout_p=p if self.training else 0.0)`` (Hugging Face's
SDPA attention) leaves a plain ``p`` in the graph. :func:`follow_training_attention` makes it
``training * p`` -- a new op, so it is applied to the stage modules a plan is split into (a
plan's own trace, its blocks and fingerprint stay as they were). Not covered: BatchNorm's
``num_batches_tracked += 1`` still counts in eval mode (it changes no output unless
``momentum=None``).

Tests: tests/graph/test_trace.py.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch import nn

__all__ = ["TRAINING_ATTR", "follow_training", "follow_training_attention"]

TRAINING_ATTR = "training"

_aten = torch.ops.aten
# op -> index of its ``train`` argument (positional)
_FLAG_ARG = {
    _aten.dropout.default: 2,
    _aten.feature_dropout.default: 2,
    _aten.alpha_dropout.default: 2,
    _aten.feature_alpha_dropout.default: 2,
    _aten.native_dropout.default: 2,
    _aten.batch_norm.default: 5,
}
_FUNCTIONAL = {  # torch.nn.functional -> its keyword
    nn.functional.dropout: "training",
    nn.functional.dropout1d: "training",
    nn.functional.dropout2d: "training",
    nn.functional.dropout3d: "training",
    nn.functional.alpha_dropout: "training",
    nn.functional.feature_alpha_dropout: "training",
}


def follow_training(gm: torch.fx.GraphModule, training: bool) -> int:
    """Make ``gm``'s mode-dependent ops read ``self.training``; put ``gm`` in mode ``training``.

    Returns the number of ops rewritten (and recompiles ``gm`` when there are any).
    """
    gm.train(training)
    flag: torch.fx.Node | None = None
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        index = _FLAG_ARG.get(node.target)
        if index is not None and len(node.args) > index and isinstance(node.args[index], bool):
            if node.target is _aten.batch_norm.default and node.args[3] is None:
                continue  # no running statistics: batch statistics in both modes
            flag = flag or _flag_node(gm)
            node.args = (*node.args[:index], flag, *node.args[index + 1 :])
            count += 1
        key = _FUNCTIONAL.get(node.target)
        if key is not None and isinstance(node.kwargs.get(key), bool):
            flag = flag or _flag_node(gm)
            node.kwargs = {**node.kwargs, key: flag}
            count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count


def _flag_node(gm: torch.fx.GraphModule) -> torch.fx.Node:
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    with gm.graph.inserting_before(first):
        # create_node, not get_attr: a bool is no parameter, buffer or module, and that is fine.
        return gm.graph.create_node("get_attr", TRAINING_ATTR, name=TRAINING_ATTR)


_SDPA = (_aten.scaled_dot_product_attention.default,)


def follow_training_attention(gm: torch.fx.GraphModule) -> int:
    """Make every SDPA's literal ``dropout_p > 0`` read ``self.training * dropout_p`` (see above);
    the number of ops rewritten (``gm`` is recompiled when there are any)."""
    flag = next((n for n in gm.graph.nodes if n.op == "get_attr" and n.target == TRAINING_ATTR), None)
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _SDPA:
            continue
        in_args = len(node.args) > 4
        p = node.args[4] if in_args else node.kwargs.get("dropout_p", 0.0)
        if not isinstance(p, float) or p <= 0.0:
            continue
        if flag is None:
            flag = _flag_node(gm)
        elif count == 0:  # made where a dropout first needed it: move it before every use
            first = next(n for n in gm.graph.nodes if n.op != "placeholder")
            if first is not flag:
                first.prepend(flag)
        with gm.graph.inserting_before(node):
            scaled = gm.graph.call_function(operator.mul, (flag, p))
        if in_args:
            node.args = (*node.args[:4], scaled, *node.args[5:])
        else:
            node.kwargs = {**node.kwargs, "dropout_p": scaled}
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
