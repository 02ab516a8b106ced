"""``Pipeline.step`` holds every batch to the example it was traced with: a wrong number of inputs,
a type, dtype or shape other than the example's is one BatchError line naming the expected shape;
``autopipe.pipeline`` checks its plan and model arguments' types first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from autopipe import pipeline
from autopipe.errors import BatchError, InputError, PlanFileError
from autopipe.model.load import load_model
from autopipe.runtime.comm import ThreadHub
from tests.runtime.helpers import GPT, cached_plan

torch.set_num_threads(1)

PLAN_MUST = "plan must be a Plan or the path of its JSON (a str or a Path)"
MODEL_MUST = "model must be the nn.Module the plan was made for (built the same on every rank)"
TOKENS = torch.zeros(8, 16, dtype=torch.int64)
WANT = "the model takes idx: (8, 16) int64"
CASES: dict[str, tuple[Callable[[], Any], str]] = {
    "a str": (lambda: "the batch", "step 0's inputs are a str; give a Tensor, a tuple of positional inputs or a "
              "dict of keyword inputs, as the model was traced with (idx: (8, 16) int64)"),
    "too wide": (lambda: torch.zeros(8, 17, dtype=torch.int64), f"step 0's inputs: idx has shape (8, 17); {WANT}"),
    "another shape": (lambda: torch.zeros(8, 4, 4, dtype=torch.int64), f"idx has shape (8, 4, 4); {WANT}"),
    "a float dtype": (lambda: TOKENS.float(), f"step 0's inputs: idx is float32; {WANT}"),
    "two inputs": (lambda: (TOKENS, TOKENS), "step 0's inputs are 2 value(s); the model takes 1: idx: (8, 16) int64"),
    "a list in a tuple": (lambda: ([[1, 2]],), "step 0's inputs are 2 value(s); the model takes 1"),
    "a dict without it": (lambda: {"tokens": TOKENS}, f"step 0's inputs: idx is a NoneType; {WANT}"),
    "a 0-dim tensor": (lambda: torch.tensor(3), f"step 0's inputs: idx is a 0-dim tensor; {WANT}"),
}  # fmt: skip  # reason: one case per entry, its message whole


@pytest.fixture(scope="module")
def pipe() -> Any:
    torch.manual_seed(0)
    lm = load_model(GPT[0], GPT[1])
    plan = cached_plan("gpt", 2, "1f1b")
    return pipeline(plan, lm.model, rank=0, comm=lambda g: ThreadHub(2, 1.0).comm(0), example_inputs=lm.make_inputs(2))


@pytest.mark.parametrize("cause", sorted(CASES))
def test_a_batch_unlike_the_example_is_one_line(pipe: Any, cause: str) -> None:
    make, said = CASES[cause]
    with pytest.raises(BatchError) as info:
        pipe.step(make())
    assert said in str(info.value) and "\n" not in str(info.value)
    assert isinstance(info.value, InputError)


@pytest.mark.parametrize(
    ("plan", "model", "error", "said"),
    [
        (None, torch.nn.Linear(2, 2), PlanFileError, f"{PLAN_MUST}, not None"),
        (3, torch.nn.Linear(2, 2), PlanFileError, f"{PLAN_MUST}, not an int"),
        ("plan.json", None, InputError, f"{MODEL_MUST}, not None"),
    ],
)  # fmt: skip  # reason: one case a line, its message whole
def test_pipeline_arguments_are_checked(plan: Any, model: Any, error: type[Exception], said: str) -> None:
    with pytest.raises(error) as info:
        pipeline(plan, model)
    assert str(info.value) == said
