"""TraceRecipe: one value for how to rebuild and re-trace a model, carried by Profile and Plan.

The version 1 fixtures were written by ``autopipe profile`` and ``autopipe plan`` before the
recipe became one value (the recipe's fields then sat at the top level of both files)::

    autopipe profile tests/fixtures/good_mlp.py -k depth=3 --blocks 3 --micro-batch-sizes 1,2 \
        --warmup 0 --repeat 1 --device cpu -o tests/fixtures/good_mlp_profile_v1.json
    autopipe plan --profile tests/fixtures/good_mlp_profile_v1.json --stages 2 --batch-size 8 \
        -o tests/fixtures/good_mlp_plan_v1.json
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from autopipe.cli.main import main

from autopipe.costs.profile import PROFILE_VERSION, Profile
from autopipe.errors import PlanFileError, ProfileError
from autopipe.graph.recipe import TraceRecipe
from autopipe.model.spec import ModelSpec
from autopipe.plans import PLAN_VERSION, Plan
from autopipe.stages.rebuild import rebuild_model, trace_for_plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROFILE_V1 = FIXTURES / "good_mlp_profile_v1.json"
PLAN_V1 = FIXTURES / "good_mlp_plan_v1.json"
RECIPE_V1 = TraceRecipe(
    model_file="tests/fixtures/good_mlp.py",
    factory="build_model",
    model_kwargs=("depth=3",),
    tracer="fx",
    leaf_modules=(),
    max_blocks=3,
    fingerprint="7133da7b978b4017",
)


def _as_version_1(text: str) -> dict[str, Any]:
    """A version 2 file's JSON in version 1's shape: the recipe's fields back at the top level."""
    raw = json.loads(text)
    raw.update(raw.pop("recipe"))
    raw["version"] = 1
    return dict(raw)


def test_a_recipe_round_trips_through_json() -> None:
    recipe = TraceRecipe("models/gpt.py", "build_gpt", ("n_layer=4", "act='gelu'"), "export", ("MLP",), 12, "0123abcd")
    assert TraceRecipe.from_dict(json.loads(json.dumps(recipe.to_dict()))) == recipe
    assert set(recipe.to_dict()) == {
        "model_file",
        "factory",
        "model_kwargs",
        "tracer",
        "leaf_modules",
        "max_blocks",
        "fingerprint",
    }


def test_a_recipe_holds_tuples_and_names_its_model() -> None:
    recipe = TraceRecipe("models/gpt.py", "build_gpt", ["n_layer=4"], leaf_modules=["MLP"])  # type: ignore[arg-type]
    assert recipe.model_kwargs == ("n_layer=4",) and recipe.leaf_modules == ("MLP",)
    assert recipe.model_spec() == ModelSpec(Path("models/gpt.py"), "build_gpt", {"n_layer": 4})
    hash(recipe)  # a value: usable as a key


def test_traced_records_the_model_the_tracer_that_worked_and_the_fingerprint() -> None:
    asked = TraceRecipe(tracer="auto", leaf_modules=("MLP",), max_blocks=8)
    spec = ModelSpec(Path("models/gpt.py"), "build_gpt", {"n_layer": 4})
    assert asked.traced(spec, "export", "feed") == TraceRecipe(
        "models/gpt.py", "build_gpt", ("n_layer=4",), "export", ("MLP",), 8, "feed"
    )


def test_a_recipe_needs_a_fingerprint() -> None:
    with pytest.raises(KeyError):
        TraceRecipe.from_dict({"model_file": "m.py"})


def test_a_version_1_profile_loads_to_the_same_values() -> None:
    text = PROFILE_V1.read_text()
    prof = Profile.from_json(text)
    assert prof.recipe == RECIPE_V1 and prof.version == PROFILE_VERSION == 2
    assert _as_version_1(prof.to_json()) == json.loads(text)
    assert Profile.from_json(prof.to_json()) == prof  # written again as version 2, read back alike


def test_a_version_1_plan_loads_to_the_same_values_and_rebuilds() -> None:
    text = PLAN_V1.read_text()
    plan = Plan.load(PLAN_V1)
    assert plan.recipe == RECIPE_V1 and plan.version == PLAN_VERSION == 2
    written = _as_version_1(plan.to_json())
    for key in (
        "tensor_parallel",
        "sequence_parallel",
        "model_flops",
        "hardware_flops",
        "shard_optimizer",
        "target",
        "free_plan",
    ):  # added since: their defaults
        assert written.pop(key) == Plan.__dataclass_fields__[key].default
    assert written == json.loads(text)
    assert Plan.from_json(plan.to_json()) == plan
    loaded = rebuild_model(plan)  # the recipe still builds the model and traces into the plan's blocks
    traced = trace_for_plan(plan, loaded.model, loaded.make_inputs(plan.micro_batch_size))
    assert traced.fingerprint() == plan.recipe.fingerprint


def test_the_keys_users_read_stay() -> None:
    plan = json.loads(Plan.load(PLAN_V1).to_json())
    assert {"model", "schedule", "micro_batches", "stages", "recipe"} <= set(plan)
    assert all("blocks" in s for s in plan["stages"])
    prof = json.loads(Profile.load(PROFILE_V1).to_json())
    assert {"forward_s", "backward_s", "saved_bytes", "param_bytes"} <= set(prof["blocks"][0])


def test_unknown_versions_name_the_versions_read() -> None:
    with pytest.raises(ProfileError, match="reads versions 1 and 2"):
        Profile.from_json('{"version": 3}')
    with pytest.raises(PlanFileError, match="reads versions 1 and 2"):
        Plan.from_json('{"version": 3}')


def test_a_plan_made_from_a_profile_carries_its_recipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = Profile.load(PROFILE_V1)
    outputs = [tmp_path / "a.json", tmp_path / "b.json"]
    for out in outputs:
        assert main(["plan", "--profile", str(PROFILE_V1), "--stages", "2", "--batch-size", "8", "-o", str(out)]) == 0
    capsys.readouterr()
    absolute = str(Path(prof.recipe.model_file).resolve())  # outside the plan's folder: recorded absolute
    assert Plan.load(outputs[0]).recipe == dataclasses.replace(prof.recipe, model_file=absolute)
    assert json.loads(outputs[0].read_text())["recipe"] == prof.recipe.to_dict() | {
        "model_kwargs": ["depth=3"],
        "leaf_modules": [],
        "model_file": absolute,
    }
    assert outputs[0].read_bytes() == outputs[1].read_bytes()  # byte-identical for the same input
