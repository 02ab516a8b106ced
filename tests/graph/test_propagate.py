"""Meta shape propagation that runs repeated leaf-module calls once: the same values and the
same counts as running every node."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import autopipe.graph.trace as trace_module
from autopipe.costs.analytic import count_model
from autopipe.graph.propagate import MetaShapes
from autopipe.model.load import load_model
from tests.helpers import MODELS

torch.set_num_threads(1)


class _EveryNode(torch.fx.Interpreter):
    """The reference: every node run (what the tracer did before)."""

    def run_node(self, n: torch.fx.Node) -> Any:
        with torch.no_grad():
            result = super().run_node(n)
        n.meta["val"] = result
        return result


def _layouts(counts: Any) -> list[Any]:
    out = []
    for traced in counts.traces:
        for n in traced.gm.graph.nodes:
            v = n.meta.get("val")
            out.append(
                (
                    n.name,
                    (tuple(v.shape), v.stride(), v.storage_offset(), v.dtype)
                    if isinstance(v, torch.Tensor)
                    else repr(v),
                )
            )
    return out


@pytest.mark.parametrize(
    ("model", "kwargs"), [("llama.py", {"preset": "tiny"}), ("gpt.py", {"preset": "tiny", "n_layer": 3})]
)
def test_counts_and_values_equal_running_every_node(
    model: str, kwargs: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = load_model(str(MODELS / model), kwargs, device="meta")
    fast = count_model(loaded, micro_batch_sizes=(2,), dtype="bf16")
    monkeypatch.setattr(trace_module, "MetaShapes", _EveryNode)
    slow = count_model(loaded, micro_batch_sizes=(2,), dtype="bf16")
    assert fast.counts == slow.counts
    assert [[b.nodes for b in t.blocks] for t in fast.traces] == [[b.nodes for b in t.blocks] for t in slow.traces]
    assert _layouts(fast) == _layouts(slow)


def test_repeated_calls_reused_and_aliasing_modules_run() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
            self.c = torch.nn.Linear(8, 4)
            self.drop = torch.nn.Dropout(0.1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(self.drop(self.b(self.drop(self.a(x)))))

    net = Net().to("meta").eval()  # eval: Dropout returns its input (shares its storage)
    gm = torch.fx.symbolic_trace(net)
    run = MetaShapes(gm)
    x = torch.empty(3, 8, device="meta")
    out = run.run(x)
    assert out.shape == (3, 4) and out.is_meta
    assert run.reused == 1  # b repeats a's call; c differs in its weight; eval dropout runs each time
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "call_module"]
    assert vals[2].shape == (3, 8) and vals[2].untyped_storage()._cdata != vals[0].untyped_storage()._cdata
    assert vals[1].untyped_storage()._cdata == vals[0].untyped_storage()._cdata  # dropout aliases a's output
