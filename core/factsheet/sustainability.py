"""The factsheet's sustainability section: energy, average power, energy per 1k output tokens and per
request, and operational carbon, each a `Figure` with its basis and source, or unavailable with the reason."""

from __future__ import annotations

from core.energy.reading import EnergyReading
from core.factsheet.model import CarbonInputs, EnergyMeterInfo, Figure, PerformanceSection, SustainabilitySection
from core.profile import Profile

FORMULAS = {
    "avg_power_w": "energy_j / energy window_s",
    "wh_per_1k_output_tokens": "energy_j / 3600 / (output_tokens / 1000)",
    "j_per_request": "energy_j / completed requests",
    "gco2e_per_1k_output_tokens": (
        "wh_per_1k_output_tokens / 1000 * grid_intensity_gco2e_per_kwh * pue  (operational only, no embodied)"
    ),
}


def _figure_unavailable(unit: str, source: str, reason: str) -> Figure:
    return Figure(value=None, unit=unit, basis="unavailable", source=source, reason=reason)


def sustainability_section(
    energy: EnergyReading | None, performance: PerformanceSection, profile: Profile
) -> SustainabilitySection:
    spec = profile.sustainability
    carbon = CarbonInputs(
        grid_intensity_gco2e_per_kwh=spec.grid_intensity_gco2e_per_kwh,
        grid_intensity_source=spec.grid_intensity_source,
        grid_intensity_year=spec.grid_intensity_year,
        grid_region=spec.grid_region,
        pue=spec.pue,
        pue_source=spec.pue_source,
        pue_year=spec.pue_year,
    )
    carbon_source = (
        f"{FORMULAS['gco2e_per_1k_output_tokens']} with intensity "
        f"{spec.grid_intensity_gco2e_per_kwh:g} gCO2e/kWh ({spec.grid_intensity_year}) and PUE {spec.pue:g}"
    )
    if energy is None:
        reason = "no energy meter ran for this run"
        meter = None
        energy_figure = _figure_unavailable("J", "none", reason)
        power_figure = _figure_unavailable("W", "none", reason)
    else:
        meter = EnergyMeterInfo(
            basis=energy.basis,
            method=energy.method,
            device=energy.device,
            window_s=energy.window_s,
            reason=energy.reason,
            note=energy.note,
        )
        source = energy.method if energy.device is None else f"{energy.method}; {energy.device}"
        if energy.available:
            energy_figure = Figure(value=energy.joules, unit="J", basis=energy.basis, source=source)
            power_figure = Figure(
                value=energy.avg_power_w,
                unit="W",
                basis=energy.basis,
                source=f"{FORMULAS['avg_power_w']} ({energy.window_s:.6g} s)",
            )
            reason = ""
        else:
            reason = energy.reason or "energy unavailable"
            energy_figure = _figure_unavailable("J", source, reason)
            power_figure = _figure_unavailable("W", source, reason)

    output_tokens = performance.output_tokens
    completed = performance.completed
    if energy_figure.value is None:
        per_token = _figure_unavailable("Wh", FORMULAS["wh_per_1k_output_tokens"], f"energy unavailable: {reason}")
        per_request = _figure_unavailable("J", FORMULAS["j_per_request"], f"energy unavailable: {reason}")
    else:
        joules = energy_figure.value
        basis = energy_figure.basis
        if output_tokens:
            per_token = Figure(
                value=joules / 3600 / (output_tokens / 1000),
                unit="Wh",
                basis=basis,
                source=f"{FORMULAS['wh_per_1k_output_tokens']} with {output_tokens} output tokens",
            )
        else:
            per_token = _figure_unavailable(
                "Wh", FORMULAS["wh_per_1k_output_tokens"], "no output tokens counted in the window"
            )
        if completed:
            per_request = Figure(
                value=joules / completed,
                unit="J",
                basis=basis,
                source=f"{FORMULAS['j_per_request']} with {completed} completed requests",
            )
        else:
            per_request = _figure_unavailable("J", FORMULAS["j_per_request"], "no completed requests")

    if per_token.value is None:
        carbon_figure = _figure_unavailable("gCO2e", carbon_source, per_token.reason or "unavailable")
    else:
        # Measured energy times assumed factors is an estimate; modelled energy keeps its "modelled" label.
        carbon_basis = "estimated" if per_token.basis == "measured" else per_token.basis
        carbon_figure = Figure(
            value=per_token.value / 1000 * spec.grid_intensity_gco2e_per_kwh * spec.pue,
            unit="gCO2e",
            basis=carbon_basis,
            source=carbon_source,
        )
    return SustainabilitySection(
        meter=meter,
        energy_j=energy_figure,
        avg_power_w=power_figure,
        wh_per_1k_output_tokens=per_token,
        j_per_request=per_request,
        gco2e_per_1k_output_tokens=carbon_figure,
        carbon_inputs=carbon,
        formulas=FORMULAS,
    )
