"""``autopipe plan`` only parses and prints: its Namespace is read, never changed, and the
reasons an S x D split was refused are read from values, not from error text."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from autopipe.cli.main import build_parser, main
from autopipe.cli.plan_cmd import _short, cmd_plan
from PIL import Image
from rich.console import Console

from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.graph.recipe import TraceRecipe
from autopipe.planner.parallel import Rejected
from autopipe.plans import Plan

GIB = 2.0**30


def block(i: int) -> BlockCost:
    return BlockCost(
        name=f"layers.{i}",
        nodes=(f"n{i}",),
        params=1000,
        param_bytes=4000,
        forward_s=Affine(1e-5, 1e-3),
        backward_s=Affine(2e-5, 2e-3),
        backward_input_s=Affine(1e-5, 1e-3),
        backward_weight_s=Affine(1e-5, 1e-3),
        saved_bytes=Affine(0.0, 2.0**20),
    )


def chain(n: int = 4) -> Profile:
    blocks = tuple(block(i) for i in range(n))
    tensors = tuple(TensorCost(f"n{i}", i, (i + 1,), Affine(0.0, 2.0**20)) for i in range(n - 1))
    return Profile(
        model="chain",
        recipe=TraceRecipe(tracer="fx", fingerprint="fp"),
        device="cpu (1 threads)",
        torch_version=torch.__version__,
        dtype="float32",
        micro_batch_sizes=(1, 2),
        method="measured",
        blocks=blocks,
        tensors=tensors,
    )


def test_cmd_plan_leaves_its_namespace_alone(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    chain().save(path)
    args = build_parser().parse_args(
        [
            "plan",
            "--profile",
            str(path),
            "--stages",
            "2",
            "--memory",
            "1GiB",
            "--batch-size",
            "8",
            "-o",
            str(tmp_path / "p.json"),
        ]
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
        (
            Rejected(4, 2, "no plan of 4 blocks on 4 devices fits 1.0 GiB per device"),
            "no plan of 4 blocks on 4 devices fits 1.0 GiB",
        ),
        (Rejected(8, 1, "8 stages but the model has 4 blocks"), "8 stages but the model has 4 blocks"),
    ],
)
def test_a_refused_split_says_the_memory_it_needs(rejected: Rejected, short: str) -> None:
    assert _short(rejected) == short


MODELS = Path(__file__).resolve().parents[2] / "models"
FAST = ["--warmup", "1", "--repeat", "2", "--micro-batch-sizes", "2,4"]


class _Profiles(dict[str, Path]):
    """Each bundled model profiled through the CLI the first time a test asks for it (the quick loop asks for few)."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def __missing__(self, name: str) -> Path:
        torch.set_num_threads(1)
        path = self.folder / f"{name}.json"
        with contextlib.redirect_stdout(io.StringIO()):  # not into the output the asking test reads
            code = main(["profile", str(MODELS / f"{name}.py"), "--batch-size", "4", "-o", str(path), "--json", *FAST])
        assert code == 0
        self[name] = path
        return path


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _Profiles(tmp_path_factory.mktemp("profiles"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt", "llama", "resnet", "unet", "mlp"])
@pytest.mark.parametrize("stages", [2, 4])
def test_plan_beats_or_ties_every_simple_split(
    profiles: dict[str, Path], name: str, stages: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_path = tmp_path / "plan.json"
    code = main(
        [
            "plan",
            "--profile",
            str(profiles[name]),
            "--stages",
            str(stages),
            "--memory",
            "2GiB",
            "--batch-size",
            "16",
            "-o",
            str(plan_path),
            "--json",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert {"schedule", "micro_batches", "iteration_time_s", "bubble_fraction", "stages", "baselines"} <= set(summary)
    assert len(summary["stages"]) >= stages
    for s in summary["stages"]:
        assert s["blocks"] and s["time_s"] > 0 and s["memory_bytes"] > 0
    names = {b["name"] for b in summary["baselines"]}
    assert names == {"even-layers", "by-params", "greedy-time"}
    noise = summary["uncertainty"]  # within the profile's measured noise the plan may take the steadier one
    for b in summary["baselines"]:
        assert summary["iteration_time_s"] <= b["iteration_time_s"] * (1 + noise + 1e-9), (b, noise)
    plan = Plan.load(plan_path)
    assert plan.iteration_time_s == summary["iteration_time_s"]


@pytest.mark.slow
def test_plan_json_is_byte_identical_across_runs(profiles: dict[str, Path], tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for path in (a, b):
        assert (
            main(
                [
                    "plan",
                    "--profile",
                    str(profiles["resnet"]),
                    "--stages",
                    "4",
                    "--memory",
                    "1GiB",
                    "-o",
                    str(path),
                    "--json",
                ]
            )
            == 0
        )
    assert a.read_bytes() == b.read_bytes()


def test_plan_table_show_and_timeline(
    profiles: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_path, png, svg = tmp_path / "plan.json", tmp_path / "t.png", tmp_path / "t.svg"
    assert (
        main(
            [
                "plan",
                "--profile",
                str(profiles["gpt"]),
                "--stages",
                "2",
                "--memory",
                "1GiB",
                "-o",
                str(plan_path),
                "--timeline",
                str(png),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "predicted iteration" in out and "even-layers" in out and "by-params" in out and f"wrote {plan_path}" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["show", str(plan_path), "--timeline", str(svg)]) == 0
    shown = capsys.readouterr().out
    assert "device 0 │" in shown and "device 1 │" in shown
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_plan_profiles_a_model_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan_path = tmp_path / "plan.json"
    code = main(
        [
            "plan",
            str(MODELS / "mlp.py"),
            "-k",
            "depth=4",
            "--stages",
            "2",
            "--memory",
            "1GiB",
            "--batch-size",
            "8",
            "-o",
            str(plan_path),
            *FAST,
        ]
    )
    assert code == 0
    plan = Plan.load(plan_path)
    assert plan.devices == 2 and plan.batch_size == 8
    assert plan.recipe.model_kwargs == ("depth=4",)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--stages", "40"], "cannot cut 8 blocks into 40 stages"),
        (["--batch-size", "30", "--micro-batches", "4"], "batch size 30 is not divisible into 4 micro-batches"),
        (["--memory", "1KiB"], "the smallest limit that fits is"),
        (["--memory", "lots"], "--memory must be a number with a unit"),
        (["--stages", "0"], "--stages must be a positive integer (got 0)"),
        (["--memory=-4GB"], "--memory must be positive"),
        (["--no-recompute", "--recompute-all"], "contradict each other"),
        (["--timeline", "t.gif"], "use a .png or .svg file name"),
        (["--action-overhead", "fast"], "--action-overhead must be a number with a unit, like 20us or 1ms"),
        (["--action-overhead=-1ms"], "--action-overhead must be zero or more (got '-1ms')"),
        (["--send-overhead", "slow"], "--send-overhead must be a number with a unit, like 20us or 1ms"),
        (["--send-overhead=-1ms"], "--send-overhead must be zero or more (got '-1ms')"),
    ],
)
def test_bad_plan_input_is_one_line_and_exit_2(
    profiles: dict[str, Path], args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--profile", str(profiles["gpt"]), "-o", str(tmp_path / "p.json"), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "p.json").exists()


def test_profile_from_another_model_is_refused(
    profiles: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "plan",
            str(MODELS / "gpt.py"),
            "-k",
            "n_layer=2",
            "--profile",
            str(profiles["gpt"]),
            "-o",
            str(tmp_path / "p.json"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "was made from another model (fingerprint" in err
    assert "autopipe profile" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{oops", "is not valid JSON"),
        ('{"hello": 1}', "is not an autopipe plan"),
        ('{"version": 7}', "has plan version 7"),
        ('{"version": 1, "stages": []}', "fingerprint is missing"),
    ],
)
def test_corrupt_plan_files(tmp_path: Path, content: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content)
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_missing_plan_and_profile_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(tmp_path / "nope.json")]) == 2
    assert "plan file not found" in capsys.readouterr().err
    assert main(["plan", "--profile", str(tmp_path / "nope.json"), "-o", str(tmp_path / "p.json")]) == 2
    assert "profile file not found" in capsys.readouterr().err


def test_api_plan_matches_the_profile_it_was_given(profiles: dict[str, Path]) -> None:
    import autopipe

    prof = Profile.load(profiles["gpt"])
    plan = autopipe.plan(
        torch.nn.Linear(2, 2), torch.zeros(4, 2), stages=2, memory="1GiB", batch_size=8, profile_data=prof
    )
    assert plan.devices == 2 and plan.recipe.fingerprint == prof.recipe.fingerprint
    assert "iteration" in plan.summary()


# ----------------------------------------------------------------------------- sizes, bad plan files


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.timeout(120)  # a search over 2**31 micro-batch counts would not end; the answers take seconds
def test_huge_batches_get_a_one_line_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "profile.json"
    chain().save(profile)
    base = ["plan", "--profile", str(profile), "--stages", "2", "-o", str(tmp_path / "p.json")]
    for batch in (2**31, 10**15, 2**53, 10**29):  # the last two: beyond float precision
        code, _, err = _run(capsys, *base, "--memory", "1GiB", "--batch-size", str(batch))
        assert code == 2
        if batch == 2**31:  # the largest batch autopipe plans: searched, and a plan that does not fit
            assert (
                err.startswith(
                    "autopipe: error: no plan of 4 blocks on 2 devices fits 1.0 GiB per device; the smallest limit"
                )
                and err.count("\n") == 1
            )
        else:  # beyond it: refused before any search (a plan that large would not load back)
            assert (
                err == f"autopipe: error: --batch-size {batch} is more than autopipe plans "
                "(at most 2147483648 = 2**31 samples per pipeline); use a smaller batch\n"
            )
    code, _, err = _run(capsys, *base, "--memory", "1GiB", "--batch-size", str(2**31), "--micro-batches", str(2**31))
    assert code == 2
    assert (
        err
        == f"autopipe: error: --micro-batches {2**31} is more than autopipe plans (at most 65536 = 2**16); use fewer\n"
    )


@pytest.mark.timeout(120)  # hang-only: 2,048 micro-batches, drawn in seconds
def test_show_of_a_long_plan_draws_its_ends_and_elides_the_middle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile, plan_path = tmp_path / "profile.json", tmp_path / "plan.json"
    chain().save(profile)
    assert (
        main(
            [
                "plan",
                "--profile",
                str(profile),
                "--stages",
                "2",
                "--memory",
                "1GiB",
                "--batch-size",
                "8",
                "-o",
                str(plan_path),
            ]
        )
        == 0
    )
    raw = json.loads(plan_path.read_text())
    raw.update(schedule="1f1b", virtual=1, micro_batches=2048, batch_size=2048, micro_batch_size=1)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(raw))
    capsys.readouterr()
    code, out, err = _run(capsys, "show", str(big), "--timeline", str(tmp_path / "t.png"))
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.startswith("device ")]
    assert [r.split(" │")[0] for r in rows] == ["device 0", "device 1"] and all(r.count("┊") == 2 for r in rows)
    assert "actions elided: warm-up, one steady-state window and cool-down shown" in out
    assert "letter = kind" in out  # piped: letters, not bare digits
    assert set(rows[0].split("│")[1]) <= {"F", "B", "·", "┊"} and "F" in rows[0] and "B" in rows[0]
    with Image.open(tmp_path / "t.png") as image:
        assert max(image.size) <= 3000
    code, out, err = _run(capsys, "show", str(big), "--json")
    assert (code, err) == (0, "") and json.loads(out)["micro_batches"] == 2048


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda p: _stage(p, 1, forward_s=-1e6),
            "plan.json: stage 1 has forward_s -1000000.0; times must be zero or more, plan again",
        ),
        (
            lambda p: _stage(p, 0, backward_s=float("nan")),
            "plan.json: stage 0 has backward_s nan; times must be zero or more, plan again",
        ),
        (
            lambda p: dataclasses.replace(p, link_latency_s=-1.0),
            "plan.json has link_latency_s -1.0; times must be zero or more, plan again",
        ),
        (
            lambda p: dataclasses.replace(p, link_bandwidth=0.0),
            "plan.json has link_bandwidth 0.0; it must be positive, plan again",
        ),
    ],
)
def test_a_timeline_is_not_drawn_from_negative_times(edit: Callable[[Plan], Plan], message: str) -> None:
    from autopipe.errors import PlanFileError
    from autopipe.planner.search import PlanRequest, plan_pipeline
    from autopipe.show.draw import check_times

    plan = plan_pipeline(chain(), PlanRequest(devices=2, batch_size=8, memory_limit=GIB))
    check_times(plan, "plan.json")
    with pytest.raises(PlanFileError) as info:
        check_times(edit(plan), "plan.json")
    assert str(info.value) == message


def _stage(plan: Plan, index: int, **change: float) -> Plan:
    stages = list(plan.stages)
    stages[index] = dataclasses.replace(stages[index], **change)
    return dataclasses.replace(plan, stages=tuple(stages))


def test_a_hand_edited_profile_is_checked_against_the_model(
    profiles: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = json.loads(profiles["mlp"].read_text())
    extra = {**raw["blocks"][-1], "name": "extra", "nodes": ["extra_node"]}
    raw["blocks"].append(extra)
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(raw))
    n = len(raw["blocks"])
    code, _, err = _run(
        capsys,
        "plan",
        str(MODELS / "mlp.py"),
        "--profile",
        str(edited),
        "--stages",
        "2",
        "-o",
        str(tmp_path / "p.json"),
    )
    assert (code, err) == (
        2,
        f"autopipe: error: {edited} has {n} blocks, the model traces into {n - 1}: "
        f"block {n - 1} 'extra' is not in the model; "
        "profile the model again\n",
    )


@pytest.mark.parametrize("schedule", ["v-half", "v-min"])
def test_a_v_shape_schedule_is_planned_when_pinned(
    schedule: str, profiles: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--schedule v-half / v-min: 2S chunks cut for the V (chunks j and 2S-1-j on device j),
    priced by simulating the schedule's own lists, written, and shown again."""
    plan_path = tmp_path / "plan.json"
    args = [
        "plan",
        "--profile",
        str(profiles["gpt"]),
        "--stages",
        "2",
        "--memory",
        "1GiB",
        "--batch-size",
        "16",
        "--micro-batches",
        "8",
        "--schedule",
        schedule,
        "-o",
        str(plan_path),
        "--json",
    ]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    plan = Plan.load(plan_path)
    assert (summary["schedule"], plan.schedule, plan.virtual, plan.micro_batches) == (schedule, schedule, 2, 8)
    assert [s.rank for s in plan.stages] == [0, 1, 1, 0]
    assert 0 < plan.bubble_fraction < 1 and plan.iteration_time_s == summary["iteration_time_s"]
    assert main(["show", str(plan_path)]) == 0
    shown = capsys.readouterr().out
    assert schedule in shown and "device 0 │" in shown and "device 1 │" in shown


def test_balance_prints_the_users_split_beside_autopipes_and_writes_the_users(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, out = tmp_path / "profile.json", tmp_path / "p.json"
    chain(6).save(path)
    base = [
        "plan",
        "--profile",
        str(path),
        "--stages",
        "2",
        "--memory",
        "1GiB",
        "--batch-size",
        "8",
        "--schedule",
        "1f1b",
        "--micro-batches",
        "4",
    ]
    assert main([*base, "--balance", "5,1", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    rows = {
        line.split("│")[1].strip(): line
        for line in text.splitlines()
        if line.startswith("│ your split") or line.startswith("│ autopipe")
    }
    assert "5/1" in rows["your split"] and "3/3" in rows["autopipe"]
    plan = Plan.load(out)
    assert [len(s.blocks) for s in plan.stages] == [5, 1] and plan.baselines[0].name == "autopipe"
    assert main([*base, "--balance", "5,1", "--json", "-o", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert [len(s["blocks"]) for s in summary["stages"]] == [5, 1] and summary["baselines"][0]["name"] == "autopipe"


@pytest.mark.parametrize(
    ("balance", "extra", "message"),
    [
        ("5,x", [], "--balance must be blocks per chunk separated by commas, like 3,1,1,3 (got '5,x')"),
        ("6,0", [], "--balance entries must be at least 1 block per chunk (got '6,0')"),
        ("4,1", [], "--balance sums to 5 blocks but the model has 6; give blocks per chunk that sum to 6"),
        (
            "2,1,1,2",
            [],
            "--balance has 4 entries = 2 devices x 2 chunks; name the schedule that runs 2 chunks per device "
            "with --schedule (e.g. interleaved-1f1b, zb-v)",
        ),
        ("3,3", ["--schedule", "zb-v"], "--balance has 2 entries but zb-v on 2 devices runs 4 chunks; give 4 entries"),
        (
            "3,3",
            ["--gpus", "4"],
            "--balance prices one pipeline's split and --gpus searches data x pipeline layouts; give one",
        ),
    ],
)
def test_bad_balance_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], balance: str, extra: list[str], message: str
) -> None:
    path, out = tmp_path / "profile.json", tmp_path / "p.json"
    chain(6).save(path)
    code = main(
        [
            "plan",
            "--profile",
            str(path),
            "--stages",
            "2",
            "--memory",
            "1GiB",
            "--batch-size",
            "8",
            "--balance",
            balance,
            *extra,
            "-o",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"autopipe: error: {message}"
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [  # the library's errors name its fields; the CLI says them as its flags (cli/args.py FLAGS), as before
        (
            ["--stages", "40"],
            "cannot cut 8 blocks into 40 stages; use --stages 8 or fewer, or finer blocks when profiling (--blocks)",
        ),
        (
            ["--devices", "40"],
            "cannot cut 8 blocks into 40 stages; use --stages 8 or fewer, or finer blocks when profiling (--blocks)",
        ),
        (
            ["--schedule", "zb-v", "--virtual", "3"],
            "zb-v runs 2 stages per device (got --virtual 3); use --virtual 2 or leave it out",
        ),
        (
            ["--schedule", "dualpipe-v", "--stages", "4", "--batch-size", "6"],
            "dualpipe-v needs at least 8 micro-batches on 4 devices, more than --batch-size 6; "
            "use --batch-size 8 or more",
        ),
        (
            ["--devices", "2", "--stages", "4"],
            "--devices 2 and --stages 4 are the same thing (pipeline devices); give one",
        ),
        (
            ["--devices", "2", "--gpus", "8"],
            "--devices counts one pipeline's devices; with --gpus G pin the pipeline depth with --stages",
        ),
    ],
)
def test_cli_errors_say_the_flags(
    profiles: dict[str, Path], args: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--profile", str(profiles["gpt"]), "-o", str(tmp_path / "p.json"), *args]) == 2
    assert capsys.readouterr().err == f"autopipe: error: {line}\n"


def test_devices_is_stages(profiles: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plans = []
    for flag in ("--devices", "--stages"):
        out = tmp_path / f"{flag[2:]}.json"
        assert main(["plan", "--profile", str(profiles["gpt"]), flag, "2", "--memory", "1GiB", "-o", str(out)]) == 0
        plans.append(out.read_bytes())
    assert plans[0] == plans[1] and Plan.load(tmp_path / "devices.json").devices == 2


@pytest.fixture
def chain_profile(tmp_path: Path) -> Path:
    path = tmp_path / "chain.json"
    chain(8).save(path)
    return path


def test_a_target_shows_the_free_plan_beside_its_own(
    chain_profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    args = ["plan", "--profile", str(chain_profile), "--stages", "4", "--batch-size", "8", "-o", str(out)]
    assert main([*args, "--target", "megatron"]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps the line
    plan = Plan.load(out)
    assert plan.schedule in ("1f1b", "interleaved-1f1b") and plan.target == "megatron"
    assert plan.free_plan is not None
    target = "target megatron (Megatron-LM): searched 1f1b or interleaved-1f1b, every stage recomputed or none"
    assert target in printed
    assert (
        f"free plan (any schedule): {plan.free_plan.schedule}" in printed
        and "; --target megatron (Megatron-LM): " in printed
    )
    assert main(["show", str(out)]) == 0  # the plan file keeps both: show prints them again
    shown = " ".join(capsys.readouterr().out.split())
    assert target in shown and f"free plan (any schedule): {plan.free_plan.schedule}" in shown
    assert main([*args, "--target", "torch"]) == 0  # every schedule, nothing recomputed: compared too
    printed = capsys.readouterr().out
    assert "target torch (torch.distributed.pipelining): searched any schedule, nothing recomputed" in printed
    assert Plan.load(out).target == "torch" and Plan.load(out).free_plan is not None
    assert main([*args, "--target", "autopipe"]) == 0
    with_flag = out.read_text()
    assert "target autopipe" not in capsys.readouterr().out
    assert main(args) == 0
    assert out.read_text() == with_flag  # --target autopipe is no flag at all


def test_a_targets_json_has_both_predictions(
    chain_profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    args = ["plan", "--profile", str(chain_profile), "--stages", "4", "--batch-size", "8", "-o", str(out), "--json"]
    assert main([*args, "--target", "megatron"]) == 0
    got = json.loads(capsys.readouterr().out)
    plan = Plan.load(out)
    assert got["target"] == "megatron" and plan.free_plan is not None
    free = got["free_plan"]
    assert free["schedule"] == plan.free_plan.schedule and free["step_time_s"] == plan.free_plan.step_time_s
    assert (
        free["target_cost"] == pytest.approx(got["step_time_s"] / free["step_time_s"] - 1) and free["target_cost"] >= 0
    )
    assert set(free) == {
        "schedule",
        "virtual",
        "micro_batches",
        "recomputed_stages",
        "memory",
        "iteration_time_s",
        "step_time_s",
        "tensor_parallel",
        "pipeline_parallel",
        "data_parallel",
        "target_cost",
    }
    assert main(args) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["target"] == "autopipe" and got["free_plan"] is None


def test_a_target_keeps_to_its_framework_with_balance_and_gpus(
    chain_profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    base = ["plan", "--profile", str(chain_profile), "--batch-size", "8", "-o", str(out), "--target", "megatron"]
    assert main([*base, "--stages", "4", "--balance", "2,2,2,2"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    plan = Plan.load(out)
    assert plan.balance == (2, 2, 2, 2) and plan.schedule == "1f1b" and plan.target == "megatron"
    assert "; --target megatron (Megatron-LM): 1f1b, " in printed
    assert main([*base, "--gpus", "8", "--memory", "64GiB"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    plan = Plan.load(out)
    assert plan.schedule in ("1f1b", "interleaved-1f1b") and len({s.recompute for s in plan.stages}) == 1
    assert plan.free_plan is not None and "free plan (any schedule): t=1 x S=" in printed and " s/step (" in printed
    assert "tensor x pipeline x data parallel on 8 devices: " in printed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--target", "megatron", "--schedule", "zb-v"],
            "--target megatron --schedule zb-v: Megatron-LM runs 1f1b and interleaved-1f1b; "
            "drop --schedule or pick one of them",
        ),
        (
            ["--target", "megatron", "--schedule", "v-half", "--balance", "1,1,1,1,1,1,1,1"],
            "--target megatron --schedule v-half: Megatron-LM runs 1f1b and interleaved-1f1b; ",
        ),
        (
            ["--target", "megatron", "--gpus", "4", "--schedule", "zb-h2"],
            "--target megatron --schedule zb-h2: Megatron-LM runs ",
        ),
        (
            ["--target", "torchtitan", "--schedule", "zb-h2", "--recompute-all"],
            "--target torchtitan --schedule zb-h2: torchtitan runs zb-h2 only with nothing recomputed, and every "
            "stage was asked to recompute; drop one of the two",
        ),
        (["--target", "nemo"], "--target nemo: use one of autopipe, megatron, torchtitan, torch"),
    ],
)
def test_a_target_that_cannot_be_kept_is_one_line_and_exit_2(
    chain_profile: Path, args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", "--profile", str(chain_profile), "--stages", "4", "-o", str(tmp_path / "p.json"), *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_target_flag_names_the_library_targets() -> None:
    from autopipe.api import TARGETS

    plan_parser = build_parser()._subparsers._group_actions[0].choices["plan"]  # type: ignore[union-attr]
    action = next(a for a in plan_parser._actions if "--target" in a.option_strings)
    assert action.metavar == "{" + ",".join(TARGETS) + "}" and action.default == TARGETS[0]


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (
            ["--repeat", "3"],
            "--repeat applies when MODEL is profiled; --profile {p} is measured already: drop --repeat",
        ),
        (
            ["--warmup", "0"],
            "--warmup applies when MODEL is profiled; --profile {p} is measured already: drop --warmup",
        ),
        (
            ["--threads", "2"],
            "--threads applies when MODEL is profiled; --profile {p} is measured already: drop --threads",
        ),
        (["--leaf", "Linear"], "--leaf applies when MODEL is profiled; --profile {p} is measured already: drop --leaf"),
        (
            ["--blocks", "2"],
            "--blocks applies when MODEL is profiled; --profile {p} is measured already: drop --blocks",
        ),
        (
            ["--load-timeout", "5"],
            "--load-timeout limits the model file's calls; with --profile alone none is imported: drop it",
        ),
    ],
)
def test_plan_profile_refuses_flags_that_would_do_nothing(
    extra: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A measuring flag beside a saved profile is refused, not ignored: the user meant it to change the plan."""
    from tests.helpers import FIXTURES

    profile = str(FIXTURES / "good_mlp_profile_v1.json")
    out = tmp_path / "plan.json"
    assert main(["plan", "--profile", profile, "--devices", "2", "-o", str(out), *extra]) == 2
    assert capsys.readouterr().err == f"autopipe: error: {said.format(p=profile)}\n"
    assert not out.exists()
    assert main(["plan", "--profile", profile, "--devices", "2", "-o", str(out)]) == 0  # the defaults pass


def test_analytic_plan_refuses_timing_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.helpers import ROOT

    args = [
        "plan",
        str(ROOT / "models" / "mlp.py"),
        "--device",
        "h100",
        "--devices",
        "2",
        "-o",
        str(tmp_path / "p.json"),
    ]
    assert main([*args, "--repeat", "3"]) == 2
    assert capsys.readouterr().err == (
        "autopipe: error: --repeat applies to measured plans; an analytic plan times nothing: drop --repeat\n"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--recompute-modules", "core_attn,bogus"],
            "name each once, among core_attn, layernorm, mla_up_proj, mlp, mlp_act",
        ),
        (["--recompute-modules", ","], "--recompute-modules must be module kinds separated by commas"),
        (["--recompute-layers", "-1"], "--recompute-layers must be an integer >= 0"),
        (["--recompute-layers", "2", "--recompute-all"], "--recompute-layers 2 and recompute=always contradict"),
        (["--recompute-modules", "mlp"], "--recompute-modules mlp: the profile has no transformer layer"),
        (["--offload-modules", "core_attn", "--target", "torch"], "torch.distributed.pipelining does not run it"),
    ],
)
def test_memory_choice_flags_that_cannot_be_planned_are_one_line(
    chain_profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    out = tmp_path / "p.json"
    args = ["plan", "--profile", str(chain_profile), "--stages", "2", "--batch-size", "8", "-o", str(out), *flags]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not out.exists()


def test_none_rules_the_memory_choices_out(chain_profile: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    none = ["--recompute-modules", "none", "--recompute-layers", "0", "--offload-modules", "none"]
    assert (
        main(["plan", "--profile", str(chain_profile), "--stages", "2", "--batch-size", "8", "-o", str(out), *none])
        == 0
    )
    assert Plan.load(out).memory_choice == ""
