"""Fuzz the command line: generated bad inputs end with exit 2 and one line, never a traceback.

Seeded mutations of a good plan, profile and stage manifest (a key deleted; a value replaced
by a wrong type, a negative, NaN, infinity, a huge int, a string with quotes, newlines or a
lone surrogate; a list emptied or doubled; the file truncated or given non-UTF-8 bytes) and of
flags go through the real commands -- ``show``, ``emit``, ``run``, ``merge``, ``plan
--profile`` -- in this process (``autopipe.cli.main.main``), a few through a real subprocess.
Each must end with exit 0 (a mutation that is still valid) or exit 2 and exactly one
``autopipe: error:`` line, within 10 s; an exception escaping ``main``, another exit code or
more lines is a failure, listed with the input that caused it.

``run`` is checked before it starts ranks: the launcher (``autopipe.runtime.run.launch.launch``)
is swapped for one that records the call, so a case passes ``run`` either with exit 2 before
any rank exists, or by reaching the launch -- which it may only do for a plan that ``emit``
accepts as well (the same checks guard both). Real launches are tested in tests/runtime.
"""

from __future__ import annotations

import copy
import json
import math
import random
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from autopipe.cli.main import main

from autopipe.plans import Plan
from tests.helpers import FIXTURES, ROOT, Launched, call

SEED = 20240611
PLAN_V1 = FIXTURES / "good_mlp_plan_v1.json"
PROFILE_V1 = FIXTURES / "good_mlp_profile_v1.json"
BAD_VALUES: tuple[Any, ...] = (
    "x",
    "",
    'q"""\n\'\\',
    "\udcff",
    "1",
    None,
    True,
    False,
    0,
    -1,
    -2.5,
    10**30,
    math.nan,
    math.inf,
    -math.inf,
    [],
    {},
    [1, "a"],
)


# ----------------------------------------------------------------------------- mutations


def _paths(value: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key and list element inside ``value``, as a path from the top."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield (*at, k)
        yield from _paths(v, (*at, k))


def mutate(raw: Any, rng: random.Random) -> tuple[str, bytes]:
    """One mutation of the JSON value ``raw``: what was done, and the file's bytes."""
    text = json.dumps(raw)
    roll = rng.random()
    if roll < 0.08:  # the file itself broken
        cut = rng.randrange(len(text))
        how = rng.choice(["truncated", "a non-UTF-8 byte", "NUL bytes"])
        data = text.encode()
        if how == "truncated":
            return f"truncated at {cut}", data[:cut]
        if how == "NUL bytes":
            return "NUL bytes", b"\x00\x01\x02"
        return f"\\xff at {cut}", data[:cut] + b"\xff" + data[cut:]
    d = copy.deepcopy(raw)
    path = rng.choice(list(_paths(d)))
    parent = d
    for k in path[:-1]:
        parent = parent[k]
    key, old = path[-1], parent[path[-1]]
    where = "/".join(map(str, path))
    if roll < 0.25:
        del parent[key]
        what = f"deleted {where}"
    elif roll < 0.35 and isinstance(old, list):
        parent[key] = [] if rng.random() < 0.5 else old + copy.deepcopy(old)
        what = f"{'emptied' if not parent[key] else 'doubled'} {where}"
    elif roll < 0.45 and isinstance(old, (int, float)) and not isinstance(old, bool):
        parent[key] = rng.choice([-old - 1, old * 1000 + 1, old + 1, 2**63])
        what = f"{where} = {parent[key]!r}"
    else:
        parent[key] = rng.choice(BAD_VALUES)
        what = f"{where} = {parent[key]!r}"
    return what, json.dumps(d).encode()


@dataclass(frozen=True)
class Case:
    command: str  # show, emit, run, plan, merge, flags
    what: str
    argv: list[str]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A good plan (version 2), profile and emitted stage folder, each as JSON and on disk."""
    tmp = tmp_path_factory.mktemp("fuzz")
    plan = Plan.load(PLAN_V1)
    plan_raw = json.loads(plan.to_json())
    plan_raw["recipe"]["model_file"] = str(ROOT / plan.recipe.model_file)
    stages = tmp / "stages"
    assert main(["emit", str(PLAN_V1), "-o", str(stages)]) == 0
    manifest = json.loads((stages / "manifest.json").read_text())
    return {
        "tmp": tmp,
        "plan": plan_raw,
        "profile": json.loads(PROFILE_V1.read_text()),
        "stages": stages,
        "manifest": manifest,
    }


def make_cases(inputs: dict[str, Any], per_kind: int, seed: int) -> Iterator[Case]:
    """``per_kind`` mutated plans (each through show, emit and run), profiles and manifests."""
    rng = random.Random(seed)
    tmp: Path = inputs["tmp"] / f"cases-{seed}-{per_kind}"
    tmp.mkdir()
    for i in range(per_kind):
        what, data = mutate(inputs["plan"], rng)
        path = tmp / f"plan{i}.json"
        path.write_bytes(data)
        yield Case("show", what, ["show", str(path)])
        yield Case("emit", what, ["emit", str(path), "--no-weights", "-o", str(tmp / f"emit{i}")])
        yield Case("run", what, ["run", str(path), "--steps", "1", "--timeout", "5"])
        what, data = mutate(inputs["profile"], rng)
        path = tmp / f"profile{i}.json"
        path.write_bytes(data)
        yield Case(
            "plan",
            what,
            [
                "plan",
                "--profile",
                str(path),
                "--stages",
                "2",
                "--batch-size",
                "8",
                "--memory",
                "1GiB",
                "-o",
                str(tmp / f"plan-out{i}.json"),
            ],
        )
        what, data = mutate(inputs["manifest"], rng)
        folder = tmp / f"stages{i}"
        folder.mkdir()
        for src in inputs["stages"].rglob("*"):
            if src.is_file() and src.name != "manifest.json":
                (folder / src.relative_to(inputs["stages"])).parent.mkdir(parents=True, exist_ok=True)
                (folder / src.relative_to(inputs["stages"])).write_bytes(src.read_bytes())
        (folder / "manifest.json").write_bytes(data)
        yield Case("merge", what, ["merge", str(folder), "-o", str(tmp / f"merged{i}.pt")])
    good = inputs["tmp"] / "good-plan.json"
    good.write_text(json.dumps(inputs["plan"]))
    for flags in _flag_mutations(rng, per_kind):
        yield Case(
            "flags", " ".join(flags), [flags[0], str(good), *flags[1:]] if flags[0] in ("show", "run") else flags
        )


_RUN_FLAGS = ("--steps", "--timeout", "--lr", "--seed", "--optimizer", "--threads")
_PLAN_FLAGS = ("--stages", "--batch-size", "--memory", "--micro-batches", "--virtual", "--bandwidth", "--latency")
_FLAG_VALUES = ("0", "-1", "nan", "inf", "1e400", "10" * 12, "", "x", '"', "\udcff", "3.5", "-5GB", "1e400GB")


def _flag_mutations(rng: random.Random, n: int) -> Iterator[list[str]]:
    for _ in range(n):
        if rng.random() < 0.6:
            flag = rng.choice(_RUN_FLAGS)
            yield (
                ["run", "--steps", "1", flag, rng.choice(_FLAG_VALUES)]
                if flag != "--steps"
                else ["run", flag, rng.choice(_FLAG_VALUES)]
            )
        else:
            yield [
                "plan",
                "--profile",
                str(PROFILE_V1),
                "-o",
                "/nonexistent-dir/x/plan.json",
                "--stages",
                "2",
                "--batch-size",
                "8",
                rng.choice(_PLAN_FLAGS),
                rng.choice(_FLAG_VALUES),
            ]


def check_cases(cases: list[Case], monkeypatch: pytest.MonkeyPatch) -> None:
    import autopipe.runtime.run.launch

    def launched(*args: object, **kwargs: object) -> None:
        raise Launched()

    monkeypatch.setattr(autopipe.runtime.run.launch, "launch", launched)
    failures, accepted = [], {}
    for case in cases:
        outcome = call(case.argv)
        if (problem := outcome.problem()) is not None:
            failures.append(f"{case.command} [{case.what}]: {problem}")
        accepted[(case.command, case.argv[1])] = outcome.code == 0
    for (command, path), ok in accepted.items():  # run starts ranks only for plans emit accepts
        if command == "run" and ok != accepted.get(("emit", path), ok):
            failures.append(f"run {'accepted' if ok else 'refused'} {path}, emit did the opposite")
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures)


def test_fuzz_fast(inputs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # docs/security.md: "Each is then checked field by field before use"
    cases = list(make_cases(inputs, per_kind=6, seed=SEED))
    assert len(cases) >= 36
    check_cases(cases, monkeypatch)


@pytest.mark.slow
def test_fuzz_slow(inputs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    cases = list(make_cases(inputs, per_kind=50, seed=SEED + 1))
    assert len(cases) >= 300
    check_cases(cases, monkeypatch)


@pytest.mark.slow
def test_fuzz_through_a_real_process(inputs: dict[str, Any]) -> None:
    """A few cases as users meet them: the installed command in its own process, real ranks."""
    tmp: Path = inputs["tmp"]
    bad = copy.deepcopy(inputs["plan"])
    bad["stages"][1]["nodes"] = bad["stages"][1]["nodes"][1:]  # a block cut in the middle
    (tmp / "cut.json").write_text(json.dumps(bad))
    (tmp / "binary.json").write_bytes(b"\x80\x81\xfe\xff")
    for argv, message in (
        (["run", str(tmp / "cut.json"), "--timeout", "10"], "a block cut in the middle"),
        (["show", str(tmp / "binary.json")], "not UTF-8 text"),
    ):
        # a hang only meets the timeout; the check and its one line take seconds, torch's import included
        done = subprocess.run(
            [sys.executable, "-m", "autopipe.cli.main", *argv], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


# ----------------------------------------------------------------------------- user code (the model file)


USER_CAUSES = (  # the causes of tests.model.test_usercode.py that fail in the model file's load
    "base exception at import",
    "base exception in build_model",
    "bad __str__",
    "sys.exit in build_model",
    "sys.exit in example_inputs",
    "KeyboardInterrupt raised by build_model",
    pytest.param("build_model loops", marks=pytest.mark.slow),  # 0.5 s per command: the time limit
    pytest.param("import loops", marks=pytest.mark.slow),
)


def _user_commands(model: Path, plan: Path, tmp: Path) -> dict[str, list[str]]:
    """Every command that imports a model file, on ``model`` (or a plan naming it)."""
    limit = ["--load-timeout", "0.5"]
    return {
        "profile": ["profile", str(model), "--batch-size", "2", "-o", str(tmp / "profile.json"), *limit],
        "plan": ["plan", str(model), "--stages", "2", "--batch-size", "4", "-o", str(tmp / "plan-out.json"), *limit],
        "emit": ["emit", str(plan), "-o", str(tmp / "stages"), *limit],
        "run": ["run", str(plan), "--steps", "1", *limit],
        "config --check": ["config", str(plan), "--for", "torchtitan", "--check", str(model), "-k", "depth=3", *limit],
    }


@pytest.mark.parametrize("cause", USER_CAUSES)
def test_fuzz_user_code_through_every_command(cause: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fault of the model file's code, through each command that imports the file: exit 2, one
    line naming the file, nothing written, no rank started."""
    import autopipe.runtime.run.launch
    from tests.model.test_usercode import CAUSES, write_model

    def launched(*args: object, **kwargs: object) -> None:
        raise Launched()

    monkeypatch.setattr(autopipe.runtime.run.launch, "launch", launched)
    extra, said = CAUSES[cause]
    model = write_model(tmp_path, extra)
    raw = json.loads(Plan.load(PLAN_V1).to_json())
    raw["recipe"]["model_file"] = str(model)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(raw))
    before = sorted(p.name for p in tmp_path.iterdir())
    failures = []
    for command, argv in _user_commands(model, plan, tmp_path).items():
        if command == "config --check" and "example_inputs" in cause:
            continue  # it builds the model on meta only: example_inputs is not called
        outcome = call(argv)
        problem = outcome.problem()
        if problem is None and outcome.code != 2:
            problem = f"exit {outcome.code}"
        elif problem is None and str(model) not in outcome.err:
            problem = f"the line does not name {model}: {outcome.err!r}"
        elif problem is None and said.split("{path}")[-1].split(" (")[0] not in outcome.err:
            problem = f"not the cause's line: {outcome.err!r}"
        if problem is not None:
            failures.append(f"{command}: {problem}")
    assert not failures, "\n".join(failures)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, nothing left
