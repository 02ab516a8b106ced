# Run: python bench/plan_hashes.py --out DIR  |
#      python bench/plan_hashes.py --check bench/results/plan_hashes-dd61e39.json
#      (from anywhere; it runs in the repository root)
"""Behaviour baseline of the planner: a fixed list of ``autopipe plan`` cases whose plan files
must keep the same bytes across a refactor that changes no behaviour.

Every case runs only through the command line, ``python -m autopipe.cli plan ... -o
DIR/<case>.json --json``, in a subprocess (the Python signatures may change; the flags do not).
``--out DIR`` writes the files and ``DIR/hashes.json``: per case the command, the exit code
(``rc``), the SHA-256 of the file it writes (``sha256``, ``""`` when it writes none) and its
stderr (``stderr_line``: the one ``autopipe: error:`` line of a bad-input case, empty for the
others); also the SHA-256 of its stdout (``stdout_sha256``: ``--json``'s summary object) and
short digests of each JSON key and sub-key (or each line, for text) of the file (``keys``) and
of stdout (``stdout_keys``), from which ``--check HASHES`` names the first differing keys
without keeping the baseline's plans. ``--check`` runs every case again (into ``--out`` or a
new temp folder), prints ``same`` or ``DIFFERENT`` for each and exits 1 on any difference.

The cases (``CASES``): analytic plans on the catalogue devices and a ``--device-file`` device
(``--gpus`` with tensor x pipeline x data searched or pinned, ``--zero1``, ``--cluster``,
``--dtype``, ``--calibration``), the README's deterministic commands (GPT-3 175B on 64 H100,
GPT-3 1.3B pinned to interleaved 1F1B and its ``autopipe config --for megatron|torchtitan``),
rows of ``bench/bench_megatron.py`` (pinned and free) and ``bench/bench_analytic.py``; plans
from saved profiles (``tests/fixtures/good_mlp_profile_v1.json`` and ``bench/fixtures/``:
``autopipe profile models/X.py -o bench/fixtures/X_profile.json`` run once on the development
machine, 1 thread, batch 8, for gpt, llama, resnet, unet, mlp and chargpt, planned as
``bench/bench_plans.py`` plans them; ``synthetic100_profile.json`` is
``bench/bench_planner.py``'s ``synthetic_profile(100).save(...)``, planned with its 100 -> 8
settings) with each of the nine schedules pinned, ``--virtual``, ``--micro-batches``,
``--no-recompute``/``--recompute-all``, a tight memory limit, ``--balance`` and the link flags;
and bad input (exit code and the one ``autopipe: error:`` line). Measured CPU profiles vary
from run to run, so nothing is measured here: a measuring plan (``autopipe plan models/gpt.py``,
``--device cpu``, ``--analytic`` without a catalogue device) is never a case.

Normalised so that the same command gives the same bytes on another machine or checkout:

- the subprocesses run in the repository root with relative paths; a plan file records its
  model file relative to its own folder, or absolute when outside it (as every case's is: the
  output folder holds no model file), so the files are hashed with the output folder read as
  ``<out>`` and the repository root as ``<root>``, as stdout and stderr are;
- every plan from a measured (CPU) profile gets ``--memory``: without it the limit is this
  host's RAM, and ``--stages`` everywhere but ``--gpus`` (the default is the visible GPUs);
- the environment: ``CUDA_VISIBLE_DEVICES=""`` (no GPU changes a default),
  ``AUTOPIPE_CALIBRATION_DIR`` an empty folder (no stored calibration of the user's applies),
  ``AUTOPIPE_DEVICES`` and ``AUTOPIPE_NO_SIMCORE`` removed (the catalogue alone; the compiled
  cores, which give the same plans as their Python twins); ``PYTHONHASHSEED`` is left random,
  so a plan that hangs on hash order shows as a difference;
- in stderr and stdout the output folder reads ``<out>`` and the repository root ``<root>``
  (``bad-missing-model`` names the folder it looked in). Plans from the CPU profiles say ``cpu: x86_64, 1 thread``: the
  fixture's device, not this machine's;
- bytecode is cached in a folder of its own (``--pycache``, default under the temp folder;
  ``PYTHONPYCACHEPREFIX``, with ``PYTHONDONTWRITEBYTECODE`` off): importing torch from source
  every time costs ~10 s a case; it writes nothing in the repository and changes no plan.

The plans carry no timestamp, host name, version of torch or of autopipe, or absolute path
but their model file's (normalised above).
The baseline ``bench/results/plan_hashes-dd61e39.json`` was made on commit dd61e39 (against
f516304's, only the config outlets differ: Megatron's model arguments, torchtitan's 0.3.0 recipe,
the new ``torchtitan-0.2`` case) with torch
2.13.0+cpu and Python 3.11.7 on the 2-core development machine; f516304's gave the same bytes
on each of three runs there (each with its own hash seed) and from a second clone in another
folder with its own venv. Another Python may word argparse's
line (``bad-schedule-name``) otherwise; another torch may count an op otherwise. Cost: about
170 s of CPU in all (the analytic cases, ~8 s each, are started first; ``--jobs`` cases at
once), so about 1.5 min on 2 idle cores and more on a busy machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = "<out>"  # the output folder, in recorded commands
FIX = "bench/fixtures"
MLP_V1 = "tests/fixtures/good_mlp_profile_v1.json"
GPT = f"{FIX}/gpt_profile.json"
SYNTH = f"{FIX}/synthetic100_profile.json"
GPT3 = ("-k", "preset=gpt3-175b", "-k", "vocab_size=51200", "-k", "block_size=2048")  # bench_megatron's rows


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]  # after ``python -m autopipe.cli``, with <out> for the output folder
    output: str  # file it writes in the output folder
    after: str | None = None  # a case whose plan file this one reads

    @property
    def slow(self) -> bool:
        """Imports torch (builds or traces a model): started first."""
        return self.args[0] == "plan" and not self.args[1].startswith("-")


def plan(name: str, *args: str) -> Case:
    return Case(name, ("plan", *args, "-o", f"{OUT}/{name}.json", "--json"), f"{name}.json")


def config(name: str, plan_case: str, target: str, suffix: str) -> Case:
    args = ("config", f"{OUT}/{plan_case}.json", "--for", target, "-o", f"{OUT}/{name}.{suffix}")
    return Case(name, args, f"{name}.{suffix}", after=plan_case)


def _schedules() -> tuple[str, ...]:
    return ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "v-half", "v-min", "dualpipe-v")


GPT_S4 = ("--profile", GPT, "--stages", "4", "--memory", "2GiB", "--batch-size", "32")
SYNTH_8 = ("--profile", SYNTH, "--stages", "8", "--batch-size", "64", "--bandwidth", "50GB/s", "--latency", "10us")

# reason: one case a line, so the list reads as a table
# fmt: off
CASES: tuple[Case, ...] = (
    # --- analytic: the model built on meta and counted (catalogue devices) ---
    plan("readme-gpt3-175b-h100-g64", "models/gpt.py", "-k", "preset=gpt3-175b", "--device", "h100", "--gpus", "64",
         "--memory", "80GB", "--batch-size", "1536"),
    plan("readme-gpt3-1.3b-h100-g16-s4-interleaved", "models/gpt.py", "-k", "preset=gpt3-1.3b", "--device", "h100",
         "--gpus", "16", "--stages", "4", "--batch-size", "512", "--schedule", "interleaved-1f1b"),
    plan("megatron-1.7b-pinned-a100", "models/gpt.py", *GPT3, "-k", "n_layer=24", "-k", "n_embd=2304",
         "-k", "n_head=24", "--device", "a100-80gb", "--gpus", "32", "--tensor-parallel", "1", "--stages", "1",
         "--recompute-all", "--schedule", "1f1b", "--no-sequence-parallel", "--batch-size", "512"),
    plan("megatron-1.7b-free-a100", "models/gpt.py", *GPT3, "-k", "n_layer=24", "-k", "n_embd=2304", "-k", "n_head=24",
         "--device", "a100-80gb", "--gpus", "32", "--batch-size", "512"),
    plan("megatron-39.1b-pinned-a100", "models/gpt.py", *GPT3, "-k", "n_layer=48", "-k", "n_embd=8192",
         "-k", "n_head=64", "--device", "a100-80gb", "--gpus", "512", "--tensor-parallel", "8", "--stages", "2",
         "--recompute-all", "--schedule", "interleaved-1f1b", "--no-sequence-parallel", "--batch-size", "1536"),
    plan("gpt2x998-h100-s64-16gib", "models/gpt.py", "-k", "preset=gpt2", "-k", "n_layer=998", "--device", "h100",
         "--stages", "64", "--batch-size", "512", "--memory", "16GiB"),
    plan("gpt2-h200-s4-mbs", "models/gpt.py", "-k", "preset=gpt2", "--device", "h200", "--stages", "4",
         "--batch-size", "128", "--micro-batch-sizes", "1,4"),
    plan("gpt2-h100-s4-fp32-calibrated", "models/gpt.py", "-k", "preset=gpt2", "--device", "h100", "--stages", "4",
         "--batch-size", "64", "--dtype", "fp32", "--calibration", f"{FIX}/h100_calibration.json"),
    plan("llama2-7b-a100-80gb-s8", "models/llama.py", "-k", "preset=llama2-7b", "--device", "a100-80gb",
         "--stages", "8", "--batch-size", "64"),
    plan("gpt3-1.3b-a100-40gb-g16-zero1", "models/gpt.py", "-k", "preset=gpt3-1.3b", "--device", "a100-40gb", "--gpus",
         "16", "--batch-size", "256", "--zero1"),
    plan("gpt3-1.3b-h100-g32-t2-d4-noseq", "models/gpt.py", "-k", "preset=gpt3-1.3b", "--device", "h100",
         "--gpus", "32", "--tensor-parallel", "2", "--data-parallel", "4", "--no-sequence-parallel",
         "--batch-size", "256"),
    plan("gpt3-1.3b-testgpu-g16-cluster", "models/gpt.py", "-k", "preset=gpt3-1.3b", "--device-file",
         f"{FIX}/devices_test.json", "--device", "testgpu", "--gpus", "16", "--cluster", f"{FIX}/cluster_4x.json",
         "--batch-size", "128", "--dtype", "fp16"),
    plan("resnet-h100-s4-blocks", "models/resnet.py", "--device", "h100", "--stages", "4", "--batch-size", "128",
         "--blocks", "12"),
    # --- saved profiles: the MLP fixture of tests/, and bench/fixtures' profiles of models/ ---
    plan("mlp-v1-s2", "--profile", MLP_V1, "--stages", "2", "--memory", "1GiB"),
    plan("mlp-v1-s3-b64-link", "--profile", MLP_V1, "--stages", "3", "--memory", "1GiB", "--batch-size", "64",
         "--bandwidth", "25GB/s", "--latency", "20us", "--action-overhead", "0.1ms"),
    plan("gpt-s4", *GPT_S4),
    plan("gpt-s2", "--profile", GPT, "--stages", "2", "--memory", "2GiB", "--batch-size", "32"),
    *(plan(f"gpt-s4-{s}", *GPT_S4, "--schedule", s) for s in _schedules()),
    plan("gpt-s4-interleaved-v2-m8", *GPT_S4, "--schedule", "interleaved-1f1b", "--virtual", "2",
         "--micro-batches", "8"),
    plan("gpt-s4-m16", *GPT_S4, "--micro-batches", "16"),
    plan("gpt-s4-no-recompute", *GPT_S4, "--no-recompute"),
    plan("gpt-s4-recompute-all", *GPT_S4, "--recompute-all"),
    plan("gpt-s4-10mib", "--profile", GPT, "--stages", "4", "--memory", "10MiB", "--batch-size", "32"),
    plan("gpt-s4-balance-3113", *GPT_S4, "--balance", "3,1,1,3"),
    plan("gpt-s2-zb-v-balance-2222", "--profile", GPT, "--stages", "2", "--memory", "2GiB", "--schedule", "zb-v",
         "--balance", "2,2,2,2"),
    plan("gpt-s4-link", *GPT_S4, "--bandwidth", "25GB/s", "--latency", "20us", "--action-overhead", "0.1ms"),
    plan("gpt-g8", "--profile", GPT, "--gpus", "8", "--memory", "2GiB", "--batch-size", "32"),
    plan("gpt-model-and-profile-s4", "models/gpt.py", *GPT_S4),  # checks the profile's fingerprint against the model
    *(plan(f"{m}-s{s}", "--profile", f"{FIX}/{m}_profile.json", "--stages", str(s), "--memory", "2GiB",
           "--batch-size", "32")
      for m, stages in (("llama", (2, 4)), ("resnet", (2, 4)), ("unet", (2, 4)), ("mlp", (4,)), ("chargpt", (2,)))
      for s in stages),
    plan("synth100-s8-8gib", *SYNTH_8, "--memory", "8GiB"),  # bench_planner's 100 -> 8
    plan("synth100-s8-8gib-no-recompute", *SYNTH_8, "--memory", "8GiB", "--no-recompute"),
    plan("synth100-s8-1tib", *SYNTH_8, "--memory", "1TiB"),
    plan("synth100-s8-8gib-zb-v", *SYNTH_8, "--memory", "8GiB", "--schedule", "zb-v"),
    plan("synth100-s8-8gib-v-min", *SYNTH_8, "--memory", "8GiB", "--schedule", "v-min"),
    # --- the README's: the pinned 1.3B plan in Megatron-LM's and torchtitan's words ---
    config("readme-config-megatron", "readme-gpt3-1.3b-h100-g16-s4-interleaved", "megatron", "txt"),
    config("readme-config-torchtitan", "readme-gpt3-1.3b-h100-g16-s4-interleaved", "torchtitan", "py"),
    config("readme-config-torchtitan-0.2", "readme-gpt3-1.3b-h100-g16-s4-interleaved", "torchtitan-0.2", "toml"),
    # --- bad input: exit code 2 and one line ---
    plan("bad-missing-model", "models/no_such_model.py", "--stages", "2"),
    plan("bad-stages-zero", "--profile", MLP_V1, "--stages", "0"),
    plan("bad-recompute-both", "--profile", MLP_V1, "--no-recompute", "--recompute-all"),
    plan("bad-schedule-name", "--profile", MLP_V1, "--schedule", "zb-x"),
    plan("bad-memory-nothing-fits", *GPT_S4[:4], "--memory", "1KiB"),
    plan("bad-micro-batches-divide", *GPT_S4[:4], "--memory", "2GiB", "--batch-size", "30", "--micro-batches", "4"),
    plan("bad-balance-sum", "--profile", GPT, "--stages", "2", "--memory", "2GiB", "--balance", "1,1"),
    plan("bad-virtual-1f1b", *GPT_S4, "--schedule", "1f1b", "--virtual", "2"),
    plan("bad-profile-not-json", "--profile", "tests/fixtures/good_mlp.py", "--stages", "2", "--memory", "1GiB"),
    plan("bad-profile-other-model", "models/mlp.py", "--profile", GPT, "--stages", "2", "--memory", "1GiB"),
    plan("bad-zero1-without-gpus", "models/gpt.py", "--device", "h100", "--stages", "2", "--zero1"),
    plan("bad-unknown-device", "models/gpt.py", "--device", "tpu9", "--stages", "2"),
)
# fmt: on


# ----------------------------------------------------------------------------- running


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(value: Any) -> str:
    return sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode())[:16]


def key_digests(text: str) -> dict[str, str]:
    """``{key: digest}`` for each top-level key of a JSON object and each of its keys or list
    items (``stages[3]``, ``recipe.fingerprint``); for other text, one per line (``line 0007``)."""
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        return {f"line {i:04d}": digest(line) for i, line in enumerate(text.splitlines(), 1)}
    out: dict[str, str] = {}
    for key, value in obj.items():
        out[key] = digest(value)
        if isinstance(value, dict):
            out.update({f"{key}.{k}": digest(v) for k, v in value.items()})
        elif isinstance(value, list):
            out.update({f"{key}[{i}]": digest(v) for i, v in enumerate(value)})
    return out


def environment(pycache: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AUTOPIPE_DEVICES", "AUTOPIPE_NO_SIMCORE", "PYTHONDONTWRITEBYTECODE")
    }
    calibration = Path(tempfile.mkdtemp(prefix="plan-hashes-calibration-"))
    env.update(CUDA_VISIBLE_DEVICES="", AUTOPIPE_CALIBRATION_DIR=str(calibration), PYTHONPYCACHEPREFIX=str(pycache))
    return env


def normalise(text: str, out: Path) -> str:
    return text.replace(str(out), OUT).replace(str(ROOT), "<root>")


def run_case(case: Case, out: Path, env: dict[str, str]) -> dict[str, Any]:
    args = [a.replace(OUT, str(out)) for a in case.args]
    target = out / case.output
    target.unlink(missing_ok=True)
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "autopipe.cli", *args], cwd=ROOT, env=env, capture_output=True, timeout=600
    )
    seconds = time.perf_counter() - t0
    raw = target.read_bytes() if target.is_file() else None
    written = normalise(raw.decode(errors="replace"), out).encode() if raw is not None else None
    stdout = normalise(done.stdout.decode(errors="replace"), out)
    return {
        "command": ["python", "-m", "autopipe.cli", *case.args],
        "rc": done.returncode,
        "sha256": sha256(written) if written is not None else "",
        "stderr_line": normalise(done.stderr.decode(errors="replace"), out).strip(),
        "stdout_sha256": sha256(stdout.encode()),
        "keys": key_digests(written.decode(errors="replace")) if written is not None else {},
        "stdout_keys": key_digests(stdout),
        "seconds": seconds,  # not recorded: for the report only
    }


def run_all(out: Path, jobs: int, pycache: Path, only: set[str] | None) -> Iterator[tuple[Case, dict[str, Any]]]:
    """Every case (or those in ``only``), in CASES order; the slow ones started first, a case
    that reads another's plan after it."""
    out.mkdir(parents=True, exist_ok=True)
    env = environment(pycache)
    wanted = None if only is None else only | {c.after for c in CASES if c.name in only and c.after}
    cases = [c for c in CASES if wanted is None or c.name in wanted]
    futures: dict[str, Future[dict[str, Any]]] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for case in sorted((c for c in cases if c.after is None), key=lambda c: not c.slow):
            futures[case.name] = pool.submit(run_case, case, out, env)
        for case in cases:
            if case.after is not None:
                if case.after in futures:
                    futures[case.after].result()
                futures[case.name] = pool.submit(run_case, case, out, env)
        for case in cases:
            yield case, futures[case.name].result()


def recorded(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "seconds"}


COMPARED = ("command", "rc", "sha256", "stderr_line", "stdout_sha256")


def first_keys(old: dict[str, str], new: dict[str, str], limit: int = 6) -> str:
    """The first keys (in sorted order) whose digests differ, top-level ones with their
    differing children."""
    tops = sorted(k for k in set(old) | set(new) if "." not in k and "[" not in k and old.get(k) != new.get(k))
    shown = []
    for top in tops[:limit]:
        kids = sorted(
            (k for k in set(old) | set(new) if k.startswith((f"{top}.", f"{top}[")) and old.get(k) != new.get(k)),
            key=lambda k: (len(k), k),
        )
        missing = " (missing now)" if top not in new else " (new)" if top not in old else ""
        shown.append(top + missing + (f" [{', '.join(kids[:4])}{', ...' if len(kids) > 4 else ''}]" if kids else ""))
    return ", ".join(shown) + (f", and {len(tops) - limit} more" if len(tops) > limit else "")


def check(baseline_path: Path, out: Path, jobs: int, pycache: Path, only: set[str] | None) -> int:
    baseline: dict[str, dict[str, Any]] = json.loads(baseline_path.read_text())
    names = {c.name for c in CASES}
    different = checked = 0
    for name in sorted(set(baseline) - names):
        print(f"{name}: DIFFERENT (in the baseline, not a case of this script)")
        different += 1
    for case, new in run_all(out, jobs, pycache, only):
        checked += 1
        old = baseline.get(case.name)
        if old is None:
            print(f"{case.name}: DIFFERENT (not in the baseline)")
            different += 1
            continue
        changed = [k for k in COMPARED if old.get(k) != new.get(k)]
        if not changed:
            print(f"{case.name}: same")
            continue
        different += 1
        print(f"{case.name}: DIFFERENT ({', '.join(changed)})")
        if "rc" in changed:
            print(f"    rc {old['rc']} -> {new['rc']}")
        if "stderr_line" in changed:
            print(f"    stderr was: {old['stderr_line'][-300:]!r}\n    stderr now: {new['stderr_line'][-300:]!r}")
        if "sha256" in changed and old.get("keys") and new["keys"]:
            print(f"    first differing keys (or lines) of the file: {first_keys(old['keys'], new['keys'])}")
        if "stdout_sha256" in changed and old.get("stdout_keys") and new["stdout_keys"]:
            print(
                f"    first differing keys (or lines) of stdout: {first_keys(old['stdout_keys'], new['stdout_keys'])}"
            )
    print(f"{checked} cases: {different} different; this run's files are in {out}")
    return 1 if different else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the plan files and hashes.json to this folder")
    parser.add_argument(
        "--check",
        type=Path,
        default=None,
        metavar="HASHES",
        help="run every case again and compare with this hashes.json (files: --out, else a new temp folder)",
    )
    parser.add_argument("--list", action="store_true", help="print the cases and their commands")
    parser.add_argument(
        "--jobs", type=int, default=min(4, os.cpu_count() or 1), help="cases at once (default: the CPUs, at most 4)"
    )
    parser.add_argument(
        "--pycache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "autopipe-plan-hashes-pycache",
        help="bytecode cache for the subprocesses (PYTHONPYCACHEPREFIX)",
    )
    parser.add_argument("--only", default=None, help=argparse.SUPPRESS)  # comma-separated case names (debugging)
    args = parser.parse_args()
    if args.list:
        for case in CASES:
            print(f"{case.name}: {' '.join(['python', '-m', 'autopipe.cli', *case.args])}")
        return 0
    if args.out is None and args.check is None:
        parser.error("give --out DIR, --check HASHES or --list")
    t0 = time.perf_counter()
    pycache = args.pycache.resolve()
    out = (args.out or Path(tempfile.mkdtemp(prefix="plan-hashes-"))).resolve()
    only = set(args.only.split(",")) if args.only else None
    if args.check is not None:
        code = check(args.check.resolve(), out, args.jobs, pycache, only)
        print(f"{time.perf_counter() - t0:.1f} s")
        return code
    hashes: dict[str, dict[str, Any]] = {}
    for case, result in run_all(out, args.jobs, pycache, only):
        hashes[case.name] = recorded(result)
        line = result["stderr_line"].splitlines()[-1] if result["stderr_line"] else ""
        print(
            f"{case.name}: rc {result['rc']}, {result['seconds']:.1f} s, "
            f"{result['sha256'][:12] or 'no file'}  {line[:110]}"
        )
    (out / "hashes.json").write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    print(f"{len(hashes)} cases, {time.perf_counter() - t0:.1f} s; wrote {out / 'hashes.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
