"""What an energy meter reports, and the protocol every meter follows.

A reading always says how its figure came about (`basis`): measured by a hardware counter, modelled from
the simulator's power model, or unavailable with the reason. Nothing downstream may turn an unavailable
reading into zero, nor a modelled one into a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Basis = Literal["measured", "modelled", "unavailable"]

# The reason the issue asks for, verbatim, so consumers (and tests) can recognise a too-short window.
WINDOW_TOO_SHORT = "window shorter than the counter update period"


@dataclass(frozen=True, slots=True)
class EnergyReading:
    """Energy over one window.

    joules / avg_power_w are None exactly when basis is "unavailable" (then `reason` says why).
    `method` names the mechanism (counter, sampled power, power model); `device` what it covered.
    `note` carries a caution for a figure that is usable but weak (a window only a few counter periods long).
    """

    joules: float | None
    avg_power_w: float | None
    window_s: float
    basis: Basis
    method: str
    reason: str | None = None
    device: str | None = None
    note: str | None = None

    @property
    def available(self) -> bool:
        return self.basis != "unavailable" and self.joules is not None


def unavailable(reason: str, *, method: str, window_s: float = 0.0, device: str | None = None) -> EnergyReading:
    return EnergyReading(
        joules=None,
        avg_power_w=None,
        window_s=window_s,
        basis="unavailable",
        method=method,
        reason=reason,
        device=device,
    )


class EnergyMeter(Protocol):
    """Measure energy over the window between start() and stop().

    start() never raises for a missing or unreadable source: stop() then returns an unavailable reading
    whose reason names the cause and the fix.
    """

    def start(self) -> None: ...

    def stop(self) -> EnergyReading: ...
