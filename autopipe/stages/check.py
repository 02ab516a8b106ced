"""Check a plan against the model it was made for, before anything is cut or started.

A plan file says which blocks (and fx nodes) each stage holds; the model, rebuilt and traced
again (:func:`~autopipe.stages.rebuild.trace_for_plan`), says which there are. They must agree
exactly: the same trace (fingerprint), every block on one stage, whole, and no block reading
a value of a later stage. :func:`check_plan` says where they first differ, in one
line, and how to get a plan that fits (``autopipe plan`` for this model) -- so ``run``,
``emit`` and ``export`` fail in the launcher within seconds, not inside ranks with a KeyError.

The plan's fields on their own (types, ranges, the batch, where the schedule puts each stage)
are checked when it is read (:func:`autopipe.plans.check_plan_values`).
"""

from __future__ import annotations

import shlex

from autopipe.errors import PlanError
from autopipe.graph.trace import TracedModel, structure_hash
from autopipe.plans import Plan

IN_MEMORY = ("", "<model>")  # a recipe's model_file when the model was planned from Python (autopipe.plan(model, ...))

__all__ = ["check_plan", "replan_hint"]


def replan_hint(plan: Plan) -> str:
    """``plan again with 'autopipe plan MODEL -k ...'`` for the plan's model, on one line."""
    recipe = plan.recipe
    if recipe.model_file in IN_MEMORY:  # planned in Python: no command can plan it again
        return "plan again in Python with autopipe.plan(model, example_inputs, ...)"
    words = [recipe.model_file, *(w for k in recipe.model_kwargs for w in ("-k", k))]
    command = " ".join(shlex.quote(w) for w in ["autopipe", "plan", *words])
    if not command.isprintable():  # a newline or control character in a path: show it escaped
        command = repr(command)[1:-1]
    return f"plan again with '{command}'"


def check_plan(plan: Plan, traced: TracedModel) -> None:
    """PlanError (one line: which stage, what, how to fix) unless ``plan``'s stages are exactly
    ``traced``'s blocks: same fingerprint, every block on one stage, whole, data flowing forward."""
    again = replan_hint(plan)
    if plan.tensor_parallel > 1:
        raise PlanError(
            f"the plan splits each layer over {plan.tensor_parallel} tensor-parallel devices, which "
            "autopipe's executor and emitted stages do not do (they hold whole layers); train it with "
            "Megatron-LM or torchtitan ('autopipe config PLAN --for megatron'), or plan it again "
            "with --tensor-parallel 1"
        )
    if plan.expert_parallel > 1 or plan.expert_tensor_parallel > 1 or plan.context_parallel > 1:
        raise PlanError(
            f"the plan shards the experts over {plan.expert_parallel} x {plan.expert_tensor_parallel} expert-parallel "
            f"devices and the sequence over {plan.context_parallel} context-parallel devices, which autopipe's "
            "executor and emitted stages do not do (they hold whole layers and whole samples); train it with "
            "Megatron-LM or torchtitan ('autopipe config PLAN --for megatron'), or plan it again without expert "
            "and context parallelism"
        )
    want = plan.recipe.fingerprint
    if not want:  # every plan autopipe writes has one: an emptied one would skip the model's identity
        raise PlanError(
            f"the plan has no model fingerprint (recipe.fingerprint is empty), so it cannot be checked "
            f"against the model; {again}"
        )
    if traced.fingerprint() != want:
        priced = _priced_dtype(plan, traced)
        if priced is not None:
            raise PlanError(
                f"the plan was priced for this model in {plan.precision} ({plan.profile_device}), and here it builds "
                f"in {priced}: an analytic plan is for the devices it was counted on (train it there: 'autopipe "
                f"config PLAN --for megatron' or '--for torchtitan'); to run it on this machine, "
                f"{again.replace('plan again', 'plan it here', 1)}"
            )
        raise PlanError(
            f"the plan was made for another model (fingerprint {want}, this model traces to "
            f"{traced.fingerprint()}); {again}"
        )
    n = traced.num_blocks
    stage_of: dict[int, int] = {}  # block -> the stage that holds it
    for st in plan.stages:
        previous = -1
        for name, b in zip(st.blocks, st.block_indices, strict=True):
            if b >= n:
                raise PlanError(
                    f"stage {st.index} holds block {b}, but the model has {n} blocks (0 .. {n - 1}); {again}"
                )
            if b in stage_of:
                raise PlanError(
                    f"stage {st.index} holds block {b} ({traced.blocks[b].name!r}), "
                    f"which stage {stage_of[b]} holds too; {again}"
                )
            if b < previous:
                raise PlanError(
                    f"stage {st.index} lists block {b} after block {previous}: "
                    f"a stage's blocks go in the model's order; {again}"
                )
            if traced.blocks[b].name != name:
                raise PlanError(
                    f"stage {st.index} calls block {b} {name!r}, "
                    f"but in the model it is {traced.blocks[b].name!r}; {again}"
                )
            stage_of[b], previous = st.index, b
        _check_nodes(plan, traced, st.index, again)
    missing = [b for b in range(n) if b not in stage_of]
    if missing:
        names = ", ".join(repr(traced.blocks[b].name) for b in missing[:3])
        raise PlanError(
            f"{len(missing)} block(s) of the model are on no stage "
            f"({names}{' ...' if len(missing) > 3 else ''}); {again}"
        )
    for src, dst in sorted({(e.src, e.dst) for e in traced.edges}):  # (no networkx graph needed)
        if stage_of[src] > stage_of[dst]:
            raise PlanError(
                f"stage {stage_of[dst]} holds block {dst} ({traced.blocks[dst].name!r}), which reads block {src} "
                f"({traced.blocks[src].name!r}) of the later stage {stage_of[src]}: data must flow forward; {again}"
            )


def _check_nodes(plan: Plan, traced: TracedModel, index: int, again: str) -> None:
    """Stage ``index``'s nodes are exactly those of its blocks, in graph order."""
    st = plan.stages[index]
    want = [x for b in st.block_indices for x in traced.blocks[b].nodes]
    if list(st.nodes) == want:
        return
    mine = set(st.block_indices)
    for node in st.nodes:
        if node not in traced.block_of:
            raise PlanError(f"stage {index} has node {node!r}, which the model does not have; {again}")
        b = traced.block_of[node]
        if b not in mine:
            raise PlanError(
                f"stage {index} has node {node!r} of block {b} ({traced.blocks[b].name!r}), which is on another "
                f"stage: a stage cut in the middle of a block; {again}"
            )
    missing = [x for x in want if x not in set(st.nodes)]
    if missing:
        b = traced.block_of[missing[0]]
        raise PlanError(
            f"stage {index} lacks node {missing[0]!r} of its block {b} ({traced.blocks[b].name!r}): "
            f"a block cut in the middle; {again}"
        )
    raise PlanError(f"stage {index} lists its nodes twice or out of the model's order; {again}")


_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32", "tf32": "torch.float32"}


def _priced_dtype(plan: Plan, traced: TracedModel) -> str | None:
    """The dtype ``traced``'s parameters have where the plan's fingerprint is of the same model in the
    precision it was priced in (an analytic bf16 plan, run in fp32 here); None when more differs."""
    if plan.precision is None:
        return None
    priced = _DTYPES[plan.precision]
    params = [(n, tuple(p.shape), priced) for n, p in traced.gm.named_parameters(remove_duplicate=False)]
    if structure_hash(traced.tracer, params, [(b.name, b.nodes) for b in traced.blocks]) != plan.recipe.fingerprint:
        return None
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in traced.gm.parameters()})
    return ", ".join(dtypes) or None
