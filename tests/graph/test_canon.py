"""autopipe.graph.canon: node keys that ignore names, a trace relabelled to another's naming, and
the hash-order fixture's traces under two PYTHONHASHSEEDs (subprocesses) split alike once relabelled."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch import nn

from autopipe.errors import RankMismatchError
from autopipe.graph.canon import reference_nodes, relabel, structural_keys
from autopipe.graph.recipe import TraceRecipe
from autopipe.graph.trace import TracedModel, trace_model
from tests.helpers import FIXTURES, even_plan

ROOT = Path(__file__).resolve().parents[2]


class Tables(nn.Module):
    """Two same-shaped tables made in ``order`` (as a set's order would), read by two layers."""

    def __init__(self, order: tuple[str, ...], scale: float = 2.0) -> None:
        super().__init__()
        self.order, self.scale = order, scale
        self.register_buffer("freq_a", torch.linspace(0.1, 1.0, 4))
        self.register_buffer("freq_b", torch.linspace(0.2, 2.0, 4))
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tables = {k: (x * getattr(self, f"freq_{k}") * self.scale).cos() for k in self.order}
        for layer, k in zip(self.layers, ("a", "b"), strict=True):
            x = layer(x) + tables[k]
        return x


def _trace(order: tuple[str, ...], scale: float = 2.0) -> TracedModel:
    torch.manual_seed(0)
    return trace_model(Tables(order, scale), torch.randn(2, 4), micro_batch_size=2, recipe=TraceRecipe(tracer="fx"))


def _meaning(traced: TracedModel) -> dict[str, str]:
    return structural_keys(traced.gm, {n: str(b) for n, b in traced.block_of.items()})


def test_keys_ignore_names_and_tell_constants_and_targets_apart() -> None:
    ab, ba = _trace(("a", "b")), _trace(("b", "a"))
    assert Counter(_meaning(ab).values()) == Counter(_meaning(ba).values())  # the same computations
    assert _meaning(ab)["cos"] != _meaning(ba)["cos"]  # ... named in another order
    assert _meaning(ab)["cos"] == _meaning(ba)["cos_1"]
    assert set(_meaning(ab).values()) != set(_meaning(_trace(("a", "b"), scale=3.0)).values())  # a constant

    before = _meaning(ab)
    with torch.no_grad():
        ab.gm.get_submodule("layers.0").weight.add_(
            1.0
        )  # a rank may load its own stages' weights before the first step
        ab.gm.get_buffer("freq_a").add_(1.0)
    assert _meaning(ab) == before

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1

    def g(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) + 1

    kf, kg = (structural_keys(torch.fx.symbolic_trace(h)) for h in (f, g))
    assert kf["x"] == kg["x"] and kf["relu"] != kg["tanh"] and kf["add"] != kg["add"]  # a target, and what follows
    assert all(" at 0x" not in k for k in kf.values())


def test_twin_computations_are_told_apart_by_their_order() -> None:
    def twins(x: torch.Tensor) -> torch.Tensor:
        return (x + 1) * (x + 1)

    keys = structural_keys(torch.fx.symbolic_trace(twins))
    assert keys["add_1"] == keys["add"] + "#1" and len(set(keys.values())) == len(keys)


def test_relabel_renames_reorders_and_round_trips() -> None:
    ab, ba = _trace(("a", "b")), _trace(("b", "a"))
    assert relabel(ab, reference_nodes(ab), rank=1) is ab  # named alike already: the same object
    moved = relabel(ba, reference_nodes(ab), rank=1)
    assert [n for n, _, _ in reference_nodes(moved)] == [n for n, _, _ in reference_nodes(ab)]
    assert reference_nodes(moved) == reference_nodes(ab)
    assert moved.fingerprint() == ab.fingerprint() and moved.input_names == ab.input_names
    assert [b.nodes for b in moved.blocks] == [b.nodes for b in ab.blocks]
    assert moved.block_of == ab.block_of and moved.edges == ab.edges
    assert set(moved.values) >= set(moved.block_of)
    for name in moved.block_of:
        assert moved.values[name] == ab.values[name]
    x = torch.randn(2, 4)
    assert torch.equal(moved.gm(x), ba.gm(x)) and torch.equal(moved.gm(x), ab.gm(x))
    assert {id(p) for p in moved.gm.parameters()} == {id(p) for p in ba.gm.parameters()}  # the model's own
    back = relabel(moved, reference_nodes(ba), rank=1)
    assert reference_nodes(back) == reference_nodes(ba)


def test_another_model_gets_one_line_naming_the_node() -> None:
    ab, other = _trace(("a", "b")), _trace(("a", "b"), scale=3.0)
    with pytest.raises(RankMismatchError) as e:
        relabel(other, reference_nodes(ab), rank=1)
    msg = str(e.value)
    assert msg.startswith("rank 1 traced another model than rank 0 (rank 0's node mul_1 = call_function ")
    assert msg.endswith("build the model the same way on every rank (same file, arguments, code and library versions)")
    assert "\n" not in msg


# ---------------------------------------------------------------------- two hash seeds

_PROBE = """
import pickle, sys
from autopipe.graph.canon import reference_nodes, relabel, structural_keys
from autopipe.model.load import load_model
from autopipe.plans import Plan
from autopipe.stages.rebuild import rebuild_model, trace_for_plan
from autopipe.stages.split import split_model

plan, out = Plan.load(sys.argv[1]), sys.argv[2]
loaded = rebuild_model(plan)
traced = trace_for_plan(plan, loaded.model, loaded.make_inputs(plan.micro_batch_size))

def stages(t):
    meaning = structural_keys(t.gm, {n: str(b) for n, b in t.block_of.items()})
    split = split_model(t, plan)
    return [
        (
            st.inputs,
            st.outputs,
            [meaning.get(n) for n in st.inputs],
            [meaning.get(n) for n in st.outputs],
            sorted(structural_keys(st.module).values()),
        )
        for st in split.stages
    ]

got = {"nodes": reference_nodes(traced), "raw": stages(traced)}
if len(sys.argv) > 3:
    with open(sys.argv[3], "rb") as f:
        got["relabelled"] = stages(relabel(traced, pickle.load(f)["nodes"], rank=1))
with open(out, "wb") as f:
    pickle.dump(got, f)
"""


def _probe(seed: int, plan: Path, out: Path, reference: Path | None = None) -> dict[str, list[object]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": str(seed)}
    cmd = [sys.executable, "-c", _PROBE, str(plan), str(out), *([str(reference)] if reference else [])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out, "rb") as f:
        loaded: dict[str, list[object]] = pickle.load(f)
    return loaded


@pytest.mark.slow
def test_two_hash_seeds_name_alike_once_relabelled(tmp_path: Path) -> None:
    from tests.stages.test_agree import distinct_seeds

    plan = even_plan(str(FIXTURES / "hash_order.py"), stages=2, schedule="interleaved-1f1b", virtual=2)
    plan.save(tmp_path / "plan.json")
    s0, s1 = distinct_seeds(2)
    ref = _probe(s0, tmp_path / "plan.json", tmp_path / "ref.pkl")
    other = _probe(s1, tmp_path / "plan.json", tmp_path / "other.pkl", tmp_path / "ref.pkl")
    # The bug: the same names, other meanings -- the first stage's outputs (the values sent on,
    # in graph order) are other tables under the same names.
    assert [st[1] for st in other["raw"]] == [st[1] for st in ref["raw"]]  # type: ignore[index]
    assert [st[3] for st in other["raw"]] != [st[3] for st in ref["raw"]]  # type: ignore[index]
    assert [(a, b) for a, b, _ in other["nodes"]] != [(a, b) for a, b, _ in ref["nodes"]]  # type: ignore[misc]
    # The fix: relabelled to rank 0's names, the split is rank 0's, value for value.
    assert other["relabelled"] == ref["raw"]


def test_a_model_files_own_wrapped_function_is_named_alike_on_every_load() -> None:
    """models/moe.py's torch.fx.wrap'd rms_norm lives in a module named per load
    (autopipe_user_model_<n>_moe): two loads, as two ranks make, give the same nodes."""
    from autopipe.model.load import load_model

    seen = []
    for _ in range(2):
        loaded = load_model(str(Path(__file__).resolve().parents[2] / "models" / "moe.py"))
        traced = trace_model(loaded.model, loaded.make_inputs(2), micro_batch_size=2, source=loaded.spec.path)
        seen.append(reference_nodes(traced))
    assert any("autopipe_user_model_moe.rms_norm" in what for _, _, what in seen[0])
    assert seen[0] == seen[1]
