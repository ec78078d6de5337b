"""Modelled energy for simulator runs, from the calibration's power model.

P(t) = idle_w + (peak_w - idle_w) * u(t), where u(t) is 1 while the engine runs a batch and 0 otherwise, so
    E = integral of P dt = idle_w * window_s + (peak_w - idle_w) * busy_s.
This is a model, stated as such: it knows nothing of clocks, memory power or thermal state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from core.backends.base import EngineSample
from core.energy.reading import EnergyReading, unavailable
from core.profile import PowerModel


def _method(power: PowerModel) -> str:
    return (
        f"power model: idle {power.idle_w:g} W + ({power.peak_w:g} - {power.idle_w:g}) W x utilisation "
        "(utilisation = share of the window the engine was busy)"
    )


def modelled_energy(
    power: PowerModel | None, busy_s: float, window_s: float, *, device: str | None = None
) -> EnergyReading:
    """Energy the power model predicts for `busy_s` seconds of engine work inside a `window_s` window."""
    if power is None:
        return unavailable(
            "the calibration has no power model (add power: {idle_w, peak_w} to it)",
            method="power model",
            window_s=window_s,
            device=device,
        )
    method = _method(power)
    if window_s <= 0:
        return unavailable("empty measurement window", method=method, window_s=window_s, device=device)
    # Busy time cannot exceed the window (utilisation is a share); clip rather than over-count.
    busy_s = min(max(busy_s, 0.0), window_s)
    joules = power.idle_w * window_s + (power.peak_w - power.idle_w) * busy_s
    return EnergyReading(
        joules=joules,
        avg_power_w=joules / window_s,
        window_s=window_s,
        basis="modelled",
        method=method,
        device=device,
    )


def busy_seconds(samples: Sequence[EngineSample], end_s: float | None = None, *, start_s: float | None = None) -> float:
    """Seconds the engine had work running, from engine snapshots (each holds until the next one).

    The last sample holds until `end_s` when given. With `start_s`/`end_s`, only busy time inside that
    window counts, so energy and the metrics can share one window (e.g. excluding warm-up).
    Samples must be in time order.
    """
    if not samples:
        return 0.0
    lower = -math.inf if start_s is None else start_s
    upper = math.inf if end_s is None else end_s
    busy = 0.0
    ends = [float(sample.time_s) for sample in samples[1:]] + [upper if end_s is not None else -math.inf]
    for sample, interval_end in zip(samples, ends, strict=True):
        if sample.running > 0:
            busy += max(0.0, min(interval_end, upper) - max(float(sample.time_s), lower))
    return busy


class ModelledEnergy:
    """An `EnergyMeter` for virtual time: the simulator reports busy and window seconds, stop() models.

    Simulated time does not pass on the wall clock, so start()/stop() cannot time anything; call
    `record(busy_s, window_s)` (or `record_samples`) before stop().
    """

    def __init__(self, power: PowerModel | None, *, device: str | None = None) -> None:
        self.power = power
        self.device = device
        self._busy_s: float | None = None
        self._window_s: float | None = None

    def start(self) -> None:
        self._busy_s = None
        self._window_s = None

    def record(self, busy_s: float, window_s: float) -> None:
        self._busy_s = busy_s
        self._window_s = window_s

    def record_samples(self, samples: Sequence[EngineSample], window_s: float, start_s: float = 0.0) -> None:
        """Model the window [start_s, start_s + window_s] of the simulator's clock from its snapshots."""
        self.record(busy_seconds(samples, end_s=start_s + window_s, start_s=start_s), window_s)

    def stop(self) -> EnergyReading:
        if self._busy_s is None or self._window_s is None:
            return unavailable(
                "the simulator reported no busy time for the window", method="power model", device=self.device
            )
        return modelled_energy(self.power, self._busy_s, self._window_s, device=self.device)
