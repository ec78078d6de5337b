"""How far a live engine's per-request speed has drifted from the speed model fitted offline.

SABER (paper 001) profiles f(L) once, offline (sec. IV-B), and its admission promises (Algorithm 1, line 10)
hold only while the engine still runs at that speed. A live server does not: a co-tenant on the machine,
a thermal limit or a longer context than profiled make every request slower than f(L) says, and SABER, which
admits at the edge of each request's SLA by design, then admits requests that miss. This is beyond the
paper: the ratio of the speed requests actually got to the speed the model predicted when they were
admitted, smoothed over recent completions, scales f(L) for the next admissions. With an accurate model
(the simulator, whose engine is the one profiled) the ratio stays near 1.
"""

from __future__ import annotations

import math

# Bounds on the correction. Above 1 never: the correction only ever slows admission down. Requests finishing
# faster than f(L) predicted do not license admitting beyond the profile, where f(L) is an extrapolation:
# on a live CPU server whose USL fit was pessimistic at high load, a ratio allowed up to 1.5 admitted bursts
# of 50 requests in flight behind 8 batch slots, which then missed their SLAs (2026-11-23). Below 0.25 never:
# a single pathological completion (a request admitted into a stall) must not switch admission off.
RATIO_BOUNDS = (0.25, 1.0)


class SpeedDrift:
    """An exponentially weighted mean of observed / predicted per-request token speed.

    `weight` is the weight of the newest completion (0.2: about the last ten completions count); the ratio
    starts at 1 (the model as fitted)."""

    def __init__(self, weight: float = 0.2) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1] (got {weight})")
        self.weight = weight
        self.ratio = 1.0
        self.observed = 0

    def observe(self, predicted_tps: float, tokens: int, elapsed_s: float) -> None:
        """A request that was predicted `predicted_tps` at admission produced `tokens` in `elapsed_s`."""
        if tokens <= 0 or elapsed_s <= 0 or not predicted_tps > 0 or not math.isfinite(predicted_tps):
            return  # nothing was produced (a failure or a cancellation): it says nothing about speed
        low, high = RATIO_BOUNDS
        sample = min(high, max(low, float(tokens / elapsed_s / predicted_tps)))
        self.ratio += self.weight * (sample - self.ratio)
        self.observed += 1

    def describe(self) -> dict[str, float | int]:
        return {"ratio": round(self.ratio, 4), "completions": self.observed}
