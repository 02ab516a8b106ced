"""The pure parts of planning for a cluster: the pinned degrees checked, the cluster's fields
read, tensor parallelism priced per degree, and what a sharding makes of a pipeline search.
:func:`autopipe.api.plan_cluster` composes them (model file -> counts -> the tensor x pipeline x
data-parallel search, :mod:`autopipe.planner.parallel`), as ``autopipe plan MODEL --device NAME
--gpus G`` does:

    import autopipe
    plan = autopipe.plan_cluster("models/gpt.py", kwargs={"preset": "gpt3-175b"}, device="h100",
                                 gpus=64, batch_size=1536, memory="80GB")
    plan.tensor_parallel, plan.devices, plan.data_parallel, plan.sharding   # t, p, d, ZeRO

Its modules: :mod:`.degrees` (the pinned degrees, the cluster's fields, tensor parallelism per
degree), :mod:`.experts` (context and expert parallelism: the degrees searched, the experts'
state over their own group, the all-to-all hidden), :mod:`.sharding` (the shardings a target
runs, and what each does to a search's memory and blocks), :mod:`.values` (the search's request
and result), :mod:`.split` (one split searched with its shardings).

A sharding (``planner.placement``'s formulas) changes a pipeline search in three ways: the state
each device keeps per parameter (the search's ``state_factor``), what a block gathers or reduces
per micro-batch (zero2, zero3: added to its times, :func:`sharded_profile`, hidden behind its
computation as far as the overlap allows), and what a chunk reduces and gathers once a step
(:func:`data_parallel_s`: past the pipeline's end, or overlapped with its last backward and first
forward as the simulated timeline allows, ``simulate.overlap``).
"""

from autopipe.planner.cluster.degrees import TensorOptions, check_degrees, cluster_fields, tensor_options
from autopipe.planner.cluster.sharding import (
    NO_SHARDING,
    ShardOption,
    element_bytes,
    group_of,
    least_step_comm,
    shard_options,
    sharded_profile,
    state_factor,
    target_overlap,
    transient,
)
from autopipe.planner.cluster.split import data_parallel_s, restamp, split_options, with_transient
from autopipe.planner.cluster.values import ParallelOption, ParallelPlan, ParallelRequest, Rejected

__all__ = [
    "NO_SHARDING",
    "ParallelOption",
    "ParallelPlan",
    "ParallelRequest",
    "Rejected",
    "ShardOption",
    "TensorOptions",
    "check_degrees",
    "cluster_fields",
    "data_parallel_s",
    "element_bytes",
    "group_of",
    "least_step_comm",
    "restamp",
    "shard_options",
    "sharded_profile",
    "split_options",
    "state_factor",
    "target_overlap",
    "tensor_options",
    "transient",
    "with_transient",
]
