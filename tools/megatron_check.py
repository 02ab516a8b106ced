# Run: .venv/bin/python tools/megatron_check.py env && .venv/bin/python tools/megatron_check.py run   (repo root)
#      (published runs: python bench/bench_published.py --no-free --write-plans DIR, then run --published DIR)
"""autopipe's ``config --for megatron`` checked by Megatron-LM's own code (issue 22, item 6).

Not part of the test suite: it needs Python 3.12 (megatron-core >= 0.17 does) and downloads.

``env``: a Python 3.12 venv (``--python``, default pyenv's 3.12.1) with torch and
``megatron-core==0.19.0`` from the package index (the wheel holds ``megatron.training``), and,
with ``--megatron-git GITDIR`` (a clone of NVIDIA/Megatron-LM), its ``HEAD``'s ``megatron/``
unpacked under ``--main`` with the commit in ``COMMIT``: put first on ``PYTHONPATH``, it is the
"main" run. ``run``: in autopipe's own venv, the plans of :data:`PLANS` (``autopipe plan``, analytic
on H100s), each one's ``autopipe config --for megatron``, the layers per (virtual) stage the plan
says, counted from the plan's block names and the model's own module order (merged blocks
``a..b`` expanded), independently of autopipe's config code; then ``tools/megatron_probe.py``
under the 3.12 venv, once per Megatron version, and one row per plan: arguments accepted, layer
placement equal. Megatron's chunk ``j`` is pipeline rank ``j % p``, virtual stage ``j // p``: for a
V-shaped plan that is the interleaved split autopipe says Megatron runs instead.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".megatron-check"  # git ignores it (.gitignore)
PYTHON312 = "/root/.pyenv/versions/3.12.1/bin/python"
CORE = "megatron-core==0.19.0"
GPT, LLAMA = "models/gpt.py", "models/llama.py"
H100 = ["--device", "h100", "--batch-size", "16"]
# the run's own arguments, which autopipe cannot know: tokenizer (its '# vocabulary' line), data, length
EXTRA = ["--tokenizer-type", "NullTokenizer", "--mock-data", "--train-iters", "10"]

PLANS: dict[str, str] = {  # case -> autopipe plan arguments (model file first); all on H100s, batch 16
    "even 1f1b p4": f"{GPT} -k n_layer=8 --stages 4 --schedule 1f1b --balance 4,2,2,4",
    "uneven first/last p4": f"{GPT} -k n_layer=8 --stages 4 --schedule 1f1b --balance 3,3,3,3",
    "uneven middle p4": f"{GPT} -k n_layer=10 --stages 4 --schedule 1f1b --balance 3,2,4,5",
    "free plan p4 (recompute)": f"{GPT} -k n_layer=6 --stages 4 --recompute-all",
    "gpipe p4": f"{GPT} -k n_layer=8 --stages 4 --schedule gpipe",
    "coarse --blocks 8 p4 (recompute)": f"{GPT} -k n_layer=24 --blocks 8 --stages 4 --recompute-all",
    "coarse --blocks 6 p2": f"{GPT} -k n_layer=24 --blocks 6 --stages 2 --schedule 1f1b",
    "interleaved p2 v2 even": f"{GPT} -k n_layer=8 --stages 2 --schedule interleaved-1f1b --virtual 2 "
    "--balance 4,2,2,4",
    "interleaved p2 v2 uneven first/last": f"{GPT} -k n_layer=16 --stages 2 --schedule interleaved-1f1b --virtual 2 "
    "--balance 5,5,3,7",
    "interleaved p2 v3 free": f"{GPT} -k n_layer=12 --stages 2 --schedule interleaved-1f1b --virtual 3",
    "interleaved p4 v2 even": f"{GPT} -k n_layer=16 --stages 4 --schedule interleaved-1f1b --virtual 2 "
    "--balance 4,2,2,2,2,2,2,4",
    "interleaved p4 v2 uneven first/last": f"{GPT} -k n_layer=18 --stages 4 --schedule interleaved-1f1b --virtual 2 "
    "--balance 3,3,3,2,1,3,3,4",
    "interleaved p3 v2 free": f"{GPT} -k n_layer=14 --stages 3 --schedule interleaved-1f1b --virtual 2 "
    "--batch-size 24 --micro-batches 6",
    "interleaved p4 v3 free (recompute)": f"{GPT} -k n_layer=24 --stages 4 --schedule interleaved-1f1b --virtual 3 "
    "--recompute-all",
    "recompute even p4": f"{GPT} -k n_layer=8 --stages 4 --schedule 1f1b --balance 4,2,2,4 --recompute-all",
    "recompute uneven p4": f"{GPT} -k n_layer=8 --stages 4 --schedule 1f1b --balance 3,3,3,3 --recompute-all",
    "t2 sp zero1 p4 (16 GPUs)": f"{GPT} -k n_layer=12 --gpus 16 --tensor-parallel 2 --stages 4 --schedule 1f1b --zero1",
    "t2 sp interleaved p4 v2 (16 GPUs)": f"{GPT} -k n_layer=12 --gpus 16 --tensor-parallel 2 --stages 4 "
    "--schedule interleaved-1f1b --virtual 2 --zero1",
    "t4 no sp p2 (8 GPUs)": f"{GPT} -k n_layer=8 --gpus 8 --tensor-parallel 4 --stages 2 --schedule 1f1b "
    "--no-sequence-parallel",
    "zb-v p4": f"{GPT} -k n_layer=8 --stages 4 --schedule zb-v",
    "v-half p2": f"{GPT} -k n_layer=8 --stages 2 --schedule v-half",
    "dualpipe-v p4": f"{GPT} -k n_layer=8 --stages 4 --schedule dualpipe-v",
    "no pipeline": f"{GPT} -k n_layer=4 --stages 1",
    "no pipeline d4 zero1 (4 GPUs)": f"{GPT} -k n_layer=4 --gpus 4 --stages 1 --tensor-parallel 1 --zero1",
    "llama p2 1f1b": f"{LLAMA} --stages 2 --schedule 1f1b",
    "--target megatron p4": f"{GPT} -k n_layer=12 --stages 4 --target megatron",
    "gpt3-1.3b, docs/outlets.md's plan (16 GPUs)": f"{GPT} -k preset=gpt3-1.3b --gpus 16 --stages 4 "
    "--batch-size 512 --schedule interleaved-1f1b",
    # issue 24: shardings and overlaps (Megatron's distributed optimizer, Megatron-FSDP, hybrid instances)
    "zero1 overlapped p4 d4 (16 GPUs)": f"{GPT} -k n_layer=8 --gpus 16 --tensor-parallel 1 --stages 4 "
    "--sharding zero1 --target megatron",
    "zero1 hybrid 2 x 4 p2 d8 (16 GPUs)": f"{GPT} -k n_layer=8 --gpus 16 --tensor-parallel 1 --stages 2 "
    "--sharding zero1 --shard-group 4 --target megatron",
    "zero2 fsdp p2 d4 (8 GPUs)": f"{GPT} -k n_layer=8 --gpus 8 --tensor-parallel 1 --stages 2 "
    "--sharding zero2 --target megatron",
    "zero3 fsdp no pipeline d8 (8 GPUs)": f"{GPT} -k n_layer=4 --gpus 8 --tensor-parallel 1 --stages 1 "
    "--sharding zero3 --target megatron",
    "zero3 fsdp hybrid t2 d8 (16 GPUs)": f"{GPT} -k n_layer=4 --gpus 16 --tensor-parallel 2 --stages 1 "
    "--sharding zero3 --shard-group 4 --target megatron",
    "zero3-step as distributed optimizer p2 (8 GPUs)": f"{GPT} -k n_layer=8 --gpus 8 --tensor-parallel 1 --stages 2 "
    "--sharding zero3-step",
    "tp comm overlap t2 sp p2 d4 (16 GPUs)": f"{GPT} -k n_layer=8 --gpus 16 --tensor-parallel 2 --stages 2 "
    "--sharding zero1 --overlap grad_reduce,param_gather,tp_comm=0.5,p2p --target megatron",
    "interleaved p4 v2 sends not overlapped (8 GPUs)": f"{GPT} -k n_layer=8 --gpus 8 --tensor-parallel 1 --stages 4 "
    "--schedule interleaved-1f1b --virtual 2 --overlap none",
    # the uniform memory choices (issue 24): selective recomputation, the block method, offload
    "selective p4": f"{GPT} -k n_layer=8 --stages 4 --schedule 1f1b --recompute-modules core_attn,layernorm,mlp",
    "selective mlp_act as mlp, interleaved p2 v2": f"{GPT} -k n_layer=8 --stages 2 --schedule interleaved-1f1b "
    "--virtual 2 --recompute-modules layernorm,mlp_act",
    "selective t2 sp p4 (8 GPUs)": f"{GPT} -k n_layer=8 --gpus 8 --tensor-parallel 2 --stages 4 --schedule 1f1b "
    "--recompute-modules core_attn,mlp",
    "llama selective p2": f"{LLAMA} --stages 2 --schedule 1f1b --recompute-modules layernorm,mlp",
    "block k=2 p4": f"{GPT} -k n_layer=12 --stages 4 --schedule 1f1b --recompute-layers 2",
    "block k=1 interleaved p2 v2": f"{GPT} -k n_layer=8 --stages 2 --schedule interleaved-1f1b --virtual 2 "
    "--recompute-layers 1",
    "offload p4": f"{GPT} -k n_layer=8 --stages 4 --schedule 1f1b "
    "--offload-modules attn_norm,qkv_linear,core_attn,attn_proj,mlp_norm",
    "offload t2 interleaved p2 v2 (4 GPUs)": f"{GPT} -k n_layer=8 --gpus 4 --tensor-parallel 2 --stages 2 "
    "--schedule interleaved-1f1b --virtual 2 --offload-modules core_attn,qkv_linear",
}
_FSDP = {"zero2": "optim_grads", "zero3": "optim_grads_params"}  # --data-parallel-sharding-strategy


def _slug(case: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", case.lower()).strip("-")


# --- the plans, in autopipe's venv ---------------------------------------------------------


def _autopipe(argv: list[str]) -> tuple[int, str]:
    from autopipe.cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    return code, out.getvalue()


def plan_layers(plan_path: Path) -> tuple[list[int], int]:
    """Layers per stage (model order) as the plan's block names say, a merged block ``a..b``
    expanded over the model's modules in their order, the layer list its largest ModuleList;
    and the model's multi-token-prediction modules (its ``mtp`` list)."""
    from torch import nn

    from autopipe.plans import Plan
    from autopipe.stages.rebuild import rebuild_model

    plan = Plan.load(plan_path)
    model = rebuild_model(plan, meta=True, base=plan_path.parent).model
    names = [n for n, _ in model.named_modules() if n]
    lists = [(len(m), n) for n, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    container = max(lists)[1]
    layer = re.compile(re.escape(container) + r"\.(\d+)$")
    counts = []
    for stage in plan.stages:
        held: set[str] = set()
        for block in stage.blocks:
            first, _, last = block.partition("..")  # a module's second use is named name@1 (graph/blocks.py)
            lo, hi = names.index(first.split("@")[0]), names.index((last or first).split("@")[0])
            held.update(n for n in names[lo : hi + 1] if layer.match(n))
        counts.append(len(held))
    return counts, len(getattr(model, "mtp", ()))


def _case(case: str, plan_args: str, folder: Path, plan_path: Path | None = None) -> dict[str, Any]:
    """One case: ``plan_path`` (planned from ``plan_args`` into ``folder`` when not given) and its
    Megatron arguments, written to ``folder``."""
    from autopipe.plans import Plan

    plan_path = plan_path or folder / f"{_slug(case)}.json"
    out_path = folder / f"{_slug(case)}.megatron.txt"
    if not plan_path.exists():
        code, text = _autopipe(["plan", *H100, *shlex.split(plan_args), "-o", str(plan_path)])
        if code:
            raise SystemExit(f"{case}: autopipe plan failed: {text.strip().splitlines()[-1]}")
    code, text = _autopipe(["config", str(plan_path), "--for", "megatron", "-o", str(out_path)])
    if code:
        raise SystemExit(f"{case}: autopipe config failed: {text.strip()}")
    printed = out_path.read_text()
    plan = Plan.load(plan_path)
    p, (counts, mtp) = plan.devices, plan_layers(plan_path)
    expected, first = [], 0
    for j, n in enumerate(counts):  # Megatron: chunk j on rank j % p, virtual stage j // p
        expected.append([j % p, j // p if plan.virtual > 1 and p > 1 else 0, first, n])
        first += n
    if p == 1:  # one rank: every layer in one chunk
        expected = [[0, 0, 0, sum(counts)]]
    launch = next(line for line in printed.splitlines() if line.startswith("# launch:"))
    words = shlex.split(launch[len("# launch:") :].split("  (")[0].replace("$(grep -v '^#' ARGS_FILE | xargs)", ""))
    env = dict(w.split("=", 1) for w in words[: words.index("torchrun")])
    nnodes, nproc = int(words[words.index("--nnodes") + 1]), int(words[words.index("--nproc-per-node") + 1])
    vocab = re.search(r"--vocab-size (\d+)", printed)
    argv = [w for line in printed.splitlines() if not line.startswith("#") for w in shlex.split(line)]
    return {
        "case": case,
        "plan": f"{plan.schedule}, p={p}, v={plan.virtual}, t={plan.tensor_parallel}, d={plan.data_parallel}",
        "layers": counts,
        "args": argv,
        "extra": [*EXTRA, "--vocab-size", vocab.group(1) if vocab else "512", *_told(printed)],
        "env": env,
        "world": nnodes * nproc,
        "expected": expected,
        "degrees": {  # what Megatron must derive: t, p, d, sequence parallelism, distributed optimizer
            "t": plan.tensor_parallel,
            "p": p,
            "d": plan.data_parallel,
            "sequence_parallel": bool(plan.sequence_parallel and plan.tensor_parallel > 1),
            "distributed_optimizer": bool(plan.shard_optimizer),
            **_data_parallel(plan),
        },
        "moe": {  # what Megatron must derive of the plan's experts (issue 25): ep, etp, the hidden all-to-all, MTP
            "ep": plan.expert_parallel,
            "etp": plan.expert_tensor_parallel,
            "overlap_moe_comm": bool(plan.overlap.expert_comm),
            "mtp": mtp,
        }
        if plan.expert_parallel > 1
        else {},
        "notes": [line[2:] for line in printed.splitlines() if line.startswith("# ")],
        "memory": {  # the plan's uniform memory choice in Megatron's names (a dense mlp_act runs as the mlp)
            "recompute_modules": sorted({"mlp" if k == "mlp_act" else k for k in plan.recompute_modules}),
            "recompute_layers": plan.recompute_layers,
            "offload_modules": sorted(plan.offload_modules),
        },
    }


def _data_parallel(plan: Any) -> dict[str, Any]:
    """What Megatron must derive of the plan's sharding and overlaps (after validate_args)."""
    D, over, p, v = plan.data_parallel, plan.overlap, plan.devices, plan.virtual
    interleaved = p > 1 and v > 1
    return {
        "fsdp": _FSDP.get(str(plan.sharding)),
        "instances": D // plan.shard_group if plan.shard_group else 1,
        "overlap_grad_reduce": bool(over.grad_reduce and D > 1),
        "overlap_param_gather": bool(over.param_gather and over.grad_reduce and D > 1 and plan.shard_optimizer),
        "tp_comm_overlap": bool(over.tp_comm > 0 and plan.tensor_parallel > 1 and plan.sequence_parallel),
        "overlap_p2p_comm": bool(interleaved and (over.p2p or p == 2)),  # Megatron overlaps two ranks' sends
    }


def _replace(argv: list[str], flag: str, new: list[str]) -> list[str]:
    """``argv`` with ``flag`` and its value replaced by ``new``."""
    i = argv.index(flag)
    return argv[:i] + new + argv[i + 2 :]


def controls(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Outputs Megatron must refuse or misplace, so the check shows it can fail: a tensor-parallel
    output without its launch line's environment, a Megatron-FSDP one with the environment tensor
    parallelism alone wants, a p = 2, v = 2 uneven split in the first/last form (what autopipe
    printed before), the dense MLP's activation named as autopipe names it, a coarse plan's
    output with the 22 layers its block names show, and a model's layout string without its
    multi-token-prediction layers (as printed before)."""
    by = {c["case"]: c for c in cases}
    out = []
    if (c := by.get("t2 sp zero1 p4 (16 GPUs)")) is not None:
        out.append({**c, "case": "control: " + c["case"] + " without CUDA_DEVICE_MAX_CONNECTIONS", "env": {}})
    if (c := by.get("interleaved p2 v2 uneven first/last")) is not None:
        first, last = (sum(n for r, _, _, n in c["expected"] if r == k) for k in (0, 1))
        form = ["--decoder-first-pipeline-num-layers", str(first), "--decoder-last-pipeline-num-layers", str(last)]
        form += ["--num-virtual-stages-per-pipeline-rank", "2"]
        args = _replace(c["args"], "--pipeline-model-parallel-layout", form)
        out.append({**c, "case": "control: " + c["case"] + " as first/last", "args": args})
    if (c := by.get("zero3 fsdp hybrid t2 d8 (16 GPUs)")) is not None:  # Megatron-FSDP asserts the opposite
        env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        out.append({**c, "case": "control: " + c["case"] + " with CUDA_DEVICE_MAX_CONNECTIONS=1", "env": env})
    if (c := by.get("selective mlp_act as mlp, interleaved p2 v2")) is not None:  # Megatron has no dense mlp_act
        i = c["args"].index("--recompute-modules")
        args = [*c["args"][: i + 1], "layernorm", "mlp_act", *c["args"][i + 3 :]]
        out.append({**c, "case": "control: " + c["case"] + " with mlp_act as printed before", "args": args})
    if (c := by.get("coarse --blocks 8 p4 (recompute)")) is not None:
        args = _replace(c["args"], "--num-layers", ["--num-layers", "22"])
        out.append({**c, "case": "control: " + c["case"] + " with --num-layers 22", "args": args})
    for c in cases:  # a model with MTP layers: its layout without them, as printed before (Megatron asserts)
        if c.get("moe", {}).get("mtp") and "--pipeline-model-parallel-layout" in c["args"]:
            layout = c["args"][c["args"].index("--pipeline-model-parallel-layout") + 1]
            args = _replace(
                c["args"],
                "--pipeline-model-parallel-layout",
                ["--pipeline-model-parallel-layout", layout.replace("m", "")],
            )
            out.append({**c, "case": "control: " + c["case"] + " without its MTP layer in the layout", "args": args})
    return [{**c, "control": True} for c in out]


def _told(printed: str) -> list[str]:
    """Arguments a ``#`` line tells this run to add: ``--no-rope-fusion`` (no Transformer Engine here)."""
    return ["--no-rope-fusion"] if re.search(r"^# rope: .*add --no-rope-fusion$", printed, re.M) else []


# --- the two steps ---------------------------------------------------------------------------


def build_env(a: argparse.Namespace) -> int:
    venv = Path(a.venv)
    if not (venv / "bin" / "python").exists():
        subprocess.run([a.python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch", CORE, "numpy", "packaging"], check=True)  # torch: the index's build (CPU is fine)
    if a.megatron_git:
        main = Path(a.main)
        main.mkdir(parents=True, exist_ok=True)
        commit = subprocess.run(
            ["git", "--git-dir", a.megatron_git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        git = ["git", "--git-dir", a.megatron_git, "archive", "HEAD", "megatron"]
        archive = subprocess.run(git, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(main)], input=archive.stdout, check=True)
        (main / "COMMIT").write_text(commit + "\n")
        print(f"Megatron-LM main {commit} in {main}")
    print(f"venv: {venv}")
    return 0


def _probe(venv: Path, cases_file: Path, main: Path | None) -> list[dict[str, Any]]:
    env = None
    if main is not None:
        import os

        env = {**os.environ, "PYTHONPATH": str(main)}
    result = subprocess.run(
        [str(venv / "bin" / "python"), str(ROOT / "tools" / "megatron_probe.py"), str(cases_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not rows:
        raise SystemExit(f"megatron_probe failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return rows


def _versions(venv: Path) -> str:
    code = "import torch, importlib.metadata as m; print(m.version('megatron-core'), torch.__version__)"
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True).stdout.strip()


def run(a: argparse.Namespace) -> int:
    folder = Path(a.work)
    folder.mkdir(parents=True, exist_ok=True)
    if a.published:  # plan files written by bench/bench_published.py --write-plans DIR
        given = sorted(Path(a.published).glob("*.json"))
        if not given:
            raise SystemExit(
                f"no plan files in {a.published}: write them with bench/bench_published.py --write-plans DIR"
            )
        planned = [(p.stem, "", p) for p in given if not a.only or any(o in p.stem for o in a.only)]
    else:
        planned = [(c, PLANS[c], None) for c in PLANS if not a.only or any(o in c for o in a.only)]
    cases = []
    for case, plan_args, plan_path in planned:
        cases.append(_case(case, plan_args, folder, plan_path))
        print(f"planned: {case}: {cases[-1]['plan']}, layers {cases[-1]['layers']}", flush=True)
    cases += controls(cases)
    cases_file = folder / "cases.json"
    cases_file.write_text(json.dumps(cases, indent=1))
    venv = Path(a.venv)
    runs = {"core": _probe(venv, cases_file, None)}
    main = Path(a.main)
    commit = (main / "COMMIT").read_text().strip() if (main / "COMMIT").exists() else None
    if commit:
        runs["main"] = _probe(venv, cases_file, main)
    results = {"versions": _versions(venv), "main_commit": commit, "runs": runs, "cases": cases}
    (folder / "results.json").write_text(json.dumps(results, indent=1))
    core, torch = [*results["versions"].split(), "?", "?"][:2]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    text = (
        f"megatron-core {core} (the package index's wheel) and Megatron-LM main {commit or '(not checked)'}, "
        f"torch {torch} on CPU (device reported as Hopper, compute capability 9.0), {when}\n\n{table(results)}\n"
    )
    (folder / "results.md").write_text(text)
    print(text)
    bad = [
        row["case"]
        for rows in runs.values()
        for case, row in zip(cases, rows[1:], strict=True)
        if (row["accepted"] == "yes" and row["placement"] == "yes") == bool(case.get("control"))
    ]
    print("all as expected" if not bad else f"not as expected: {bad}")
    return 1 if bad else 0


def split_form(argv: list[str]) -> str:
    """Which of Megatron's split forms the arguments use."""
    for flag, name in (
        ("--pipeline-model-parallel-layout", "layout"),
        ("--decoder-first-pipeline-num-layers", "first/last"),
        ("--decoder-last-pipeline-num-layers", "first/last"),
        ("--num-layers-per-virtual-pipeline-stage", "even, v"),
    ):
        if flag in argv:
            return name
    return "even" if argv[argv.index("--pipeline-model-parallel-size") + 1] != "1" else "none"


def _config(row: dict[str, Any]) -> str:
    """Megatron's own config, in short: ``t=2 d=2 sp dist-opt bf16 full/uniform/4``."""
    c = row.get("config")
    if not c:
        return "-"
    words = [f"t={c['t']}", f"d={c['data_parallel']}"]
    words += [name for name, on in (("sp", c["sequence_parallel"]), ("dist-opt", c["distributed_optimizer"])) if on]
    words += [f"fsdp {c['fsdp']}"] if c.get("fsdp") else []
    words += [f"{c['instances']} instances"] if c.get("instances", 1) > 1 else []
    overlaps = (("grad", "overlap_grad_reduce"), ("param", "overlap_param_gather"), ("tp", "tp_comm_overlap"))
    overlaps += (("p2p", "overlap_p2p_comm"),)
    said = [name for name, key in overlaps if c.get(key)]
    words += ["overlap " + "+".join(said)] if said else []
    words += ["bf16"] if c["bf16"] else []
    words += ["/".join(str(x) for x in c["recompute"])] if c["recompute"][0] else []
    words += [f"modules {'+'.join(c['recompute_modules'])}"] if c.get("recompute_modules") else []
    words += [f"offload {'+'.join(c['offload_modules'])}"] if c.get("offload_modules") else []
    return " ".join(words)


def table(results: dict[str, Any]) -> str:
    runs = results["runs"]
    heads = [f"{name} ({rows[0]['megatron_core']})" for name, rows in runs.items()]
    lines = [
        "| plan | autopipe plan | layers per stage | split | Megatron's config | "
        + " | ".join(f"{h}: accepted | placement" for h in heads)
        + " |",
        "| --- | --- | --- | --- | --- | " + " | ".join("--- | ---" for _ in heads) + " |",
    ]
    for i, case in enumerate(results["cases"]):
        cells = []
        for rows in runs.values():
            row = rows[i + 1]
            cells += [row["accepted"].replace("|", "\\|"), (row["placement"] or "-").replace("|", "\\|")]
        layers = "/".join(map(str, case["layers"]))
        first = next(iter(runs.values()))[i + 1]
        head = f"| {case['case']} | {case['plan']} | {layers} | {split_form(case['args'])} | {_config(first)} | "
        lines.append(head + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("env", "run"))
    parser.add_argument("--python", default=PYTHON312, help="a Python 3.12 for the venv")
    parser.add_argument("--venv", default=str(WORK / "venv"))
    parser.add_argument("--main", default=str(WORK / "megatron-main"), help="Megatron-LM main's megatron/ goes here")
    parser.add_argument("--megatron-git", help="a git directory of NVIDIA/Megatron-LM (env: unpack its HEAD)")
    parser.add_argument("--work", default=str(WORK / "plans"), help="plans, configs and results")
    parser.add_argument("--only", action="append", help="cases whose name contains this (repeatable)")
    parser.add_argument(
        "--published", metavar="DIR", help="check the plans bench/bench_published.py --write-plans DIR wrote instead"
    )
    a = parser.parse_args()
    return build_env(a) if a.step == "env" else run(a)


if __name__ == "__main__":
    sys.exit(main())
