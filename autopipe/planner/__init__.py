"""The planner: the search over cuts x micro-batches x schedule x virtual stages x recomputation
for one pipeline (:func:`plan_pipeline`), a user's own split priced (:func:`plan_balance`), and
the tensor x pipeline x data search for a cluster (:func:`plan_parallel`).

It prices candidates with :mod:`autopipe.simulate` and cuts with the kernels of
:mod:`autopipe.partition`.
"""

from autopipe.planner.balance import plan_balance
from autopipe.planner.parallel import ParallelPlan, ParallelRequest, plan_parallel
from autopipe.planner.request import PlanRequest
from autopipe.planner.search import plan_pipeline

__all__ = ["ParallelPlan", "ParallelRequest", "PlanRequest", "plan_balance", "plan_parallel", "plan_pipeline"]
