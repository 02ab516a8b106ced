"""Plain functions the tests share (fixtures live in tests/conftest.py).

Import them as ``from tests.helpers import even_plan``: the repository root is on the path
(``pythonpath`` in pyproject.toml), so this works from every folder under tests/.

- :func:`even_plan`: a Plan without profiling. Profiling takes seconds per model; tests of the
  executor, emit and export only need a valid cut, so they build the Plan straight from a
  trace (predictions are nominal: 1 ms forwards).
- :func:`call`: ``autopipe ARGV`` in this process (the fuzz tests' runner), its :class:`Outcome`.
- :func:`reference_training`, :func:`max_diff`: single-process training of the unsplit model,
  the reference the pipeline's losses and weights are compared with.
"""

from __future__ import annotations

import dataclasses
import io
import signal
import subprocess
from collections.abc import Mapping, Sequence
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import torch
from autopipe.cli.main import main
from torch import nn

from autopipe.costs.profile import Affine, BlockCost, Profile, TensorCost
from autopipe.graph.recipe import TraceRecipe
from autopipe.graph.trace import TracedModel, trace_model
from autopipe.model.load import call_model, load_model, parse_kwargs
from autopipe.plans import Plan, StagePlan
from autopipe.schedules import schedule_spec

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "models"
FIXTURES = ROOT / "tests" / "fixtures"

_TRACES: dict[tuple[object, ...], TracedModel] = {}  # even_plan(reuse_trace=True)


def even_plan(
    model: str,
    kwargs: Mapping[str, object] | Sequence[str] = (),
    *,
    stages: int = 2,
    schedule: str = "1f1b",
    virtual: int = 1,
    micro_batches: int = 2,
    micro_batch_size: int = 2,
    recompute: Sequence[int] = (),
    tracer: str = "auto",
    device: str | None = None,
    leaf_modules: Sequence[str] = (),
    reuse_trace: bool = False,
) -> Plan:
    """A plan that cuts ``model``'s blocks evenly into ``stages * virtual`` stages.

    ``model``: a path, or a file name in models/ (``"gpt.py"``) where no such path exists here;
    ``kwargs``: the factory's keyword arguments, as a mapping or as ``"key=value"`` strings;
    ``recompute``: the indices of the stages to recompute. ``reuse_trace``: take the trace of
    an earlier call with the same model file (same bytes), arguments, micro-batch size, tracer
    and leaf modules instead of building and tracing the model again (seconds for a Hugging
    Face model); the plan is the same, only the global RNG is left as it was.
    """
    path = Path(model) if Path(model).exists() or "/" in model else MODELS / model
    if isinstance(kwargs, Mapping):
        given = dict(kwargs)
        words = tuple(f"{k}={v!r}" for k, v in given.items())
    else:
        words = tuple(kwargs)
        given = parse_kwargs(list(words))
    recipe = TraceRecipe(model_file=str(path), model_kwargs=words, tracer=tracer, leaf_modules=tuple(leaf_modules))
    key = (str(path.resolve()), path.read_bytes(), recipe, device, micro_batch_size) if reuse_trace else None
    traced = _TRACES.get(key) if key is not None else None
    if traced is None:
        torch.manual_seed(0)
        loaded = load_model(str(path), given, device=device)
        traced = trace_model(
            loaded.model,
            loaded.make_inputs(micro_batch_size),
            micro_batch_size=micro_batch_size,
            recipe=recipe,
            source=loaded.spec.path,
        )
        if key is not None:
            _TRACES[key] = traced
    n, parts = traced.num_blocks, stages * virtual
    if n < parts:
        raise ValueError(f"{model} has {n} blocks, fewer than {parts} stages")
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    stage_plans = []
    for j in range(parts):
        mine = traced.blocks[bounds[j] : bounds[j + 1]]
        stage_plans.append(
            StagePlan(
                index=j,
                rank=schedule_spec(schedule).device_of(j, stages, virtual),
                blocks=tuple(b.name for b in mine),
                block_indices=tuple(b.index for b in mine),
                nodes=tuple(x for b in mine for x in b.nodes),
                params=0,
                forward_s=1e-3,
                backward_s=2e-3,
                backward_input_s=1e-3,
                backward_weight_s=1e-3,
                recompute=j in recompute,
                memory_bytes=0.0,
                static_bytes=0.0,
                activation_bytes=0.0,
                held_bytes=0.0,
                send_bytes=0.0,
            )
        )
    return Plan(
        model=f"{path}:build_model",
        recipe=dataclasses.replace(recipe, tracer=traced.tracer, fingerprint=traced.fingerprint()),
        profile_device="cpu",
        devices=stages,
        virtual=virtual,
        schedule=schedule,
        micro_batches=micro_batches,
        micro_batch_size=micro_batch_size,
        batch_size=micro_batches * micro_batch_size,
        memory_limit_bytes=2.0**30,
        link_bandwidth=1e9,
        link_latency_s=0.0,
        recompute_policy="never",
        stages=tuple(stage_plans),
        iteration_time_s=1e-2,
        bubble_fraction=0.2,
        throughput=1.0,
        peak_memory_bytes=(1e6,) * stages,
        alternatives=(),
        baselines=(),
    )


def reference_training(
    model_file: str,
    kwargs: Mapping[str, object],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    optimizer: str = "SGD",
    seed: int = 0,
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and final state_dict of plain single-process training of the unsplit model."""
    torch.manual_seed(seed)
    lm = load_model(model_file, dict(kwargs))
    model = lm.model
    model.train()
    opt = getattr(torch.optim, optimizer)(list(model.parameters()), lr=lr)
    losses = []
    for k in range(steps):
        torch.manual_seed(seed + k + 1)
        x = lm.make_inputs(batch_size)
        y = lm.make_targets(batch_size) if lm.make_targets is not None else None
        loss = lm.loss_fn(call_model(model, x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Largest absolute difference over the keys of ``b`` (all must be in ``a``)."""
    missing = sorted(set(b) - set(a))
    if missing:
        raise AssertionError(f"missing from the pipeline's state: {missing[:5]}")
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in b if b[k].numel())


GOOD_MLP = "tests/fixtures/good_mlp.py"


def hand_profile() -> Profile:
    """Two blocks measured at u = 1, 4; costs chosen so the numbers are easy to check."""

    def block(name: str, params: int, fwd_ms: float) -> BlockCost:
        per_u = Affine(0.0, fwd_ms * 1e-3)  # fwd_ms per sample
        return BlockCost(
            name=name,
            nodes=(name,),
            params=params,
            param_bytes=4 * params,
            forward_s=per_u,
            backward_s=Affine(0.0, 2 * fwd_ms * 1e-3),
            backward_input_s=per_u,
            backward_weight_s=per_u,
            saved_bytes=Affine(0.0, 2.0**20),  # 1 MiB per sample
        )

    return Profile(
        model=f"{GOOD_MLP}:build_model",
        recipe=TraceRecipe(tracer="fx", fingerprint="abc"),
        device="cpu (1 threads)",
        torch_version=torch.__version__,
        dtype="float32",
        micro_batch_sizes=(1, 4),
        method="measured",
        blocks=(block("layers.0", 272, 0.5), block("head", 1_500_000, 0.25)),
        tensors=(
            TensorCost("x", -1, (0,), Affine(0.0, 64.0)),
            TensorCost("layers_0", 0, (1,), Affine(0.0, 2.0**19)),  # 0.5 MiB per sample
            TensorCost("head", 1, (), Affine(0.0, 16.0)),
        ),
    )


class Layer(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))  # (B, T, C)


class Net(nn.Module):
    """A small transformer-like net: embedding, n residual MLP layers, head (B, T) -> (B, T, vocab)."""

    def __init__(self, d: int = 128, n: int = 4, vocab: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Layer(d) for _ in range(n)])
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def wait_ranks(procs: list[subprocess.Popen[str]], timeout: float) -> list[str]:
    """Each process's output once all have exited (killed if still running after ``timeout``: a hang);
    AssertionError with the logs' tails if any exited non-zero."""
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    return logs


# ----------------------------------------------------------------------------- one command, in this process

LIMIT_S = 60.0  # a hang, not a slow case: each takes well under a second, a busy machine adds time


class Launched(Exception):
    """``run`` got past every check and asked to start its ranks."""


class _TimedOut(Exception):
    pass


@dataclass(frozen=True)
class Outcome:
    code: int | str  # the exit code, or what escaped main
    err: str
    out: str = ""

    def problem(self) -> str | None:
        if isinstance(self.code, str):
            return self.code
        lines = self.err.strip("\n").split("\n") if self.err.strip() else []
        if self.code == 2 and (len(lines) != 1 or not lines[0].startswith("autopipe: error: ")):
            return f"exit 2 with {len(lines)} line(s) on stderr: {self.err[:300]!r}"
        if self.code not in (0, 2):
            return f"exit {self.code}: {self.err[:300]!r}"
        return None


def _on_alarm(signum: int, frame: object) -> None:
    raise _TimedOut()


def call(argv: list[str]) -> Outcome:
    """``autopipe ARGV`` in this process, stdout and stderr captured, cut off after LIMIT_S."""
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
    code: int | str
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
    except Launched:
        code = 0
    except _TimedOut:
        code = f"still running after {LIMIT_S:.0f} s"
    except BaseException as e:
        code = f"{type(e).__name__} escaped main: {str(e)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return Outcome(code, err.getvalue(), out.getvalue())
