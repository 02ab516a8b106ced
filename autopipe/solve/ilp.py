from autopipe.solve.problem import Partition, PartitionProblem
def solve_ilp(problem: PartitionProblem, time_limit_s: float = 60.0) -> Partition:
    raise NotImplementedError
