"""docs/security.md, sentence by sentence: what runs code (model files) and what is only data.

A model file that writes a marker file when it is imported stands for any code a file could
carry: it is named by a crafted plan, profile and manifest, and each command either must import
it (it runs model files: the marker appears) or must not (it reads data: no marker). The last
test holds the doc to its tests: every sentence of docs/security.md is cited by a test, in a
comment ``# docs/security.md:`` and the sentence's first words in double quotes, and every
citation is still the start of a sentence of the doc.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from autopipe.cli.main import main

import autopipe.runtime.run.launch
from autopipe.costs.calibrate import calibrate
from autopipe.costs.profile import Profile
from autopipe.errors import ProfileError
from autopipe.stages.emit import emit
from tests.helpers import FIXTURES, ROOT, even_plan

DOC = ROOT / "docs" / "security.md"
MLP = str(FIXTURES / "good_mlp.py")
MARKER_MODEL = """\
from pathlib import Path

Path(__file__).with_name("IMPORTED").write_text("this model file was imported")

import torch


def build_model(depth=3):
    return torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(depth)])


def example_inputs(batch_size):
    return torch.randn(batch_size, 4)
"""


class _Launched(Exception):
    pass


@pytest.fixture
def crafted(tmp_path: Path) -> dict[str, Path]:
    """A marker model file, and a plan, a profile and an emitted folder that each name it."""
    model = tmp_path / "marker_model.py"
    model.write_text(MARKER_MODEL)
    plan = json.loads((FIXTURES / "good_mlp_plan_v1.json").read_text())
    plan["model_file"] = str(model)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    profile = json.loads((FIXTURES / "good_mlp_profile_v1.json").read_text())
    profile["model_file"] = str(model)
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    stages = tmp_path / "stages"
    emit(even_plan("mlp.py"), stages)
    manifest = json.loads((stages / "manifest.json").read_text())
    manifest.update(model_file=str(model), model=f"{model}:build_model")
    (stages / "manifest.json").write_text(json.dumps(manifest))
    return {
        "model": model,
        "marker": tmp_path / "IMPORTED",
        "plan": tmp_path / "plan.json",
        "profile": tmp_path / "profile.json",
        "stages": stages,
    }


def _run(argv: list[str]) -> tuple[int | str, str]:
    out, err = io.StringIO(), io.StringIO()
    code: int | str
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except _Launched:
            code = "launched"
    return code, err.getvalue()


def test_reading_plans_profiles_and_manifests_imports_nothing(crafted: dict[str, Path], tmp_path: Path) -> None:
    # docs/security.md: "Everything else is data."
    # docs/security.md: "`show`, `config --for torchtitan`, `plan --profile` and `merge` import nothing"
    plan, profile, stages = str(crafted["plan"]), str(crafted["profile"]), str(crafted["stages"])
    for argv in (
        ["show", plan],
        ["config", plan, "--for", "torchtitan"],
        ["config", plan, "--for", "torchtitan-0.2"],
        ["plan", "--profile", profile, "--stages", "2", "-o", str(tmp_path / "p.json")],
        ["calibrate", profile],
        ["merge", stages, "-o", str(tmp_path / "merged.pt")],
    ):
        code, err = _run(argv)
        assert code in (0, 2), (argv, code, err)
        assert not crafted["marker"].exists(), f"autopipe {argv[0]} imported the model file a file names"


def test_calibrate_imports_only_the_model_file_it_is_given(crafted: dict[str, Path], tmp_path: Path) -> None:
    # docs/security.md: "A profile names the model file it was made from only as data"
    code, err = _run(["calibrate", str(crafted["profile"]), "-o", str(tmp_path / "cal.json")])
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(
        "autopipe: error: calibrate needs --model MODEL, the model file the profile was made from: counting its "
        f"ops imports it, and a profile is data, so the file it names ('{crafted['model']}') is not imported"
    ), err
    with pytest.raises(ProfileError, match=r"^calibrate needs model='path/to/model.py', the model file the profile"):
        calibrate(Profile.load(crafted["profile"]))
    with pytest.raises(ProfileError, match=r"^the profile was made with factory 'build_model', not 'other'; name it:"):
        calibrate(Profile.load(crafted["profile"]), model=f"{MLP}:other")
    assert not crafted["marker"].exists() and not (tmp_path / "cal.json").exists()


@pytest.mark.slow
def test_calibrate_with_model_fits_without_importing_the_named_file(
    crafted: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOPIPE_CALIBRATION_DIR", str(tmp_path / "store"))
    code, err = _run(["calibrate", str(crafted["profile"]), "--model", MLP, "-o", str(tmp_path / "cal.json")])
    assert code == 0, err
    assert (tmp_path / "cal.json").is_file() and not crafted["marker"].exists()


@pytest.mark.slow
def test_model_files_you_name_and_the_plans_model_file_are_imported(
    crafted: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # docs/security.md: "Model files are code, and autopipe runs them."
    # docs/security.md: "`profile`, `plan MODEL`, `calibrate --model MODEL` and `config --check MODEL` import"
    # docs/security.md: "A plan names a model file"
    def launched(*args: object, **kwargs: object) -> None:
        raise _Launched()

    monkeypatch.setattr(autopipe.runtime.run.launch, "launch", launched)
    model, plan = str(crafted["model"]), str(crafted["plan"])
    for argv in (
        ["profile", model, "--micro-batch-sizes", "1", "--batch-size", "1", "--repeat", "1", "-o", str(tmp_path / "x")],
        ["plan", model, "--analytic", "--stages", "2", "-o", str(tmp_path / "p.json")],
        ["calibrate", str(FIXTURES / "good_mlp_profile_v1.json"), "--model", model, "-o", str(tmp_path / "c.json")],
        ["config", str(FIXTURES / "good_mlp_plan_v1.json"), "--for", "torchtitan", "--check", model],
        ["emit", plan, "--no-weights", "-o", str(tmp_path / "out")],
        ["run", plan, "--device", "cpu"],
        ["config", plan, "--for", "megatron"],
    ):
        crafted["marker"].unlink(missing_ok=True)
        _run(argv)  # the outcome does not matter here: the import comes first
        assert crafted["marker"].exists(), f"autopipe {argv[0]} did not import the model file"


# -- the doc and its tests -------------------------------------------------------------------

_CITATION = re.compile(r'# docs/security\.md: "([^"]+)"')


def _sentences(text: str) -> list[str]:
    """The sentences of the doc's bullets, on one line each, bold marks taken out."""
    bullets = re.findall(r"^- (.*?)(?=^- |^\s*$|\Z)", text, re.S | re.M)
    out = []
    for bullet in bullets:
        flat = " ".join(bullet.split()).replace("**", "")
        out.extend(s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`(\[])", flat) if s)
    return out


def _citations() -> dict[str, list[str]]:
    cited: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for quote in _CITATION.findall(path.read_text()):
            cited.setdefault(quote, []).append(str(path.relative_to(ROOT)))
    return cited


def test_every_sentence_of_the_security_doc_is_backed_by_a_test() -> None:
    sentences = _sentences(DOC.read_text())
    assert len(sentences) >= 12, sentences
    cited = _citations()
    uncited = [s for s in sentences if not any(s.startswith(q) for q in cited)]
    assert not uncited, "sentences of docs/security.md no test cites:\n" + "\n".join(uncited)
    stale = {q: where for q, where in cited.items() if not any(s.startswith(q) for s in sentences)}
    assert not stale, f"citations of docs/security.md that are no longer sentences of it: {stale}"
    assert all(len(q.split()) >= 3 for q in cited), cited


def test_the_readmes_security_section_says_only_what_the_doc_backs() -> None:
    """Every sentence of the README's section (but its pointer to the doc) is a sentence of
    docs/security.md, and so cited by a test above."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## What runs code, and what is only data\n")
    section = readme[start : readme.index("\n## ", start + 1)].split("\n", 1)[1]
    said = [s for s in _sentences("- " + " ".join(section.split())) if not s.startswith("The whole account")]
    assert len(said) >= 5, said
    doc = _sentences(DOC.read_text())
    assert [s for s in said if s not in doc] == []


def test_the_sentence_splitter_keeps_code_and_links_whole() -> None:
    text = "- **Bold.** One `a.b` (see [x.md](x.md#y)), two. Three `..` and `-o`.\n- Four.\n"
    assert _sentences(text) == ["Bold.", "One `a.b` (see [x.md](x.md#y)), two.", "Three `..` and `-o`.", "Four."]
    assert _sentences("") == []
