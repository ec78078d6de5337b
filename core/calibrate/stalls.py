"""Stalls of a shared machine, measured from what clients heard: the input of `Calibration.stalls`.

On a CPU server that shares its cores (the 2-core machines here run the client, vLLM's API process, its engine
and other people's work), streams do not slow down evenly: now and then nothing reaches any client for tens or
hundreds of milliseconds, then everything resumes. Per-step noise that is independent step to step averages
out over a 64-token request and cannot produce that; a stall delays every request in flight at once, and it
is what puts such a server's p99 at several times its median.

How a sweep point's decode runs are read: the send times and chunk arrival times of all requests are merged into
one stream. A gap in it counts as observed time when some request was in flight across the whole gap (sent before
it, last chunk after it), so client think time is not mistaken for a stall. A gap longer than `STALL_FACTOR` times
the point's typical step (the median gap between a request's consecutive chunks, and never less than the engine's
own step where /metrics gives it) is a stall; its duration is what is left of the gap after one typical step per
token of the burst that ends it (the engine made those tokens during the silence). Over all points and repeats of a
sweep, the stall rate is the number of stalls per observed second, and their durations are summarised by mean and
coefficient of variation (the simulator draws them lognormal, core/sim/stalls.StallClock).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from core.profile import StallModel
from core.records import RequestRecord

# A gap of ten typical steps: far beyond per-step noise (noise_cv of a few tens of percent), short enough to
# catch the pauses that decide a p99 (tens of milliseconds on a 2-3 ms step).
STALL_FACTOR = 10.0
# Chunks of one request closer together than this share of the typical step arrived as one burst (one write
# of the API process, read in pieces), not as separate steps.
BURST_GAP_SHARE = 0.5
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


def observe_stalls(
    records: list[RequestRecord], factor: float = STALL_FACTOR, step_floor_s: float | None = None
) -> StallSample:
    """Stalls in one run's records (warm-up requests included: they were on the server too).

    `step_floor_s`: the engine's own step where it is known (vLLM /metrics). The typical step is never taken
    below it: when the API process writes responses in bursts, the gaps between a request's chunks are socket
    writes microseconds apart, not steps, and a typical step taken from them would make every request's whole
    latency a "stall" (a CI run at load average 19 on 2026-11-24: 0.2 ms gaps against a 1.7 ms engine step cut
    the decode observations to a quarter of the engine's step, and the fit with them).

    A request is in flight from when it was sent to its last chunk, so a wait for a first token counts too:
    on the 2-core machine vLLM's API process now and then falls into a state where it writes whole responses
    at once, several times slower (first token = last token; measured 2026-11-24: 2 of 7 closed-loop runs at
    4 clients, 0.43 s instead of 0.12 s), and nothing reaches any client until it does."""
    streams = [
        (r.sent_s if r.sent_s is not None else r.arrival_s, np.asarray(r.chunk_times, dtype=float))
        for r in records
        if r.chunk_times is not None and len(r.chunk_times) > 0
    ]
    if not streams:
        return StallSample()
    step_gaps = np.concatenate([np.diff(times) for _, times in streams])
    step_gaps = step_gaps[step_gaps > 0]  # chunks read together are one arrival, not a step
    if len(step_gaps) == 0:
        return StallSample()
    typical = max(float(np.median(step_gaps)), step_floor_s or 0.0)
    starts = np.array([sent for sent, _ in streams])
    ends = np.array([times[-1] for _, times in streams])
    # Sends are events too: a gap is measured from the later of the last arrival and the last send, so a
    # request sent into a quiet moment only counts the silence after it was sent.
    events = np.sort(np.concatenate([starts, *[times for _, times in streams]]))
    left, right = events[:-1], events[1:]
    gaps = right - left
    # A gap is observed when one request spans it: sent at or before its left end, ended at or after its
    # right end. Requests overlap heavily, so test against the widest span starting by each left end.
    order = np.argsort(starts)
    latest_end_by_start = np.maximum.accumulate(ends[order])
    index = np.searchsorted(starts[order], left, side="right") - 1
    spanned = (index >= 0) & (latest_end_by_start[np.maximum(index, 0)] >= right)
    observed = gaps[spanned]
    # A silence that ends with a burst is not all stall: vLLM's API process also holds tokens back and writes
    # them together (at one client here it often sends a whole response in one write, at full speed). The
    # engine made the burst's tokens during the silence, so the stall is what is left of the gap after one
    # typical step per token of the largest burst one request received at its end.
    burst = _largest_burst_at(streams, BURST_GAP_SHARE * typical)
    excess = gaps - np.array([burst.get(float(end), 1) for end in right]) * typical
    stalled = spanned & (gaps > factor * typical) & (excess > factor * typical)
    intervals = [
        (float(start), float(start) + float(extra)) for start, extra in zip(left[stalled], excess[stalled], strict=True)
    ]
    return StallSample(float(observed.sum()), typical, [end - start for start, end in intervals], intervals)


def _largest_burst_at(streams: list[tuple[float, np.ndarray]], within_s: float) -> dict[float, int]:
    """Arrival time -> the most chunks one request received in a burst starting then: chunks less than
    `within_s` apart are one burst (a response written whole often reaches the client in several reads)."""
    largest: dict[float, int] = {}
    for _, times in streams:
        breaks = np.flatnonzero(np.diff(times) >= within_s) + 1
        for group in np.split(times, breaks):
            instant, count = float(group[0]), len(group)
            if count > largest.get(instant, 0):
                largest[instant] = count
    return largest


def fit_stalls(samples: list[StallSample], min_stalls: int = MIN_STALLS) -> StallModel | None:
    """Rate per observed second, mean and CV of durations over every sample; None with too few stalls."""
    observed = sum(s.observed_s for s in samples)
    durations = np.array([d for s in samples for d in s.durations_s], dtype=float)
    if observed <= 0 or len(durations) < min_stalls:
        return None
    mean = float(durations.mean())
    cv = float(durations.std() / mean) if mean > 0 else 0.0
    return StallModel(rate_per_s=len(durations) / observed, mean_s=mean, cv=cv)
