"""Pure arithmetic over (time, value) series: cumulative counters, sampled power, sums over devices.

The meters only collect samples; every decision about wrap-around, missing values and too-short windows
is made here, so tests can feed synthetic series without hardware.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from core.energy.reading import WINDOW_TOO_SHORT, EnergyReading, unavailable

# (monotonic time in seconds, counter value or power; None where the read failed)
Sample = tuple[float, float | None]

# A window only a few update periods long has a quantisation error of up to one period's energy at each
# end; below this many periods the figure is kept but flagged.
WEAK_WINDOW_PERIODS = 10


def _window_checks(samples: Sequence[Sample], update_period_s: float, method: str, device: str | None):
    """Shared checks on the sample series; returns (window_s, unavailable reading or None)."""
    if len(samples) < 2:
        return 0.0, unavailable("fewer than two readings in the window", method=method, device=device)
    window_s = samples[-1][0] - samples[0][0]
    if window_s < 0:
        return window_s, unavailable("sample times go backwards", method=method, device=device)
    if window_s < update_period_s:
        return window_s, unavailable(WINDOW_TOO_SHORT, method=method, window_s=window_s, device=device)
    return window_s, None


def _weak_note(window_s: float, update_period_s: float) -> str | None:
    if update_period_s > 0 and window_s < WEAK_WINDOW_PERIODS * update_period_s:
        return (
            f"window {window_s:.3g} s is under {WEAK_WINDOW_PERIODS} counter update periods "
            f"({update_period_s:g} s each); expect an error of up to {200 * update_period_s / window_s:.0f}%"
        )
    return None


def counter_increase(values: Sequence[float], wrap_range: float | None) -> float:
    """Total increase of a cumulative counter across successive readings.

    A reading lower than the previous one means the counter wrapped (RAPL wraps at max_energy_range_uj):
    the step is then value + wrap_range - previous. Several wraps between two readings cannot be seen,
    which is why the RAPL meter polls. Without a wrap range a decrease is an error (a driver reload resets
    NVML's counter; the difference would be meaningless).
    """
    total = 0.0
    for previous, current in itertools.pairwise(values):
        step = current - previous
        if step < 0:
            if wrap_range is None or wrap_range <= 0:
                raise ValueError("counter went backwards (driver reloaded or counter reset during the window)")
            step += wrap_range
            if step < 0:
                raise ValueError("counter decrease larger than its wrap range")
        total += step
    return total


def energy_from_counter(
    samples: Sequence[Sample],
    *,
    joules_per_unit: float,
    update_period_s: float,
    method: str,
    device: str | None = None,
    wrap_range: float | None = None,
) -> EnergyReading:
    """Energy from a cumulative counter series (NVML mJ: joules_per_unit=1e-3; RAPL uJ: 1e-6).

    Readings that failed in the middle of the window (None) are skipped: the counter is cumulative, so only
    the endpoints matter, plus enough readings in between to see each wrap. A failed first or last reading
    makes the window unmeasurable.
    """
    window_s, problem = _window_checks(samples, update_period_s, method, device)
    if problem is not None:
        return problem
    if samples[0][1] is None or samples[-1][1] is None:
        return unavailable(
            "counter missing: no reading at the start or end of the window",
            method=method,
            window_s=window_s,
            device=device,
        )
    values = [value for _, value in samples if value is not None]
    try:
        increase = counter_increase(values, wrap_range)
    except ValueError as exc:
        return unavailable(str(exc), method=method, window_s=window_s, device=device)
    if increase == 0:
        # A window longer than the update period contains at least one update, and a powered device draws
        # energy, so a flat counter means it is not being maintained: say so rather than report 0 J.
        return unavailable(
            "counter did not advance over the window (device does not maintain it)",
            method=method,
            window_s=window_s,
            device=device,
        )
    joules = increase * joules_per_unit
    return _measured(joules, window_s, update_period_s, method, device)


def _measured(joules: float, window_s: float, update_period_s: float, method: str, device: str | None) -> EnergyReading:
    return EnergyReading(
        joules=joules,
        avg_power_w=joules / window_s,
        window_s=window_s,
        basis="measured",
        method=method,
        device=device,
        note=_weak_note(window_s, update_period_s),
    )


def energy_from_power(
    samples: Sequence[Sample],
    *,
    update_period_s: float,
    method: str,
    device: str | None = None,
    watts_per_unit: float = 1.0,
) -> EnergyReading:
    """Energy by trapezoidal integration of sampled power (the fallback where no energy counter exists).

    Failed reads (None) are skipped; the integral bridges the gap linearly. The window runs from the first
    to the last sample, and the first and last must exist.
    """
    window_s, problem = _window_checks(samples, update_period_s, method, device)
    if problem is not None:
        return problem
    if samples[0][1] is None or samples[-1][1] is None:
        return unavailable(
            "power reading missing at the start or end of the window",
            method=method,
            window_s=window_s,
            device=device,
        )
    points = [(time_s, value * watts_per_unit) for time_s, value in samples if value is not None]
    joules = 0.0
    for (t0, p0), (t1, p1) in itertools.pairwise(points):
        joules += 0.5 * (p0 + p1) * (t1 - t0)
    return _measured(joules, window_s, update_period_s, method, device)


def sum_readings(
    readings: Sequence[EnergyReading], *, method: str | None = None, device: str | None = None
) -> EnergyReading:
    """Sum readings over devices measured over the same window (GPUs of one host, or GPU + CPU package).

    A partial sum would under-report, so one unavailable part makes the sum unavailable (naming the part).
    A modelled part makes the whole modelled: a sum is only as strong as its weakest input.
    """
    if not readings:
        return unavailable("no devices to measure", method=method or "none", device=device)
    method = method or " + ".join(dict.fromkeys(r.method for r in readings))
    device = device or ", ".join(r.device for r in readings if r.device) or None
    window_s = max(r.window_s for r in readings)
    for reading in readings:
        if not reading.available:
            part = reading.device or reading.method
            return unavailable(f"{part}: {reading.reason}", method=method, window_s=window_s, device=device)
    joules = sum(r.joules for r in readings if r.joules is not None)
    basis = "modelled" if any(r.basis == "modelled" for r in readings) else "measured"
    notes = "; ".join(dict.fromkeys(r.note for r in readings if r.note)) or None
    return EnergyReading(
        joules=joules,
        avg_power_w=joules / window_s if window_s > 0 else None,
        window_s=window_s,
        basis=basis,
        method=method,
        device=device,
        note=notes,
    )
