"""Strings from a plan enter the emitted source escaped: importing a stage never runs them."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autopipe.stages.emit import emit
from autopipe.stages.source import docstring_literal
from tests.helpers import even_plan

# Each would write the marker file if the text ended the docstring (or the line) it is put in.
PAYLOADS = [
    'x"""\nopen(MARKER, "w").write("ran")\n"""',
    "x'''\nopen(MARKER, 'w').write('ran')\n'''",
    'x"\nopen(MARKER, "w").write("ran")\n#',
    'back\\"""\nopen(MARKER, "w").write("ran")\n"""\\',
    'cr"""\ropen(MARKER, "w").write("ran")\r"""',
    'nul\x00"""; open(MARKER, "w").write("ran"); """',
    'bytes \udcff\udcfe """\nopen(MARKER, "w").write("ran")\n"""',
    "line\u2028sep \\N{BULLET} \\x41 \t tab \\",
]

CHECK = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
import torch
import stage0, stage1
x = torch.load(sys.argv[2], weights_only=True)
(h,) = stage0.load()(x)
(y,) = stage1.load()(h)
print(json.dumps({"marker": os.path.exists(sys.argv[3]), "shape": list(y.shape),
                  "init_doc": stage0.__doc__, "stage_doc": stage0.stage.__doc__}))
"""


@pytest.mark.parametrize("text", [*PAYLOADS, "", '"', "\\", '""""""', "'\"'"])
def test_docstring_literal_round_trips(text: str) -> None:
    literal = docstring_literal(text)
    assert eval(literal) == text  # evaluating it is the point
    assert "\x00" not in literal and "\r" not in literal
    literal.encode("utf-8")  # no lone surrogate left: the file can be written


@pytest.mark.slow
def test_plan_strings_never_run_when_stages_import(tmp_path: Path) -> None:
    # docs/security.md: "Strings from a plan (the model name, block names) enter emitted source escaped"
    marker = tmp_path / "ran.txt"
    payload = "mlp " + " | ".join(p.replace("MARKER", repr(str(marker))) for p in PAYLOADS)
    plan = even_plan("mlp.py")
    hostile = dataclasses.replace(plan, model=payload)  # free text; block names must match the model's
    manifest = emit(hostile, tmp_path / "stages")
    assert manifest["model"] == payload
    x = torch.randn(*manifest["inputs"][0]["shape"])
    torch.save(x, tmp_path / "x.pt")
    (tmp_path / "check.py").write_text(CHECK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            str(tmp_path / "check.py"),
            str(tmp_path / "stages"),
            str(tmp_path / "x.pt"),
            str(marker),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not report["marker"] and not marker.exists()
    assert report["shape"][0] == plan.micro_batch_size
    assert payload in report["init_doc"] and payload in report["stage_doc"]  # the text itself, unchanged


@pytest.mark.slow
def test_emit_of_a_model_under_a_non_utf8_path(tmp_path: Path) -> None:
    from tests.helpers import MODELS

    odd = tmp_path / os.fsdecode(b"models\xff\xfe")
    odd.mkdir()
    shutil.copy(MODELS / "mlp.py", odd / "mlp.py")
    manifest = emit(even_plan(str(odd / "mlp.py")), tmp_path / "stages")  # the plan's model names the path
    init = (tmp_path / "stages" / "stage0" / "__init__.py").read_text(encoding="utf-8")
    assert "models\\udcff\\udcfe" in init  # escaped in the source, the text itself when imported
    assert os.fsencode(manifest["model_file"]) == os.fsencode(odd / "mlp.py")
