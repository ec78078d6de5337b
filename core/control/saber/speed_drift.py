"""How far a live engine's per-request speed has drifted from the speed model fitted offline.

SABER (paper 001) profiles f(L) once, offline (sec. IV-B), and its admission promises (Algorithm 1, line 10)
hold only while the engine still runs at that speed. A live server does not: a co-tenant on the machine,
a thermal limit or a longer context than profiled make every request slower than f(L) says, and SABER, which
admits at the edge of each request's SLA by design, then admits requests that miss. This is beyond the
paper: the ratio of the speed requests actually got to the speed the model predicted when they were
admitted, over recent completions, scales f(L) for the next admissions. With an accurate model (the
simulator, whose engine is the one profiled) the ratio stays near 1.

Two estimators of that ratio:
- the mean (default): an exponentially weighted mean of the ratios. It tracks a slow drift, but a request
  admitted at the edge of its SLA with a mean estimate gets less than it needs about half the time, by
  construction, wherever the speed is noisy from request to request;
- a low quantile (`quantile`, e.g. 0.1): the q-quantile of the last `window` ratios. Admitting at the edge
  with it, a request gets at least the speed it needs with probability about 1 - q, as far as the recent
  spread says (the same risk level on a quiet engine and on a noisy one: the margin is as wide as the
  observed spread, no wider). This is the estimate for a machine whose speed swings from request to request
  (a shared CPU server: measured ratios 0.37-1.0 between the 5th and 80th percentiles within one 20 s run).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

# Bounds on the correction. Above 1 never: the correction only ever slows admission down. Requests finishing
# faster than f(L) predicted do not license admitting beyond the profile, where f(L) is an extrapolation:
# on a live CPU server whose USL fit was pessimistic at high load, a ratio allowed up to 1.5 admitted bursts
# of 50 requests in flight behind 8 batch slots, which then missed their SLAs (2026-11-23). Below 0.25 never
# for the mean: a single pathological completion (a request admitted into a stall) must not switch admission
# off. The quantile of a window is not moved far by one completion, so it may go as low as QUANTILE_FLOOR.
RATIO_BOUNDS = (0.25, 1.0)
QUANTILE_FLOOR = 0.1
# A single ratio is kept within these (a request that produced a token in a stall of minutes, or finished
# in a clock hiccup) before it enters the quantile's window.
_SAMPLE_BOUNDS = (0.01, 10.0)


class SpeedDrift:
    """Observed / predicted per-request token speed: an exponentially weighted mean, or a low quantile.

    `weight` is the weight of the newest completion in the mean (0.2: about the last ten completions
    count). With `quantile` set, the ratio is instead that quantile of the last `window` ratios. The ratio
    starts at 1 (the model as fitted)."""

    def __init__(self, weight: float = 0.2, *, quantile: float | None = None, window: int = 30) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1] (got {weight})")
        if quantile is not None and not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1) (got {quantile})")
        if window < 1:
            raise ValueError(f"window must be at least 1 (got {window})")
        self.weight = weight
        self.quantile = quantile
        self.recent: deque[float] = deque(maxlen=window)
        self.ratio = 1.0
        self.observed = 0

    def observe(self, predicted_tps: float, tokens: int, elapsed_s: float) -> None:
        """A request that was predicted `predicted_tps` at admission produced `tokens` in `elapsed_s`."""
        if tokens <= 0 or elapsed_s <= 0 or not predicted_tps > 0 or not math.isfinite(predicted_tps):
            return  # nothing was produced (a failure or a cancellation): it says nothing about speed
        raw = float(tokens / elapsed_s / predicted_tps)
        low, high = RATIO_BOUNDS
        self.observed += 1
        if self.quantile is None:
            sample = min(high, max(low, raw))
            self.ratio += self.weight * (sample - self.ratio)
            return
        self.recent.append(min(_SAMPLE_BOUNDS[1], max(_SAMPLE_BOUNDS[0], raw)))
        self.ratio = min(high, max(QUANTILE_FLOOR, float(np.quantile(self.recent, self.quantile))))

    def describe(self) -> dict[str, float | int | None]:
        return {"ratio": round(self.ratio, 4), "completions": self.observed, "quantile": self.quantile}
