"""``autopipe config PLAN --for megatron|torchtitan|torchtitan-0.2``: printing, -o, bad input."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from autopipe.cli.main import main

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
MLP_PLAN = str(Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "good_mlp_plan_v1.json")


def test_prints_megatron_arguments_and_a_torchtitan_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", MLP_PLAN, "--for", "megatron"]) == 0
    text = capsys.readouterr().out
    argv = [w for line in text.splitlines() if not line.startswith("#") for w in shlex.split(line)]
    assert argv[:4] == ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2"]
    assert main(["config", MLP_PLAN, "--for", "TorchTitan-0.2"]) == 0
    assert tomllib.loads(capsys.readouterr().out)["parallelism"]["pipeline_parallel_degree"] == 2
    assert main(["config", MLP_PLAN, "--for", "torchtitan"]) == 0
    recipe = capsys.readouterr().out
    assert "    config.parallelism.pipeline_parallel_degree = 2\n" in recipe
    compile(recipe, "autopipe_recipe.py", "exec")  # Python


def test_output_file_is_what_it_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", MLP_PLAN, "--for", "torchtitan"]) == 0
    printed = capsys.readouterr().out
    target = tmp_path / "my_job.py"
    target.write_text("old")
    assert main(["config", MLP_PLAN, "--for", "torchtitan", "-o", str(target)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {target}: torchtitan 0.3.0 recipe module")
    assert sorted(os.listdir(tmp_path)) == ["my_job.py"]  # no temporary left
    assert target.read_text() == printed.replace("autopipe_recipe", "my_job")  # the launch line names the file
    toml = tmp_path / "job.toml"
    assert main(["config", MLP_PLAN, "--for", "torchtitan-0.2", "-o", str(toml)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {toml}: torchtitan 0.2.x job config (TOML)")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["config", "{tmp}/none.json", "--for", "megatron"], "plan file not found: {tmp}/none.json"),
        (["config", "{tmp}/bad.json", "--for", "megatron"], "{tmp}/bad.json is not valid JSON"),
        (
            ["config", MLP_PLAN, "--for", "deepspeed"],
            "--for 'deepspeed' is not a framework autopipe writes for; "
            "use --for megatron, --for torchtitan, --for torchtitan-main or --for torchtitan-0.2",
        ),
        (["config", MLP_PLAN], "the following arguments are required: --for"),
        (["config", MLP_PLAN, "--for", "megatron", "-o", "{tmp}/no/such/x.txt"], "folder {tmp}/no/such does not exist"),
        (
            ["config", "{tmp}/flat.json", "--for", "torchtitan"],
            "has no layer list (no block named like layers.0 or blocks.0; its first block is 'fc0')",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    flat = Path(MLP_PLAN).read_text()
    for i in range(3):
        flat = flat.replace(f'"layers.{i}.0', f'"fc{i}')
    (tmp_path / "flat.json").write_text(flat)  # a plan with no layer list
    assert main([a.format(tmp=tmp_path) for a in args]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("autopipe: error: ") and message.format(tmp=tmp_path) in err[0], err
    assert captured.out == ""


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TITAN_LLAMA = str(FIXTURES / "titan_llama.py")  # named as torchtitan's llama3: tok_embeddings, layers.N, norm, output


@pytest.fixture(scope="module")
def llama_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real plan of models/llama.py (embed_tokens, layers.0-3, norm, lm_head) on 2 stages."""
    from tests.helpers import even_plan

    path = tmp_path_factory.mktemp("check") / "llama.json"
    even_plan("llama.py", ["n_layer=4"], stages=2).save(path)
    return path


@pytest.mark.parametrize("target", ["torchtitan", "torchtitan-0.2", "megatron"])
def test_check_against_the_plans_own_model_passes_unchanged(
    target: str, llama_plan: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers import MODELS

    assert main(["config", str(llama_plan), "--for", target]) == 0
    plain = capsys.readouterr().out
    assert (
        main(["config", str(llama_plan), "--for", target, "--check", str(MODELS / "llama.py"), "-k", "n_layer=4"]) == 0
    )
    assert capsys.readouterr().out == plain


@pytest.mark.parametrize(
    ("target", "model", "kwargs", "message"),
    [
        (  # the case: a plan of models/llama.py fed to torchtitan's llama3
            "torchtitan",
            TITAN_LLAMA,
            [],
            "--check {model}: the config names embed_tokens, lm_head, which the model has no module for "
            "(it has tok_embeddings, layers.0 .. layers.3, norm, output); plan this model, or map the names",
        ),
        (
            "torchtitan-0.2",
            "llama.py",
            ["-k", "n_layer=6"],
            "--check {model}: no part holds layers.4 .. layers.5, whose weights the framework would drop "
            "(it keeps only the modules a part names); plan this model, or add them to a part",
        ),
        (
            "megatron",
            "llama.py",
            ["-k", "n_layer=6"],
            "--check {model}: the config has --num-layers 4 but the model has 6 layers in layers; "
            "plan this model with the -k arguments you train it with",
        ),
        (
            "megatron",
            "gpt.py",
            [],
            "--check {model}: the config's layers are the plan's layers, which the model has no module for "
            "(it has wte, wpe, drop, blocks, ln_f, lm_head); plan this model",
        ),
    ],
)
def test_check_against_another_model_is_one_line_exit_2_nothing_written(
    target: str,
    model: str,
    kwargs: list[str],
    message: str,
    llama_plan: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tests.helpers import MODELS

    model = model if "/" in model else str(MODELS / model)
    out = tmp_path / "job.txt"
    assert main(["config", str(llama_plan), "--for", target, "--check", model, *kwargs, "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"autopipe: error: {message.format(model=model)}"]
    assert captured.out == "" and not out.exists() and os.listdir(tmp_path) == []


def test_k_without_check_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", MLP_PLAN, "--for", "megatron", "-k", "n_layer=4"]) == 2
    assert capsys.readouterr().err.strip() == (
        "autopipe: error: -k gives the --check model's factory arguments; add --check MODEL, or drop -k"
    )


def test_a_plan_of_the_model_torchtitan_trains_passes_and_the_api_says_the_same(
    llama_plan: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from autopipe.api import check_config
    from autopipe.errors import ConfigError
    from autopipe.plans import Plan
    from tests.helpers import even_plan

    titan = tmp_path / "titan.json"
    even_plan(TITAN_LLAMA, [], stages=2).save(titan)
    assert main(["config", str(titan), "--for", "torchtitan", "--check", TITAN_LLAMA]) == 0
    assert '        ["layers.3", "norm", "output"],\n' in capsys.readouterr().out
    check_config(Plan.load(titan), TITAN_LLAMA, target="megatron")
    with pytest.raises(
        ConfigError, match="^" + re.escape(TITAN_LLAMA) + ": the config names embed_tokens, lm_head, which"
    ):
        check_config(Plan.load(llama_plan), TITAN_LLAMA, kwargs={}, target="torchtitan")
