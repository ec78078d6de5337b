"""When a shared machine stalls the simulated engine (Calibration.stalls): Poisson arrivals over busy time,
lognormal durations (core/calibrate/stalls.py fits them)."""

from __future__ import annotations

import math

import numpy as np

from core.profile import StallModel


class StallClock:
    """When the machine stalls (Calibration.stalls): Poisson arrivals over busy time, lognormal durations.

    It draws from a stream of its own, spawned from the replica's, so a calibration with stalls changes no
    other random draw of the run (acceptance, step noise) and runs with and without stalls stay comparable."""

    __slots__ = ("_mean_gap_s", "_mu", "_rng", "_sigma", "_until_next_s")

    def __init__(self, model: StallModel, rng: np.random.Generator) -> None:
        self._rng = rng.spawn(1)[0]
        self._mean_gap_s = 1.0 / model.rate_per_s
        self._sigma = math.sqrt(math.log1p(model.cv * model.cv))
        self._mu = math.log(model.mean_s) - 0.5 * self._sigma * self._sigma if model.mean_s > 0 else -math.inf
        self._until_next_s = self._rng.exponential(self._mean_gap_s)

    def stall_within(self, busy_s: float) -> float:
        """The stall time that falls within the next `busy_s` seconds of engine work (usually 0)."""
        self._until_next_s -= busy_s
        stalled = 0.0
        while self._until_next_s <= 0.0:
            if self._mu > -math.inf:
                stalled += float(self._rng.lognormal(self._mu, self._sigma))
            self._until_next_s += self._rng.exponential(self._mean_gap_s)
        return stalled
