# Run: python bench/bench_plan_speed.py --out speed.json          (record the plans' hashes and CPU times)
#      python bench/bench_plan_speed.py --check speed.json        (plan again: same bytes? how fast?)
#      python bench/bench_plan_speed.py --root /other/checkout ... (plan with another checkout's code)
"""Planning speed, with the plans held fixed: a fixed list of ``autopipe plan`` cases, model file
to plan, each timed in CPU seconds and hashed, so that a change meant only to make planning faster
can show both that it is faster and that every plan is byte-identical (issues 24 and 25).

The cases (``CASES``): the README's GPT-3 175B on 64 H100s, the Megatron-LM paper's 1T row on
3,072 A100s (``bench_analytic.py --1t``), DeepSeek-V3 on 1,024 H100s with the full t x cp x p x d x
ep search (docs/limits.md's command) and pinned to Megatron-Bridge's t 2 x p 8 x EP 64, Qwen3-235B
on 256 H100s, Mixtral 8x7B on 32, small dense and MoE models with and without pins (sharding,
recomputation, schedule, tensor, expert and context parallel degrees), and the 100-block synthetic
profile of ``bench_planner.py``.

Each case is ``python -m autopipe.cli plan ... -o FILE --json`` in a fresh interpreter, one at a
time, pinned to one CPU (the planner is single-threaded); its CPU time is the child's user +
system time (``RUSAGE_CHILDREN``), which a shared machine inflates far less than wall time. The
plan file and stdout are hashed with the output folder read as ``<out>`` and the checkout as
``<root>`` (as ``plan_hashes.py`` does), so two checkouts' hashes compare. ``--check`` exits 1 when
any plan differs from the recorded one. ``--repeat N`` times each case N times (the minimum CPU
time is printed; the hash must agree every time).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
H100 = ("--device", "h100", "--memory", "80GB")
ONE_T = tuple(
    x
    for kv in ("preset=gpt3-175b", "n_layer=128", "n_embd=25600", "n_head=160", "vocab_size=51200")
    for x in ("-k", kv)
)
DSV3 = ("models/moe.py", "-k", "preset=deepseek-v3", *H100, "--gpus", "1024", "--batch-size", "8192")


@dataclass(frozen=True)
class Case:
    name: str
    args: tuple[str, ...]  # after ``autopipe plan``, without -o and --json


# reason: one case a line, so the list reads as a table
# fmt: off
CASES: tuple[Case, ...] = (
    Case("gpt3-175b-h100-g64", ("models/gpt.py", "-k", "preset=gpt3-175b", *H100, "--gpus", "64",
                                "--batch-size", "1536")),
    Case("gpt3-175b-h100-g64-t4", ("models/gpt.py", "-k", "preset=gpt3-175b", *H100, "--gpus", "64",
                                   "--batch-size", "1536", "--tensor-parallel", "4")),
    Case("gpt3-175b-h100-g64-zero1-megatron", ("models/gpt.py", "-k", "preset=gpt3-175b", *H100, "--gpus", "64",
                                               "--batch-size", "1536", "--zero1", "--target", "megatron")),
    Case("gpt3-175b-h100-g64-zero2-selective", ("models/gpt.py", "-k", "preset=gpt3-175b", *H100, "--gpus", "64",
                                                "--batch-size", "1536", "--sharding", "zero2",
                                                "--recompute-modules", "core_attn", "--offload-modules", "none")),
    Case("gpt3-175b-h100-g64-block2", ("models/gpt.py", "-k", "preset=gpt3-175b", *H100, "--gpus", "64",
                                       "--batch-size", "1536", "--recompute-layers", "2")),
    Case("1t-a100-g3072", ("models/gpt.py", *ONE_T, "--device", "a100-80gb", "--memory", "80GB", "--gpus", "3072",
                           "--batch-size", "3072")),
    Case("deepseek-v3-h100-g1024", DSV3),
    Case("deepseek-v3-h100-g1024-t2-p8-ep64", (*DSV3, "--tensor-parallel", "2", "--stages", "8",
                                              "--expert-parallel", "64")),
    Case("qwen3-235b-h100-g256", ("models/moe.py", "-k", "preset=qwen3-235b-a22b", *H100, "--gpus", "256",
                                  "--batch-size", "2048")),
    Case("mixtral-8x7b-h100-g32", ("models/moe.py", "-k", "preset=mixtral-8x7b", *H100, "--gpus", "32",
                                   "--batch-size", "256")),
    Case("moe-tiny-h100-g16-cp2", ("models/moe.py", *H100, "--gpus", "16", "--batch-size", "64",
                                   "--context-parallel", "2")),
    Case("gpt3-1.3b-h100-g16", ("models/gpt.py", "-k", "preset=gpt3-1.3b", *H100, "--gpus", "16",
                                "--batch-size", "512")),
    Case("gpt3-1.3b-a100-40gb-g16-recompute-all", ("models/gpt.py", "-k", "preset=gpt3-1.3b", "--device",
                                                   "a100-40gb", "--gpus", "16", "--batch-size", "256",
                                                   "--recompute-all")),
    Case("llama2-7b-a100-80gb-s8-zb-v", ("models/llama.py", "-k", "preset=llama2-7b", "--device", "a100-80gb",
                                         "--stages", "8", "--batch-size", "64", "--schedule", "zb-v")),
    Case("gpt2x998-h100-s64-16gib", ("models/gpt.py", "-k", "preset=gpt2", "-k", "n_layer=998", "--device", "h100",
                                     "--stages", "64", "--batch-size", "512", "--memory", "16GiB")),
    Case("synth100-s8-8gib", ("--profile", "bench/fixtures/synthetic100_profile.json", "--stages", "8",
                              "--batch-size", "64", "--bandwidth", "50GB/s", "--latency", "10us", "--memory", "8GiB")),
)
# fmt: on


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def run_case(case: Case, root: Path, out: Path) -> dict[str, object]:
    """Plan ``case`` with the code of ``root`` in a fresh interpreter on one CPU: its hashes and
    CPU seconds."""
    target = out / f"{case.name}.json"
    target.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOPIPE_DEVICES", "AUTOPIPE_NO_SIMCORE")}
    calibration = tempfile.mkdtemp(prefix="plan-speed-calibration-")
    env.update(CUDA_VISIBLE_DEVICES="", AUTOPIPE_CALIBRATION_DIR=calibration, PYTHONPATH=str(root))
    cpu = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "autopipe.cli", "plan", *case.args, "-o", str(target), "--json"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    def norm(text: str) -> str:
        return text.replace(str(out), "<out>").replace(str(root), "<root>")

    written = norm(target.read_text()) if target.is_file() else ""
    return {
        "rc": done.returncode,
        "sha256": sha256(written) if written else "",
        "stdout_sha256": sha256(norm(done.stdout)),
        "stderr": norm(done.stderr).strip()[-300:],
        "cpu_s": round(seconds, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the hashes and CPU times here (JSON)")
    parser.add_argument("--check", type=Path, help="compare with these recorded hashes; exit 1 on a difference")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose code plans (default: this one)")
    parser.add_argument("--only", default=None, help="comma-separated case names")
    parser.add_argument("--repeat", type=int, default=1, help="time each case this many times (the minimum shown)")
    parser.add_argument("--list", action="store_true", help="print the cases' commands")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only is None or c.name in args.only.split(",")]
    if args.list:
        for case in cases:
            print(f"{case.name}: autopipe plan {' '.join(case.args)}")
        return 0
    baseline = json.loads(args.check.read_text()) if args.check else {}
    root = args.root.resolve()
    out = Path(tempfile.mkdtemp(prefix="plan-speed-"))
    results: dict[str, dict[str, object]] = {}
    different = 0
    for case in cases:
        runs = [run_case(case, root, out) for _ in range(max(1, args.repeat))]
        result = dict(runs[0], cpu_s=min(float(str(r["cpu_s"])) for r in runs))
        hashes = {(r["rc"], r["sha256"], r["stdout_sha256"]) for r in runs}
        results[case.name] = result
        verdict = ""
        if len(hashes) > 1:
            verdict, different = "  UNSTABLE (runs differ)", different + 1
        if args.check:
            old = baseline.get(case.name)
            same = old is not None and all(old[k] == result[k] for k in ("rc", "sha256", "stdout_sha256"))
            verdict += f"  same (was {old['cpu_s']} s)" if same and old else "  DIFFERENT"
            different += 0 if same else 1
        line = str(result["stderr"]).splitlines()[-1][:100] if result["stderr"] else ""
        print(
            f"{case.name}: rc {result['rc']}, {result['cpu_s']:.2f} s CPU, {str(result['sha256'])[:12]}{verdict}"
            f"  {line}",
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    total = sum(float(str(r["cpu_s"])) for r in results.values())
    print(f"{len(results)} cases, {total:.1f} s CPU in all; {different} different; files in {out}")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
