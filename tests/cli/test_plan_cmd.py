"""``autopipe plan`` only parses and prints: its Namespace is read, never changed, and the
reasons an S x D split was refused are read from values, not from error text."""

from __future__ import annotations

import copy
import io
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import build_parser
from autopipe.cli.plan_cmd import _short, cmd_plan
from rich.console import Console

from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.graph.recipe import TraceRecipe
from autopipe.solve.parallel import Rejected

GIB = 2.0**30


def block(i: int) -> BlockCost:
    return BlockCost(
        name=f"layers.{i}", nodes=(f"n{i}",), params=1000, param_bytes=4000, forward_s=Affine(1e-5, 1e-3),
        backward_s=Affine(2e-5, 2e-3), backward_input_s=Affine(1e-5, 1e-3), backward_weight_s=Affine(1e-5, 1e-3),
        saved_bytes=Affine(0.0, 2.0**20),
    )  # fmt: skip


def chain(n: int = 4) -> Profile:
    blocks = tuple(block(i) for i in range(n))
    tensors = tuple(TensorCost(f"n{i}", i, (i + 1,), Affine(0.0, 2.0**20)) for i in range(n - 1))
    return Profile(
        model="chain", recipe=TraceRecipe(tracer="fx", fingerprint="fp"), device="cpu (1 threads)", torch_version=torch.__version__,
        dtype="float32", micro_batch_sizes=(1, 2), method="measured", blocks=blocks, tensors=tensors,
    )  # fmt: skip


def test_cmd_plan_leaves_its_namespace_alone(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    chain().save(path)
    args = build_parser().parse_args(
        ["plan", "--profile", str(path), "--stages", "2", "--memory", "1GiB", "--batch-size", "8", "-o", str(tmp_path / "p.json")]
    )
    before = copy.deepcopy(vars(args))
    quiet = Console(file=io.StringIO(), width=120)
    assert cmd_plan(args, quiet, quiet) == 0
    assert vars(args) == before
    assert (tmp_path / "p.json").is_file()


@pytest.mark.parametrize(
    ("rejected", "short"),
    [
        (Rejected(4, 2, "no plan of 4 blocks on 4 devices fits 1.0 GiB per device; ...", 3 * GIB), "needs 3.0 GiB"),
        (Rejected(4, 2, "no plan of 4 blocks on 4 devices fits 1.0 GiB per device"), "no plan of 4 blocks on 4 devices fits 1.0 GiB"),
        (Rejected(8, 1, "8 stages but the model has 4 blocks"), "8 stages but the model has 4 blocks"),
    ],
)
def test_a_refused_split_says_the_memory_it_needs(rejected: Rejected, short: str) -> None:
    assert _short(rejected) == short

