"""A replica's recent step lengths, which AdaServe's planner reads to judge whether a request's SLO is at stake
(issue 21: speculation only where it can pay; policy.TreePlanner._slo_at_stake)."""

from __future__ import annotations

from typing import ClassVar


class StepLengths:
    """A replica's step lengths as running sums, so the mean of the last k steps costs O(1)."""

    # Steps kept (more than any request's output tokens; older ones are dropped in halves). ClassVar: policy.py
    # reads it through the class, which mypyc allows only for a declared class attribute.
    KEEP: ClassVar[int] = 1 << 16

    def __init__(self) -> None:
        self.sums = [0.0]  # sums[i]: the first i steps kept, in seconds

    def add(self, seconds: float) -> None:
        sums = self.sums
        sums.append(sums[-1] + seconds)
        if len(sums) > 2 * self.KEEP:
            del sums[: self.KEEP]

    def mean_of_last(self, k: int) -> float:
        """Mean length of the last `k` steps (of all there are, when fewer; 0.0 before the first)."""
        sums = self.sums
        k = min(k, len(sums) - 1)
        return (sums[-1] - sums[-1 - k]) / k if k > 0 else 0.0
