"""Each job's factsheet: the common sections, the job's own section and its verdict headline.

run        factsheet_for_run (core/factsheet/run.py): the run's performance and energy
tune       the tuned configuration's final re-measurement as the performance, and a Tuning section: baseline
           against tuned, the objective, the trajectory, and the spread over the tuned configuration's
           measurements
compare    the profile's own mode's run as the performance, and a Compare section: the table, a verdict per mode
capacity   a Capacity section: each mode's capacity; the headline says whether the profile's own rate is
           within its mode's capacity
calibrate  a Calibration section: the fit and where it was written
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from core.factsheet.build import FactsheetInputs, build_factsheet, verdict_section
from core.factsheet.model import (
    CalibrationSection,
    CapacityRow,
    CapacitySection,
    CompareRow,
    CompareSection,
    Factsheet,
    Spread,
    TuningSpread,
)
from core.factsheet.run import factsheet_for_run
from core.jobs.run import scheduling_mode_that_ran
from core.metrics.summary_fields import finite_number, read_figures
from core.metrics.verdict import SloVerdict, check_slo, slo_verdict
from core.profile import Profile, load_calibration

if TYPE_CHECKING:
    from core.calibrate.job import CalibrateResult
    from core.capacity import CapacityResult
    from core.compare import CompareResult
    from core.tune.job import TuneResult
    from core.tune.score import Segment

# Paper 000 eq. 3, in words (core/tune/score.py).
TUNER_OBJECTIVE = "maximise S(K) = goodput - lambda * max(0, p99 - SLO) - hw_cost(K) (SLO-Tuner eq. 3)"


def simulator_description(profile: Profile, reported: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a simulator run's backend describes (model, modelled hardware), under what a job reported."""
    calibration = load_calibration(profile)
    return {
        "backend": "sim",
        "engine": "simulator",
        "calibration": calibration.name,
        "model": calibration.model,
        "hardware": calibration.hardware,
        **(reported or {}),
    }


# ---------------------------------------------------------------- tune


def _spread(values: Sequence[float | None]) -> Spread:
    known = [v for v in values if v is not None]
    if not known:
        return Spread(min=None, median=None, max=None)
    return Spread(min=min(known), median=statistics.median(known), max=max(known))


def tuned_spread(result: TuneResult) -> TuningSpread | None:
    """The tuned configuration's full-length measurements (the search's and the final re-measurements)."""
    tuned = result.tuned
    if tuned is None:
        return None
    takes: list[Segment] = [
        s for s in result.history if s.point.config_key == tuned.point.config_key and s.measure_fraction == 1.0 and s.ok
    ] or [tuned]
    return TuningSpread(
        measurements=len(takes),
        p99_s=_spread([finite_number(s.p99_s) for s in takes]),
        slo_attainment=_spread([finite_number(s.summary.get("slo_attainment")) for s in takes]),
        goodput_rps=_spread([finite_number(s.goodput_rps) for s in takes]),
    )


def _point(segment: Segment | None) -> dict[str, Any] | None:
    if segment is None:
        return None
    return {
        "knobs": segment.point.as_dict(),
        "goodput_rps": segment.goodput_rps,
        "p99_s": segment.p99_s,
        "slo_attainment": segment.summary.get("slo_attainment"),
        "score": segment.score,
    }


def tuning_facts(result: TuneResult) -> dict[str, Any]:
    """The factsheet's tuning input from a tune's result (batch and console alike)."""
    trajectory = [] if result.search is None else [_point(step.segment) for step in result.search.steps]
    guided = " guided (simulator search, live verification)" if result.guided else ""
    return {
        "tuner": f"slo-tuner {result.algorithm}{guided}",
        "objective": TUNER_OBJECTIVE,
        "slo_p99_s": result.profile.slo.e2e_s,
        "baseline": _point(result.baseline),
        "tuned": _point(result.tuned),
        "trajectory": trajectory,
        "segments": result.segments_used,
        "wall_time_s": result.wall_s,
        "spread": tuned_spread(result),
    }


def tune_headline(result: TuneResult) -> str:
    """The tuned configuration and its verdict (its final re-measurement against the profile's SLOs)."""
    tuned = result.tuned
    if tuned is None or not tuned.ok:
        return "nothing measured: no configuration could be measured, so there is no SLO verdict"
    return f"tuned {tuned.point.label()}: {slo_verdict(tuned.summary, result.profile).headline()}"


def tune_factsheet(result: TuneResult, command_line: Sequence[str], started_at: datetime | None = None) -> Factsheet:
    """The tuned configuration (its final re-measurement) with the tuning that found it."""
    tuned = result.tuned
    profile = result.profile
    description = result.backend
    if description.get("backend") == "sim":
        description = simulator_description(profile, description)
    summary = dict(tuned.summary) if tuned is not None and tuned.summary else {}
    return build_factsheet(
        FactsheetInputs(
            profile=profile,
            summary=summary,
            backend_description=description,
            knobs=tuned.point.to_knobs(profile.knobs) if tuned is not None else profile.knobs,
            energy=None,
            tuning=tuning_facts(result),
            command_line=list(command_line),
            seed=result.seed,
            started_at=started_at or datetime.now(UTC),
            scheduling_mode=scheduling_mode_that_ran(description),
            job="tune",
            headline=tune_headline(result),
        )
    )


# ---------------------------------------------------------------- compare


# A compare row's plain figures, read by the row's field names (CompareRow's fields have the same names).
_COMPARE_COUNTS = ("max_num_seqs", "requests", "completed", "rejected", "deferred", "failed")
_COMPARE_NUMBERS = (
    "slo_attainment",
    "goodput_rps",
    "token_goodput_tps",
    "smooth_goodput",
    "p99_s",
    "cv_completion_over_slo",
)


def compare_section(result: CompareResult) -> CompareSection:
    rows = []
    for row in result.rows:
        fields = row.fields()
        rows.append(
            CompareRow(
                mode=row.mode,
                speculation=None if fields.get("speculation") is None else str(fields["speculation"]),
                slo_attainment_per_task={
                    str(task): finite_number(value)
                    for task, value in (fields.get("slo_attainment_per_task") or {}).items()
                },
                **read_figures(fields, counts=_COMPARE_COUNTS, numbers=_COMPARE_NUMBERS),
                verdict=verdict_section(slo_verdict(row.summary.to_dict(), result.profile)),
            )
        )
    return CompareSection(
        seed=result.seed,
        rows=rows,
        skipped=dict(result.skipped),
        static_sweep={str(cap): finite_number(value) for cap, value in result.static_sweep.items()},
        interrupted=result.interrupted,
        wall_time_s=result.wall_s,
    )


def compare_headline(result: CompareResult) -> str:
    """The profile's own mode's verdict, then which modes met the SLO and which did not."""
    profile = result.profile
    verdicts = {row.mode: slo_verdict(row.summary.to_dict(), profile) for row in result.rows}
    shown = profile.mode if profile.mode in verdicts else next(iter(verdicts), None)
    if shown is None:
        return "nothing measured: no mode could run this workload"
    met = [mode for mode, v in verdicts.items() if v.state == "met"]
    missed = [f"{mode} ({v.short()})" for mode, v in verdicts.items() if v.state != "met"]
    across = "; across modes: " + "; ".join(
        part
        for part in (f"met by {', '.join(met)}" if met else "", f"not met by {', '.join(missed)}" if missed else "")
        if part
    )
    return f"{shown} (the profile's mode): {verdicts[shown].headline()}{across}"


def compare_factsheet(
    result: CompareResult, command_line: Sequence[str], started_at: datetime | None = None
) -> Factsheet:
    """The profile's own mode's run (its performance and energy), with every mode in the Compare section."""
    profile = result.profile
    run = result.runs.get(profile.mode) or next(iter(result.runs.values()), None)
    section = compare_section(result)
    if run is None:
        return build_factsheet(
            FactsheetInputs(
                profile=profile,
                summary=None,
                backend_description=simulator_description(profile),
                knobs=profile.knobs,
                energy=None,
                tuning=None,
                command_line=list(command_line),
                seed=result.seed,
                started_at=started_at or datetime.now(UTC),
                job="compare",
                headline=compare_headline(result),
                compare=section,
            )
        )
    return factsheet_for_run(run, command_line, job="compare", headline=compare_headline(result), compare=section)


# ---------------------------------------------------------------- capacity


def offered_rate_rps(profile: Profile) -> float | None:
    arrival = profile.workload.arrival
    return finite_number(getattr(arrival, "rate_rps", None))


_CAPACITY_FIELDS = {"capacity_rps", "replicas", "capacity_per_replica_rps", "bracket_rps", "probes"}


def capacity_section(profile: Profile, results: Sequence[CapacityResult], target: float) -> CapacitySection:
    base = results[0].capacity_rps if results else 0.0
    rows = []
    for r in results:
        fields = r.fields()
        rows.append(
            CapacityRow(
                mode=r.mode,
                capacity_rps=finite_number(r.capacity_rps),
                replicas=r.replicas,
                capacity_per_replica_rps=finite_number(r.per_replica_rps),
                ratio_to_first=r.capacity_rps / base if base > 0 else None,
                probes=len(r.probes),
                bracket_rps=[float(v) for v in r.bracket],
                other={
                    str(k): v
                    for k, v in fields.items()
                    if k not in _CAPACITY_FIELDS and (v is None or isinstance(v, str | bool | int | float))
                },
            )
        )
    return CapacitySection(attainment_target=target, offered_rate_rps=offered_rate_rps(profile), rows=rows)


def capacity_verdict(profile: Profile, results: Sequence[CapacityResult], target: float) -> tuple[SloVerdict, str]:
    """Whether the profile's own rate is within its mode's capacity, and the headline listing every mode."""
    listed = ", ".join(f"{r.mode} {r.capacity_rps:.3g} req/s" for r in results)
    head = f"capacity at ≥ {target:.0%} SLO attainment: {listed or 'no mode could run this workload'}"
    own = next((r for r in results if r.mode == profile.mode), results[0] if results else None)
    rate = offered_rate_rps(profile)
    if own is None or rate is None:
        return SloVerdict(()), head
    check = check_slo("offered rate", rate, own.capacity_rps, unit="req/s", target_label=f"{own.mode}'s capacity")
    return SloVerdict((check,)), f"{head}; the profile's {check.comparison()}: {check.short()}"


def capacity_factsheet(
    profile: Profile,
    results: Sequence[CapacityResult],
    target: float,
    command_line: Sequence[str],
    seed: int,
    started_at: datetime | None = None,
) -> Factsheet:
    verdict, headline = capacity_verdict(profile, results, target)
    return build_factsheet(
        FactsheetInputs(
            profile=profile,
            summary=None,
            backend_description=simulator_description(profile),
            knobs=profile.knobs,
            energy=None,
            tuning=None,
            command_line=list(command_line),
            seed=seed,
            started_at=started_at or datetime.now(UTC),
            scheduling_mode=profile.mode,
            job="capacity",
            verdict=verdict,
            headline=headline,
            capacity=capacity_section(profile, results, target),
        )
    )


# ---------------------------------------------------------------- calibrate


def calibration_section(result: CalibrateResult) -> CalibrationSection:
    from core.calibrate.job import decode_step_at_median

    fit, calibration = result.fit, result.calibration
    return CalibrationSection(
        path=None if result.path is None else str(result.path),
        points=len(result.sweep.points),
        observations=None if fit is None else len(fit.observations),
        rms_relative_error=None if fit is None else finite_number(fit.rms_relative_error),
        max_relative_error=None if fit is None else finite_number(fit.max_relative_error),
        terms=[] if calibration is None else [t.model_dump() for t in calibration.terms],
        request_overhead_s=finite_number(result.extra.get("request_overhead_s")),
        median_itl_s=finite_number(result.extra.get("median_itl_s")),
        fitted_decode_step_s=None if fit is None else finite_number(decode_step_at_median(fit)),
        kv_capacity_tokens=None if calibration is None else calibration.kv_capacity_tokens,
        noise_cv=None if calibration is None else calibration.noise_cv,
        default_acceptance=None if calibration is None else calibration.default_acceptance,
        wall_time_s=result.wall_s,
        interrupted=result.interrupted,
    )


def calibration_headline(result: CalibrateResult) -> str:
    fit = result.fit
    if fit is None:
        return f"no calibration: the sweep was interrupted after {len(result.sweep.points)} points (no SLO checked)"
    return (
        f"calibration fitted: RMS error {fit.rms_relative_error:.1%} (max {fit.max_relative_error:.1%}) over "
        f"{len(fit.observations)} step observations; a calibration checks no SLO"
    )


def calibration_factsheet(
    result: CalibrateResult, command_line: Sequence[str], seed: int, started_at: datetime | None = None
) -> Factsheet:
    description = dict(result.sweep.description)
    description.setdefault("backend", "vllm")
    return build_factsheet(
        FactsheetInputs(
            profile=result.profile,
            summary=None,
            backend_description=description,
            knobs=result.profile.knobs,
            energy=None,
            tuning=None,
            command_line=list(command_line),
            seed=seed,
            started_at=started_at or datetime.now(UTC),
            scheduling_mode=scheduling_mode_that_ran(description),  # the sweep runs no controller: fcfs
            job="calibrate",
            verdict=SloVerdict(()),
            headline=calibration_headline(result),
            calibration=calibration_section(result),
            runs_workload=False,
        )
    )
