"""The factsheet's caveats: what its figures rest on and what they do not cover, in plain sentences."""

from __future__ import annotations

from core.energy.reading import EnergyReading
from core.factsheet.model import PerformanceSection, SustainabilitySection, SystemSection
from core.profile import Profile

# Below this many completed requests a p99 rests on the slowest one or two of them.
FEW_REQUESTS_FOR_P99 = 100
# Energy and metrics windows differing by more than this share get a caveat: per-token figures mix them.
WINDOW_MISMATCH_SHARE = 0.1


def factsheet_caveats(
    system: SystemSection,
    performance: PerformanceSection | None,
    sustainability: SustainabilitySection | None,
    energy: EnergyReading | None,
    profile: Profile,
) -> list[str]:
    if performance is None or sustainability is None:
        return [
            "This job measures no single run of the workload, so the factsheet has no performance or energy "
            "section; its own section says what was measured and how."
        ]
    caveats: list[str] = []
    if performance.basis == "simulated":
        caveats.append(
            f"Latency, goodput and attainment come from the discrete-event simulator (calibration "
            f"{system.calibration or 'unknown'}, modelling {system.modelled_hardware or 'unknown hardware'}),"
            " "
            "not from a live server; they show trends, not guarantees for any deployment."
        )
    caveats.append(
        "Percentiles are over completed requests only; failed requests are counted separately and count "
        "against SLO attainment."
    )
    if performance.completed is not None and performance.completed < FEW_REQUESTS_FOR_P99:
        caveats.append(
            f"Only {performance.completed} requests completed: the p99 rests on the slowest one or two of "
            "them and will move between runs."
        )
    if energy is None or not energy.available:
        caveats.append(
            "Energy is unavailable for this run (see the reason in Sustainability), so no energy or carbon "
            "figure is given; that means unknown, not zero."
        )
    elif energy.basis == "modelled":
        caveats.append(
            f"Energy is modelled, not measured: {energy.method}. It ignores clocks, memory power and "
            "temperature, and covers the modelled accelerator only."
        )
    else:
        caveats.append(
            "Energy comes from software counters on the device (NVML or RAPL), not from a power analyser "
            "at the wall: it is not comparable with MLPerf Power results, excludes the rest of the system "
            "unless stated, and includes any other work on the same device. Idle power is not subtracted."
        )
        if energy.note:
            caveats.append(f"Energy window: {energy.note}.")
    if energy is not None and energy.available and performance.window_s:
        mismatch = abs(energy.window_s - performance.window_s) / performance.window_s
        if mismatch > WINDOW_MISMATCH_SHARE:
            caveats.append(
                f"The energy window ({energy.window_s:.4g} s) differs from the metrics window "
                f"({performance.window_s:.4g} s) by {mismatch:.0%}; per-token and per-request energy "
                "mix the two."
            )
    spec = profile.sustainability
    caveats.append(
        f"Carbon is operational and location-based: energy x {spec.grid_region} grid average "
        f"{spec.grid_intensity_gco2e_per_kwh:g} gCO2e/kWh ({spec.grid_intensity_year}) x PUE {spec.pue:g}. "
        "It is not the operator's actual grid mix or contract (market-based), and excludes embodied "
        "emissions of the hardware."
    )
    if spec.pue == 1.0:
        caveats.append("PUE 1.0 assumes no cooling or facility overhead (a workstation, not a data centre).")
    return caveats
