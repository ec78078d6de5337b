"""A factsheet for a finished run (batch or console): the one place that maps a RunResult to its inputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from core.energy import EnergyReading, ModelledEnergy
from core.factsheet.build import FactsheetInputs, build_factsheet
from core.factsheet.model import Factsheet
from core.factsheet.render import write_factsheet
from core.jobs import RunResult
from core.profile import load_calibration


def modelled_run_energy(result: RunResult) -> EnergyReading | None:
    """The simulator's power model over the same window the metrics used (warm-up excluded)."""
    power = load_calibration(result.profile).power
    measured = [r for r in result.records if not r.warmup]
    if power is None or not measured:
        return None
    meter = ModelledEnergy(power, device=f"modelled {result.backend.get('hardware', '')}".strip())
    meter.start()
    samples = list(result.outcome.samples)
    busy_total = result.outcome.notes.get("busy_s")
    if samples and samples[-1].busy_s is not None and isinstance(busy_total, float | int):
        # The engine works on after its last sample until the run ends: close the series with its total.
        end_s = max(float(result.outcome.duration_s), float(samples[-1].time_s))
        samples.append(replace(samples[-1], time_s=end_s, running=0, busy_s=float(busy_total)))
    meter.record_samples(samples, window_s=result.summary.window_s, start_s=min(r.arrival_s for r in measured))
    return meter.stop()


def run_energy(result: RunResult) -> EnergyReading | None:
    if result.energy is not None:
        return result.energy
    if result.backend.get("backend") == "sim":
        return modelled_run_energy(result)
    return None


def factsheet_for_run(
    result: RunResult,
    command_line: Sequence[str],
    *,
    tuning: Mapping[str, Any] | None = None,
    **job: Any,
) -> Factsheet:
    """The factsheet of one run. `job`: FactsheetInputs fields of a job built on this run (job, headline,
    compare: core/factsheet/jobs.py)."""
    return build_factsheet(
        FactsheetInputs(
            profile=result.profile,
            # The load client's account (planned, not sent, schedule error, queue wait) joins as other metrics.
            summary={**result.summary.to_dict(), **result.extra.get("client", {})},
            backend_description=result.backend,
            knobs=result.knobs or result.profile.knobs,
            energy=run_energy(result),
            tuning=tuning,
            command_line=list(command_line),
            seed=result.seed,
            started_at=result.started_at or datetime.now(UTC),
            scheduling_mode=result.scheduling_mode,
            **job,
        )
    )


def write_run_factsheet(
    result: RunResult, out_dir: Path, command_line: Sequence[str], **kwargs: Any
) -> tuple[Path, Path]:
    return write_factsheet(factsheet_for_run(result, command_line, **kwargs), out_dir)
