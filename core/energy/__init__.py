"""Energy over a measurement window: NVML (GPU), RAPL (CPU packages), or the simulator's power model.

Every reading carries its basis (measured / modelled / unavailable) so nothing downstream can pass a model
or a gap off as a measurement.
"""

from core.energy.auto import UnavailableMeter, auto_meter
from core.energy.counters import (
    counter_increase,
    energy_from_counter,
    energy_from_power,
    sum_readings,
)
from core.energy.modelled import ModelledEnergy, busy_seconds, modelled_energy
from core.energy.nvml import NvmlEnergyMeter
from core.energy.rapl import RaplEnergyMeter
from core.energy.reading import WINDOW_TOO_SHORT, Basis, EnergyMeter, EnergyReading, unavailable

__all__ = [
    "WINDOW_TOO_SHORT",
    "Basis",
    "EnergyMeter",
    "EnergyReading",
    "ModelledEnergy",
    "NvmlEnergyMeter",
    "RaplEnergyMeter",
    "UnavailableMeter",
    "auto_meter",
    "busy_seconds",
    "counter_increase",
    "energy_from_counter",
    "energy_from_power",
    "modelled_energy",
    "sum_readings",
    "unavailable",
]
