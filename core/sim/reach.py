"""Which other knob values would have produced exactly the same simulated run (issue 22: the tune's sweep).

A simulated fcfs run consults `max_num_seqs` and the open loop's in-flight cap only through comparisons:
the engine admits while the running count is below `max_num_seqs` (core/sim/replica.py), the client sends
while fewer than `concurrency` requests are in flight (core/sim/clients.py). Every random draw, step time and
record follows from the outcomes of those comparisons and from nothing else that the two knobs touch. So if
every comparison a run made would have come out the same under other values, the run under those values is
the same run, draw for draw, record for record: not an approximation of it.

- max_num_seqs: the run compared running counts up to `seqs_probe`; any value above it passes all of them.
- concurrency (open loop): if the cap never held a request back, the most in flight at once was
  `peak_in_flight`; any cap of at least that, or none, holds nobody back either. A closed loop's concurrency
  is its number of clients, which shapes the arrivals themselves: only its own value.

The tune's sweep measures every configuration reachable from the start on the simulator (core/tune/guided.py):
at quickstart's 405 configurations, several seqs values above a low client cap are one run measured many
times. `SimSegmentRunner` (core/tune/segment.py) keeps each run's reach and answers a covered configuration
from it; `tests/test_sim_reach.py` holds the reused measurement to a fresh one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.pickling import reduce_by_fields


@dataclass(frozen=True, slots=True)
class RunReach:
    """The knob values a run stands for: (concurrency, max_num_seqs) pairs whose run is this one.

    `concurrency` None is no cap. `seqs_above`: every max_num_seqs above it, or None when only the run's own
    value is (the count reached it: a larger one would have admitted more). `cap_from`: every cap of at least
    it and no cap, or None when only the run's own concurrency is (a closed loop, or an open-loop cap that held
    requests back)."""

    concurrency: int | None
    max_num_seqs: int
    seqs_above: int | None
    cap_from: int | None

    def covers(self, concurrency: int | None, max_num_seqs: int) -> bool:
        if max_num_seqs != self.max_num_seqs and (self.seqs_above is None or max_num_seqs <= self.seqs_above):
            return False
        if concurrency == self.concurrency:
            return True
        return self.cap_from is not None and (concurrency is None or concurrency >= self.cap_from)

    def joined(self, other: RunReach) -> RunReach:
        """The reach of a measurement made of this run and `other` (the same knobs): what both stand for."""
        if (other.concurrency, other.max_num_seqs) != (self.concurrency, self.max_num_seqs):
            raise ValueError("runs of different knobs do not join")
        caps = None if self.cap_from is None or other.cap_from is None else max(self.cap_from, other.cap_from)
        seqs = None if self.seqs_above is None or other.seqs_above is None else max(self.seqs_above, other.seqs_above)
        return RunReach(self.concurrency, self.max_num_seqs, seqs, caps)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


def run_reach(
    concurrency: int | None, max_num_seqs: int, *, seqs_probe: int, open_loop: bool, peak_in_flight: int, cap_held: bool
) -> RunReach:
    """A run's reach from what its engine and clients observed (see the module's docstring)."""
    cap_from = peak_in_flight if open_loop and not cap_held else None
    # The running count never passes max_num_seqs; reaching it is where the knob decided something.
    seqs_above = seqs_probe if seqs_probe < max_num_seqs else None
    return RunReach(concurrency, max_num_seqs, seqs_above, cap_from)
