"""Build a `Factsheet` from a run's results: one function for batch runs, tuning runs and console sessions.

Inputs the run does not have are reported as unknown (null), never guessed; energy figures inherit the
basis of the reading they come from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from core.energy.reading import EnergyReading
from core.factsheet.caveats import factsheet_caveats
from core.factsheet.host import detect_host, git_revision, slo_console_version
from core.factsheet.model import (
    CalibrationSection,
    CapacitySection,
    CompareSection,
    ConfigurationSection,
    Factsheet,
    HostInfo,
    LatencyStats,
    PerformanceSection,
    Provenance,
    Scalar,
    SLOTargets,
    SmoothGoodput,
    SystemSection,
    TaskInfo,
    TaskPerformance,
    TuningPoint,
    TuningSection,
    TuningSpread,
    Verdict,
    VerdictCheck,
    WorkloadSection,
)
from core.factsheet.sustainability import sustainability_section
from core.jobs.options import JobName
from core.metrics.summary_fields import finite_number, read_figures, whole_number
from core.metrics.verdict import SloVerdict, slo_verdict
from core.profile import DEFAULT_MODE, KnobsSpec, Profile, SchedulingMode, SLOSpec, profile_hash, profile_source
from core.workload.plan import request_limit

SIMULATOR_BACKENDS = {"sim", "simulator"}

SLO_DEFINITIONS = {
    "e2e_s": "end-to-end latency: time of the last token minus the time the request was sent",
    "ttft_s": "time to first token: time of the first token minus the time the request was sent",
    "tpot_s": "time per output token after the first: (e2e - TTFT) / (output tokens - 1), for > 1 token",
    "percentiles": "over completed requests only; failed requests are counted separately by cause",
    "goodput_rps": (
        "requests per second over the window that completed and met every SLO given (e2e, TTFT, TPOT; "
        "SLO-Tuner eq. 1, vllm bench serve --goodput)"
    ),
    "slo_attainment": (
        "share of all requests submitted in the window, failures included, that met every SLO that "
        "applies to them (per task where tasks set their own SLOs)"
    ),
    "token_goodput_tps": "output tokens per second of the requests that met their SLOs",
    "smooth_goodput": (
        "benefit tokens per second: token i of a request is due at send + i / V (paper 003 eq. 4), or at "
        "send + ttft_allow + (i - 1) / V with a first-token allowance; "
        "benefit = tokens - alpha * f(user idle latency), summed and divided by the window (paper 003)"
    ),
}


class SupportsToDict(Protocol):
    """core.metrics.Summary and anything else that turns itself into the summary dict."""

    def to_dict(self) -> dict[str, Any]: ...


@dataclass
class FactsheetInputs:
    """Everything a factsheet is built from.

    summary: a core.metrics Summary, or its dict (requests, completed, failed, failed_by_status, window_s, p50_s,
      p95_s, p99_s, mean_s, ttft_*_s, tpot_*_s, goodput_rps, slo_attainment, token_goodput_tps,
      smooth_goodput(+_alpha, _reading_speed_tps, _ttft_allow_s, _penalty), output_tps, output_tokens,
      capacity_rps, capacity_attainment_target, per_task); any key may be missing and then reads unknown.
    backend_description: Backend.describe().
      None: the job measured no single run (capacity, calibrate): no performance or sustainability section.
    tuning: None when no tuner ran, else a dict with any of: tuner, objective, baseline, tuned (or best),
      trajectory (list), segments, wall_time_s, slo_p99_s, spread (a TuningSpread); points are dicts with
      knobs, goodput_rps, p99_s, slo_attainment, score.
    job: the job that wrote it; its own section goes in compare / capacity / calibration (tuning for tune).
    verdict / headline: the SLO verdict (default: the summary's against the profile's SLOs) and, where the
      job words it itself (capacity, calibrate), its headline.
    runs_workload: False when the job ran none of the profile's workload (calibrate sweeps its own loads).
    host / git_revision / generated_at: detected or taken now when None; pass them to pin a factsheet
      (tests, or re-rendering an old run).
    """

    profile: Profile
    summary: Mapping[str, Any] | SupportsToDict | None
    backend_description: Mapping[str, Any]
    knobs: KnobsSpec
    energy: EnergyReading | None
    tuning: Mapping[str, Any] | None
    command_line: Sequence[str]
    seed: int
    started_at: datetime
    scheduling_mode: SchedulingMode = DEFAULT_MODE  # the mode that ran (RunResult.scheduling_mode)
    host: HostInfo | None = None
    git_revision: str | None = None
    generated_at: datetime | None = None
    job: JobName = "run"
    verdict: SloVerdict | None = None
    headline: str | None = None
    compare: CompareSection | None = None
    capacity: CapacitySection | None = None
    calibration: CalibrationSection | None = None
    runs_workload: bool = True


# ---------------------------------------------------------------- small readers


def _scalar(value: Any) -> Scalar:
    if isinstance(value, str | bool) or value is None:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return finite_number(value)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | bool | int | float) or hasattr(value, "item")


def _slo(spec: SLOSpec | None) -> SLOTargets:
    if spec is None:
        return SLOTargets()
    return SLOTargets(e2e_s=spec.e2e_s, ttft_s=spec.ttft_s, tpot_s=spec.tpot_s)


def _is_simulator(description: Mapping[str, Any]) -> bool:
    names = {str(description.get("backend", "")).lower(), str(description.get("engine", "")).lower()}
    return bool(names & SIMULATOR_BACKENDS)


# ---------------------------------------------------------------- sections


def _system(description: Mapping[str, Any], host: HostInfo) -> SystemSection:
    simulator = _is_simulator(description)
    engine = "simulator" if simulator else str(description.get("engine") or description.get("backend") or "unknown")
    version = description.get("version")
    software = dict(host.software)
    if not simulator and version is not None:
        software[engine] = str(version)
    host = host.model_copy(update={"software": dict(sorted(software.items()))})
    calibration = description.get("calibration")
    hardware = description.get("hardware")
    return SystemSection(
        model=None if description.get("model") is None else str(description["model"]),
        engine=engine,
        engine_version=None if version is None else str(version),
        backend=str(description.get("backend") or engine),
        calibration=str(calibration) if simulator and calibration is not None else None,
        modelled_hardware=str(hardware) if simulator and hardware is not None else None,
        host=host,
        backend_facts={str(key): _scalar(value) for key, value in sorted(description.items()) if _is_scalar(value)},
    )


def _workload(profile: Profile) -> WorkloadSection:
    workload = profile.workload
    total_weight = sum(task.weight for task in workload.tasks) or 1.0
    tasks = [
        TaskInfo(
            name=task.name,
            weight=task.weight,
            share=task.weight / total_weight,
            prompt_tokens=task.prompt_tokens.model_dump(mode="json"),
            output_tokens=task.output_tokens.model_dump(mode="json"),
            slo=_slo(task.slo or profile.slo),
        )
        for task in workload.tasks
    ]
    return WorkloadSection(
        profile=profile.name,
        description=profile.description,
        source="arrival" if workload.arrival is not None else "trace",
        arrival=None if workload.arrival is None else workload.arrival.model_dump(mode="json"),
        trace=None if workload.trace is None else workload.trace.model_dump(mode="json"),
        tasks=tasks,
        # The count the run was limited to (None: no count limit, as for a whole trace): the workload module's
        # rule, so a trace's 3,000 rows do not read as the `requests` default of 1,000.
        requests=request_limit(profile, None, workload.duration_s),
        duration_s=workload.duration_s,
        warmup_requests=workload.warmup_requests,
        warmup_s=workload.warmup_s,
        slo=_slo(profile.slo),
        slo_definitions=SLO_DEFINITIONS,
    )


# Smooth goodput's parameters appear as smooth_<name> (core.metrics.Summary) or smooth_goodput_<name>.
_SMOOTH_PARAMETERS = ("alpha", "reading_speed_tps", "ttft_allow_s", "penalty")
_LATENCY_KEYS = {
    f"{prefix}{stat}_s" for prefix in ("", "ttft_", "tpot_", "itl_") for stat in ("p50", "p90", "p95", "p99", "mean")
}
_PERFORMANCE_KEYS = _LATENCY_KEYS | {
    "requests", "completed", "failed", "failed_by_status", "window_s",
    "goodput_rps", "slo_attainment", "token_goodput_tps", "throughput_rps", "output_tps", "output_tokens",
    "smooth_goodput", "capacity_rps", "capacity_attainment_target", "per_task",
    *(f"smooth_{name}" for name in _SMOOTH_PARAMETERS),
    *(f"smooth_goodput_{name}" for name in _SMOOTH_PARAMETERS),
}  # fmt: skip


def _smooth_parameter(summary: Mapping[str, Any], name: str) -> Any:
    value = summary.get(f"smooth_{name}")
    return summary.get(f"smooth_goodput_{name}") if value is None else value


def _latency(summary: Mapping[str, Any], prefix: str) -> LatencyStats:
    return LatencyStats(
        p50_s=finite_number(summary.get(f"{prefix}p50_s")),
        p90_s=finite_number(summary.get(f"{prefix}p90_s")),
        p95_s=finite_number(summary.get(f"{prefix}p95_s")),
        p99_s=finite_number(summary.get(f"{prefix}p99_s")),
        mean_s=finite_number(summary.get(f"{prefix}mean_s")),
    )


# A run's and a task's plain figures, read by their summary keys (the sections' fields have the same names).
_RUN_COUNTS = ("requests", "completed", "failed", "output_tokens")
_RUN_NUMBERS = (
    "window_s",
    "goodput_rps",
    "slo_attainment",
    "token_goodput_tps",
    "throughput_rps",
    "output_tps",
    "capacity_rps",
    "capacity_attainment_target",
)
_TASK_COUNTS = ("requests", "completed", "failed")
_TASK_NUMBERS = ("p50_s", "p99_s", "slo_attainment", "goodput_rps", "token_goodput_tps", "smooth_goodput")


def _performance(summary: Mapping[str, Any], profile: Profile, simulated: bool) -> PerformanceSection:
    failed_by_status = summary.get("failed_by_status") or {}
    per_task_raw = summary.get("per_task") or {}
    per_task = {
        str(task): TaskPerformance(**read_figures(stats, counts=_TASK_COUNTS, numbers=_TASK_NUMBERS))
        for task, stats in sorted(per_task_raw.items())
        if isinstance(stats, Mapping)
    }
    configured = profile.smooth_goodput
    penalty = _smooth_parameter(summary, "penalty") or configured.penalty
    alpha = finite_number(_smooth_parameter(summary, "alpha"))
    speed = finite_number(_smooth_parameter(summary, "reading_speed_tps"))
    allow = finite_number(_smooth_parameter(summary, "ttft_allow_s"))
    return PerformanceSection(
        basis="simulated" if simulated else "measured",
        **read_figures(summary, counts=_RUN_COUNTS, numbers=_RUN_NUMBERS),
        failed_by_status={
            str(status): int(count)
            for status, count in sorted(failed_by_status.items())
            if whole_number(count) is not None
        },
        e2e=_latency(summary, ""),
        ttft=_latency(summary, "ttft_"),
        tpot=_latency(summary, "tpot_"),
        itl=_latency(summary, "itl_"),
        smooth_goodput=SmoothGoodput(
            value=finite_number(summary.get("smooth_goodput")),
            # The metric's parameters: as the summary reports them, else as the profile configures them.
            alpha=configured.alpha if alpha is None else alpha,
            reading_speed_tps=configured.reading_speed_tps if speed is None else speed,
            ttft_allow_s=configured.ttft_allow_s if allow is None else allow,
            penalty=None if penalty is None else str(penalty),
        ),
        per_task=per_task,
        other_metrics={
            str(key): _scalar(value)
            for key, value in sorted(summary.items())
            if key not in _PERFORMANCE_KEYS and _is_scalar(value)
        },
    )


def _tuning_point(raw: Any) -> TuningPoint | None:
    if not isinstance(raw, Mapping):
        return None
    knobs = raw.get("knobs") or {}
    return TuningPoint(
        knobs={str(k): _scalar(v) for k, v in knobs.items() if _is_scalar(v)} if isinstance(knobs, Mapping) else {},
        goodput_rps=finite_number(raw.get("goodput_rps")),
        p99_s=finite_number(raw.get("p99_s")),
        slo_attainment=finite_number(raw.get("slo_attainment")),
        score=finite_number(raw.get("score")),
    )


def verdict_section(verdict: SloVerdict, headline: str | None = None) -> Verdict:
    """The factsheet's form of a core.metrics.verdict.SloVerdict (`headline` replaces its own)."""
    data = verdict.to_dict()
    return Verdict(
        state=data["state"],
        margin=finite_number(data["margin"]),
        headline=headline or data["headline"],
        checks=[VerdictCheck(**check) for check in data["checks"]],
        per_task={name: verdict_section(task) for name, task in verdict.per_task.items()},
    )


def _tuning(tuning: Mapping[str, Any] | None) -> TuningSection | None:
    if tuning is None:
        return None
    trajectory_raw = tuning.get("trajectory") or []
    trajectory = [point for point in map(_tuning_point, trajectory_raw) if point is not None]
    segments = whole_number(tuning.get("segments"))
    return TuningSection(
        tuner=None if tuning.get("tuner") is None else str(tuning["tuner"]),
        objective=None if tuning.get("objective") is None else str(tuning["objective"]),
        baseline=_tuning_point(tuning.get("baseline")),
        tuned=_tuning_point(tuning.get("tuned", tuning.get("best"))),
        segments=segments if segments is not None else (len(trajectory) or None),
        wall_time_s=finite_number(tuning.get("wall_time_s")),
        trajectory=trajectory,
        spread=tuning.get("spread") if isinstance(tuning.get("spread"), TuningSpread) else None,
        slo_p99_s=finite_number(tuning.get("slo_p99_s")),
    )


def build_factsheet(inputs: FactsheetInputs) -> Factsheet:
    profile = inputs.profile
    host = inputs.host if inputs.host is not None else detect_host()
    system = _system(inputs.backend_description, host)
    simulated = _is_simulator(inputs.backend_description)
    raw = inputs.summary
    summary = None if raw is None else raw if isinstance(raw, Mapping) else raw.to_dict()
    performance = None if summary is None else _performance(summary, profile, simulated)
    sustainability = None if performance is None else sustainability_section(inputs.energy, performance, profile)
    verdict = inputs.verdict if inputs.verdict is not None else slo_verdict(summary or {}, profile)
    source_path = profile_source(profile)
    generated_at = inputs.generated_at or datetime.now(UTC)
    title = f"{profile.name}: {system.model or 'unknown model'} on {system.engine}"
    return Factsheet(
        title=title,
        job=inputs.job,
        verdict=verdict_section(verdict, inputs.headline),
        system=system,
        configuration=ConfigurationSection(
            backend=system.backend,
            scheduling_mode=inputs.scheduling_mode,
            knobs=inputs.knobs.model_dump(mode="json"),
        ),
        workload=_workload(profile) if inputs.runs_workload else None,
        performance=performance,
        tuning=_tuning(inputs.tuning),
        compare=inputs.compare,
        capacity=inputs.capacity,
        calibration=inputs.calibration,
        sustainability=sustainability,
        provenance=Provenance(
            generated_at=generated_at,
            run_started_at=inputs.started_at,
            slo_console_version=slo_console_version(),
            git_revision=inputs.git_revision if inputs.git_revision is not None else git_revision(),
            command_line=list(inputs.command_line),
            seed=inputs.seed,
            profile_name=profile.name,
            profile_hash=profile_hash(profile),
            profile_path=None if source_path is None else str(source_path),
        ),
        caveats=factsheet_caveats(system, performance, sustainability, inputs.energy, profile),
    )
