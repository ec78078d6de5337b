"""Pick the best available meter for a device kind, or one that explains why none is."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from core.energy.nvml import COUNTER_METHOD, NvmlEnergyMeter
from core.energy.rapl import METHOD as RAPL_METHOD
from core.energy.rapl import POWERCAP_ROOT, RaplEnergyMeter
from core.energy.reading import EnergyMeter, EnergyReading, unavailable


class UnavailableMeter:
    """A meter with no source: it times the window and reports the reason energy is unavailable."""

    def __init__(self, reason: str, *, method: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.reason = reason
        self.method = method
        self._clock = clock
        self._start_s: float | None = None

    def start(self) -> None:
        self._start_s = self._clock()

    def stop(self) -> EnergyReading:
        window_s = self._clock() - self._start_s if self._start_s is not None else 0.0
        return unavailable(self.reason, method=self.method, window_s=window_s)


def auto_meter(
    kind: Literal["gpu", "cpu"],
    *,
    nvml: ModuleType | Any | None = None,
    powercap_root: Path = POWERCAP_ROOT,
) -> EnergyMeter:
    """NVML for "gpu", RAPL packages for "cpu"; an `UnavailableMeter` carrying the reason otherwise."""
    if kind == "gpu":
        gpu_meter = NvmlEnergyMeter(nvml)
        reason = gpu_meter.probe()
        return gpu_meter if reason is None else UnavailableMeter(reason, method=COUNTER_METHOD)
    if kind == "cpu":
        cpu_meter = RaplEnergyMeter(powercap_root)
        reason = cpu_meter.probe()
        return cpu_meter if reason is None else UnavailableMeter(reason, method=RAPL_METHOD)
    raise ValueError(f"unknown meter kind {kind!r}; use 'gpu' or 'cpu'")
