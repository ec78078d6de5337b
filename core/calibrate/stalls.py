"""Stalls of a shared machine, measured from what clients heard: the input of `Calibration.stalls`.

On a CPU server that shares its cores (the 2-core machines here run the client, vLLM's API process, its engine
and other people's work), streams do not slow down evenly: now and then nothing reaches any client for tens or
hundreds of milliseconds, then everything resumes. Per-step noise that is independent step to step averages
out over a 64-token request and cannot produce that; a stall delays every request in flight at once, and it
is what puts such a server's p99 at several times its median.

How a sweep point is read: the arrival times of all chunks of all requests are merged into one stream. A gap
in it counts as observed time when some request was mid-stream across the whole gap (between its first and
its last chunk), so client think time and request hand-offs are not mistaken for stalls. A gap longer than
`STALL_FACTOR` times the point's typical step (the median gap between a request's consecutive chunks) is a
stall; its duration is the gap minus that typical step. Over all points and repeats of a sweep, the stall
rate is the number of stalls per observed second, and their durations are summarised by mean and
coefficient of variation (the simulator draws them lognormal, core/sim/replica.StallClock).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from core.profile import StallModel
from core.records import RequestRecord

# A gap of ten typical steps: far beyond per-step noise (noise_cv of a few tens of percent), short enough to
# catch the pauses that decide a p99 (tens of milliseconds on a 2-3 ms step).
STALL_FACTOR = 10.0
# Fewer stalls than this over a whole sweep say little about their rate and nothing about their durations:
# the calibration then leaves stalls out (a dedicated machine).
MIN_STALLS = 3


@dataclass(slots=True)
class StallSample:
    """What one measured run of a point says about stalls."""

    observed_s: float = 0.0  # time some request was mid-stream
    typical_step_s: float | None = None
    durations_s: list[float] = field(default_factory=list)
    # (start, end) of each stall on the run's clock: the part of its gap beyond one typical step.
    intervals: list[tuple[float, float]] = field(default_factory=list)

    def stalled_within(self, start_s: float, end_s: float) -> float:
        """Stall time inside [start_s, end_s]: how much of a request's latency the machine's stalls took."""
        return sum(max(0.0, min(end, end_s) - max(start, start_s)) for start, end in self.intervals)


def observe_stalls(records: list[RequestRecord], factor: float = STALL_FACTOR) -> StallSample:
    """Stalls in one run's records (warm-up requests included: they were on the server too)."""
    timed = [
        np.asarray(r.chunk_times, dtype=float) for r in records if r.chunk_times is not None and len(r.chunk_times) > 1
    ]
    if not timed:
        return StallSample()
    step_gaps = np.concatenate([np.diff(t) for t in timed])
    step_gaps = step_gaps[step_gaps > 0]  # chunks read together are one arrival, not a step
    if len(step_gaps) == 0:
        return StallSample()
    typical = float(np.median(step_gaps))
    arrivals = np.sort(np.concatenate(timed))
    starts = np.array([t[0] for t in timed])
    ends = np.array([t[-1] for t in timed])
    left, right = arrivals[:-1], arrivals[1:]
    gaps = right - left
    # A gap is observed when one request spans it: started at or before its left end, ended at or after its
    # right end. Streams overlap heavily, so test against the widest span starting by each left end.
    order = np.argsort(starts)
    latest_end_by_start = np.maximum.accumulate(ends[order])
    index = np.searchsorted(starts[order], left, side="right") - 1
    spanned = (index >= 0) & (latest_end_by_start[np.maximum(index, 0)] >= right)
    observed = gaps[spanned]
    stalled = spanned & (gaps > factor * typical)
    intervals = [(float(start) + typical, float(end)) for start, end in zip(left[stalled], right[stalled], strict=True)]
    return StallSample(float(observed.sum()), typical, [end - start for start, end in intervals], intervals)


def fit_stalls(samples: list[StallSample], min_stalls: int = MIN_STALLS) -> StallModel | None:
    """Rate per observed second, mean and CV of durations over every sample; None with too few stalls."""
    observed = sum(s.observed_s for s in samples)
    durations = np.array([d for s in samples for d in s.durations_s], dtype=float)
    if observed <= 0 or len(durations) < min_stalls:
        return None
    mean = float(durations.mean())
    cv = float(durations.std() / mean) if mean > 0 else 0.0
    return StallModel(rate_per_s=len(durations) / observed, mean_s=mean, cv=cv)
