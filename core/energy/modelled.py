"""Modelled energy for simulator runs, from the calibration's power model (core/profile PowerModel).

P = idle_w + (peak_w - idle_w) * u, where u is the engine's utilisation: the share of time it spends
running batches (its busy time). Integrated over a window (PowerModel.energy_j),
    E = idle_w * window_s + (peak_w - idle_w) * busy_s,
with busy_s the engine's own busy seconds inside the window: the simulator's samples carry its
cumulative busy time (`EngineSample.busy_s`), so an idle gap between two samples adds nothing, and a half-busy
interval draws half the dynamic power (not peak whenever anything runs).
This is a model, stated as such: it knows nothing of clocks, memory power or thermal state.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from core.backend_api import EngineSample
from core.energy.reading import EnergyReading, unavailable
from core.profile import PowerModel


def _method(power: PowerModel) -> str:
    return (
        f"power model: idle {power.idle_w:g} W + ({power.peak_w:g} - {power.idle_w:g}) W x utilisation "
        "(utilisation = the engine's busy seconds / the window)"
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
    joules = power.energy_j(busy_s, window_s)
    return EnergyReading(
        joules=joules,
        avg_power_w=joules / window_s,
        window_s=window_s,
        basis="modelled",
        method=method,
        device=device,
    )


def busy_seconds(samples: Sequence[EngineSample], end_s: float | None = None, *, start_s: float | None = None) -> float:
    """Seconds the engine had work running inside [start_s, end_s] (either open), from its samples.

    Samples in time order. When they carry the engine's cumulative busy time (`busy_s`), the busy
    seconds are its increase over the window; inside one sample interval the busy time is taken to come
    first (the engine works off what it has, then idles until new work arrives), and after the last sample
    nothing runs. Samples without it (older recordings) fall back to
    holding each snapshot until the next one: a sample with requests running counts its whole interval.
    """
    if not samples:
        return 0.0
    if all(sample.busy_s is not None for sample in samples):
        return _counter_at(samples, end_s) - (0.0 if start_s is None else _counter_at(samples, start_s))
    lower = -math.inf if start_s is None else start_s
    upper = math.inf if end_s is None else end_s
    busy = 0.0
    ends = [float(sample.time_s) for sample in samples[1:]] + [upper if end_s is not None else -math.inf]
    for sample, interval_end in zip(samples, ends, strict=True):
        if sample.running > 0:
            busy += max(0.0, min(interval_end, upper) - max(float(sample.time_s), lower))
    return busy


def _busy(sample: EngineSample) -> float:
    """The sample's busy counter; only asked of samples that carry it (`busy_seconds` tests them all first)."""
    assert sample.busy_s is not None
    return float(sample.busy_s)


def _counter_at(samples: Sequence[EngineSample], time_s: float | None) -> float:
    """The cumulative busy seconds at `time_s` (None: the end), linear between samples."""
    first, last = samples[0], samples[-1]
    if time_s is None or time_s >= float(last.time_s):
        return _busy(last)
    if time_s <= float(first.time_s):
        # Before the first sample: busy time accrued up to it is spread over [0, its time].
        t0 = float(first.time_s)
        return _busy(first) * (max(time_s, 0.0) / t0 if t0 > 0 else 0.0)
    times = [float(sample.time_s) for sample in samples]
    index = bisect.bisect_right(times, time_s)
    before, after = samples[index - 1], samples[index]
    t_before = times[index - 1]
    b0, b1 = _busy(before), _busy(after)
    # Busy first: by time_s the engine has worked min(all of the interval's busy time, time elapsed).
    return b0 + min(b1 - b0, time_s - t_before)


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
