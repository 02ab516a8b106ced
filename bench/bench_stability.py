# Run: PYTHONPATH=. python bench/bench_stability.py [--model models/mlp.py] [--rounds 5] [--busy] [-- PLAN FLAGS]
#      (repository root; ~5 s a round for the MLP)
"""Does planning twice on one machine give the same plan? (issue 28)

Plans ``--model`` (default the bundled MLP) ``--rounds`` times in a row (default 5), each with a
fresh measured profile (``autopipe plan MODEL --stages 2``, quietly, in a subprocess), and prints
per round: the machine's load average, the schedule, micro-batches, blocks per stage, the
predicted iteration with its uncertainty and how many candidates were tied within the measured
noise (the plan's ``noise_note``). The last line says whether every round gave the same split and
micro-batch count, or else whether each round that differs says in its note that it was tied.
``--busy`` runs one CPU-bound process beside the rounds (the issue's noisy case). Flags after
``--`` go to ``autopipe plan`` (``--repeat 9``, ``--batch-size 64`` ...).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def plan_once(model: str, out: Path, extra: list[str]) -> dict[str, object]:
    """One fresh profile and plan; what the round prints."""
    from autopipe.plans import Plan

    cmd = [sys.executable, "-m", "autopipe.cli", "plan", model, "--stages", "2", "-o", str(out), *extra]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"autopipe plan failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    plan = Plan.load(out)
    found = re.match(r"within the measured noise \(±\d+%\), (\d+) candidates: (.*?); chose", plan.noise_note)
    return {
        "load": os.getloadavg()[0],
        "schedule": plan.schedule + (f"/v{plan.virtual}" if plan.virtual > 1 else ""),
        "m": plan.micro_batches,
        "split": "/".join(str(n) for n in plan.balance),
        "iteration": plan.iteration_shown,
        "tied": found.group(2) if found else "",
        "tied_count": int(found.group(1)) if found else 0,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/mlp.py")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--busy", action="store_true", help="one CPU-bound process beside the rounds")
    args = ap.parse_args(own)
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if args.busy else None
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                row = plan_once(args.model, Path(tmp) / f"round{r}.json", extra)
                rows.append(row)
                print(
                    f"round {r + 1}: load {row['load']:.2f}  {row['schedule']} m={row['m']} split {row['split']}  "
                    f"{row['iteration']}  tied {row['tied_count']}",
                    flush=True,
                )
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    verdict, ok = stability(rows)
    print(verdict)
    return 0 if ok else 1


def stability(rows: list[dict[str, object]]) -> tuple[str, bool]:
    """The last line, and whether planning was stable: the same split and micro-batch count in
    every round, or else every round names a tie in its note (the candidates within the measured
    noise), and how many of the other rounds' choices those notes name."""
    choices = [(x["m"], x["split"]) for x in rows]
    if len(set(choices)) == 1:
        return f"same split and micro-batch count in all {len(rows)} rounds", True
    odd = rows  # not all the same: every round's choice is one another round did not make
    named = all(x["tied"] for x in odd)
    others = sum(
        1 for x in odd for c in set(choices) if c != (x["m"], x["split"]) and f"m={c[0]} split {c[1]}" in str(x["tied"])
    )
    return (
        f"{len(set(choices))} different splits/micro-batch counts in {len(rows)} rounds; "
        + ("each such round's note says it was within the measured noise" if named else "NOT all within the noise")
        + f" ({others} of the other rounds' choices named in those notes)",
        named,
    )


if __name__ == "__main__":
    sys.exit(main())
