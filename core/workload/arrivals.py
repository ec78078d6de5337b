"""Open-loop arrival processes: absolute send times, generated in numpy blocks.

Each process is a small stateful object: `next_block(n)` returns the next `n` send times (seconds from the
start of the run, non-decreasing) and remembers where it stopped, so a lazy plan can draw 4096 at a time
and a 100k-request run never makes one rng call per request.

The first request is sent at t = 0 and the gaps follow the process, as `vllm bench serve` does (it sends a
request, then sleeps one inter-arrival gap); a run therefore never idles before its first request.
Closed-loop clients have no arrival process: they send when their previous request ends.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from core.profile import (
    Arrival,
    ConstantArrival,
    GammaArrival,
    OnOffArrival,
    PoissonArrival,
)


class ArrivalProcess(Protocol):
    def next_block(self, n: int) -> np.ndarray:
        """The next `n` absolute send times in seconds (float64, non-decreasing)."""
        ...


class _GapProcess:
    """Arrivals whose gaps are i.i.d.: the first at t = 0, then a running sum of gaps."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._next_time_s = 0.0  # send time of the next request to hand out

    def _gaps(self, n: int) -> np.ndarray:
        raise NotImplementedError

    def next_block(self, n: int) -> np.ndarray:
        if n <= 0:
            return np.empty(0)
        gaps = self._gaps(n)
        # times[i] = next + gaps[0] + ... + gaps[i-1]; the gap after the last one starts the next block.
        times = np.empty(n)
        times[0] = self._next_time_s
        np.cumsum(gaps[:-1], out=times[1:])
        times[1:] += self._next_time_s
        self._next_time_s = float(times[-1] + gaps[-1])
        return times


class PoissonProcess(_GapProcess):
    """Exponential gaps with mean 1/rate."""

    def __init__(self, rate_rps: float, rng: np.random.Generator) -> None:
        super().__init__(rng)
        self._mean_gap_s = 1.0 / rate_rps

    def _gaps(self, n: int) -> np.ndarray:
        return self._rng.exponential(self._mean_gap_s, n)


class ConstantProcess:
    """Evenly spaced sends; deterministic, so it uses no randomness at all.

    Request k goes at k / rate exactly (not a running sum of gaps, which drifts in floating point and
    would let a 10 RPS, 1 s window send an eleventh request at 0.9999999999999999 s).
    """

    def __init__(self, rate_rps: float, rng: np.random.Generator) -> None:
        self._rate_rps = rate_rps
        self._sent = 0

    def next_block(self, n: int) -> np.ndarray:
        times = np.arange(self._sent, self._sent + n, dtype=float) / self._rate_rps
        self._sent += n
        return times


class GammaProcess(_GapProcess):
    """Gamma gaps with shape = burstiness and scale = 1/(rate * burstiness), as `vllm bench serve`.

    The mean gap stays 1/rate for every burstiness; the gaps' coefficient of variation is
    1/sqrt(burstiness), so burstiness 1 is Poisson and smaller values give clumps and lulls.
    """

    def __init__(self, rate_rps: float, burstiness: float, rng: np.random.Generator) -> None:
        super().__init__(rng)
        self._shape = burstiness
        self._scale = 1.0 / (rate_rps * burstiness)

    def _gaps(self, n: int) -> np.ndarray:
        return self._rng.gamma(self._shape, self._scale, n)


class OnOffProcess:
    """Poisson at `rate_rps` while on, silent while off; cycles start with an on period at t = 0.

    Arrivals are drawn as a Poisson process on "active time" (time spent in on periods) and then
    mapped onto the wall clock by inserting an off period after every `on_s` of active time. That
    gives exactly a Poisson process inside each on window and nothing in the off windows, with no
    rejection sampling. The long-run mean rate is rate_rps * on_s / (on_s + off_s).
    """

    def __init__(self, rate_rps: float, on_s: float, off_s: float, rng: np.random.Generator) -> None:
        self._active = PoissonProcess(rate_rps, rng)
        self._on_s = on_s
        self._cycle_s = on_s + off_s

    def next_block(self, n: int) -> np.ndarray:
        active_times = self._active.next_block(n)
        cycles, into_on = np.divmod(active_times, self._on_s)
        return cycles * self._cycle_s + into_on


def make_arrival_process(arrival: Arrival, rng: np.random.Generator) -> ArrivalProcess:
    """The open-loop process for a profile's `workload.arrival` (closed loop has none)."""
    if isinstance(arrival, PoissonArrival):
        return PoissonProcess(arrival.rate_rps, rng)
    if isinstance(arrival, ConstantArrival):
        return ConstantProcess(arrival.rate_rps, rng)
    if isinstance(arrival, GammaArrival):
        return GammaProcess(arrival.rate_rps, arrival.burstiness, rng)
    if isinstance(arrival, OnOffArrival):
        return OnOffProcess(arrival.rate_rps, arrival.on_s, arrival.off_s, rng)
    raise TypeError(f"{type(arrival).__name__} has no open-loop arrival times (closed loop sends on completion)")


def mean_rate_rps(arrival: Arrival) -> float | None:
    """The long-run offered rate of an open-loop process; None for closed loop (it depends on latency)."""
    if isinstance(arrival, OnOffArrival):
        return arrival.rate_rps * arrival.on_s / (arrival.on_s + arrival.off_s)
    if isinstance(arrival, PoissonArrival | ConstantArrival | GammaArrival):
        return arrival.rate_rps
    return None
