"""The jobs registry: every job by name, used by `--job`, the batch CLI and the console.

A `JobSpec` says which backends the job runs on, how to run it (`run(ctx)`, a coroutine returning the job's
result), its final `summary` event (the batch contract's last line and summary.json), its `factsheet` (the
common sections plus its own, core/factsheet/jobs.py) and its `report` to the operator: what to log, the
verdict line (SLO met or violated, by how much) and the exit code.

    spec = JOBS["compare"]
    result = await spec.run(JobContext(profile, options, sink))
    spec.summary(result); spec.report(result, ctx).verdict; spec.factsheet(result, ctx)

The modules that do the work are imported when a job runs, so `--help` and the console stay light.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.events import Event, EventSink, make_event
from core.exit_codes import ExitCode
from core.jobs.options import BACKEND_KINDS, JOB_NAMES, BackendKind, JobName, OperatorOptions, UsageError
from core.jobs.run import RunOptions, RunResult, as_run, run_workload, summary_event
from core.metrics.failure_causes import FailureCause, failure_causes, failures_line
from core.metrics.verdict import FAULT_STATUSES, slo_verdict
from core.profile import Profile, TunerSpec

if TYPE_CHECKING:
    from core.backend_api import Backend
    from core.calibrate.job import CalibrateResult
    from core.capacity import CapacityResult
    from core.compare import CompareResult
    from core.factsheet.model import Factsheet
    from core.records import RequestRecord
    from core.tune.job import TuneResult


class JobFailed(RuntimeError):
    """The job ran but produced no answer (exit code 4): the message is the one-line cause."""


@dataclass(slots=True)
class JobContext:
    """One job's inputs: the profile (in the operator's scheduling mode), the options, where events go."""

    profile: Profile
    options: OperatorOptions
    sink: EventSink
    out_dir: Path | None = None  # the job's own files (tune journal, calibration); None: the job's default
    backend: Backend | None = None  # a backend the caller holds (the console's); None: the job builds one
    on_record: Callable[[RequestRecord], None] | None = None  # each finished request (run)
    progress_every: int | None = None  # run: a progress event per this many requests (None: the default)
    engine_events_with_progress: bool = False  # run: engine events only beside progress events (batch)
    tuner_spec: TunerSpec | None = None  # tune: None is the profile's tuner section
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(slots=True)
class JobReport:
    """What a front end tells the operator when a job ends. `verdict` is the factsheet's headline."""

    status: ExitCode
    verdict: str
    info: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: JobName
    description: str
    backends: tuple[BackendKind, ...]
    run: Callable[[JobContext], Awaitable[Any]]
    summary: Callable[[Any], Event]
    report: Callable[[Any, JobContext], JobReport]
    factsheet: Callable[[Any, JobContext], Factsheet]
    wrong_backend: str = ""  # the usage error for a backend not in `backends`
    default_dir: str | None = None  # where the job's files go without --out: runs/<default_dir>-<profile>/

    def check(self, options: OperatorOptions) -> None:
        """UsageError for options this job cannot honour."""
        if options.backend not in self.backends:
            raise UsageError(self.wrong_backend or f"--job {self.name} runs on --backend {' or '.join(self.backends)}")

    def default_out(self, profile: Profile) -> Path | None:
        return None if self.default_dir is None else Path("runs") / f"{self.default_dir}-{profile.name}"


def _command_line(ctx: JobContext) -> list[str]:
    return list(ctx.options.command_line)


# ---------------------------------------------------------------- run


async def _run(ctx: JobContext) -> RunResult:
    from core.backends.factory import make_backend

    options = ctx.options
    backend = ctx.backend
    own = backend is None
    if backend is None:
        backend = make_backend(options.backend, ctx.profile, seed=options.seed, url=options.url, mode=options.mode)
    run_options = RunOptions(
        seed=options.seed,
        requests=options.requests,
        duration_s=options.duration_s,
        on_record=ctx.on_record,
        engine_events_with_progress=ctx.engine_events_with_progress,
    )
    if ctx.progress_every is not None:
        run_options.progress_every = ctx.progress_every
    try:
        return await run_workload(ctx.profile, backend, ctx.sink, run_options)
    finally:
        if own:
            await backend.close()


def _run_report(result: RunResult, ctx: JobContext) -> JobReport:
    s = result.summary
    verdict = slo_verdict(s.to_dict(), result.profile)
    rows = result.extra.get("trace_rows")  # a trace: how many of its rows this run replayed
    report = JobReport(
        ExitCode.OK,
        verdict.headline(),
        info=[
            f"{result.profile.name}: {s.requests} requests ({s.failed} failed) in {result.wall_s:.2f} s wall, mode "
            f"{result.scheduling_mode}; p99 {s.p99_s:.3f} s, goodput {s.goodput_rps:.2f} req/s"
            + ("" if rows is None else f"; trace rows {rows['used']} of {rows['total']}")
        ],
    )
    faulted = sum(s.failed_by_status.get(status, 0) for status in FAULT_STATUSES)
    if faulted and result.records:
        causes = failure_causes(result.records)
        report.warnings.append(failures_line(causes, faulted, s.requests) + _fix_for(causes))
    if result.interrupted:
        report.status = ExitCode.INTERRUPTED
        report.warnings.append("interrupted: the summary covers the requests finished before Ctrl-C")
    elif s.requests > 0 and s.completed == 0:
        report.status = ExitCode.FAILED
        report.errors.append("every request failed; see the error field in requests.jsonl (--out) for the cause")
    elif s.requests == 0:
        workload = result.profile.workload
        report.warnings.append(
            f"nothing was measured: the first {workload.warmup_requests} requests and {workload.warmup_s:g} s are "
            f"warm-up (workload.warmup_requests, warmup_s); ask for more with --requests or --duration"
        )
    return report


def _fix_for(causes: list[FailureCause]) -> str:
    """The fix for the one cause a profile can state wrongly by itself: requests longer than the context (read
    from the causes already grouped, not from every record again)."""
    context_bound = any("max_model_len" in c.example or "context length" in c.example for c in causes)
    if not context_bound:
        return "; the error field of requests.jsonl (--out) has each request's message"
    return (
        "; the prompts and outputs must fit the model's context: lower the profile's prompt_tokens/output_tokens"
        " max, or serve (or, in the simulator, calibrate) a model with a longer max_model_len"
    )


def _run_factsheet(result: RunResult, ctx: JobContext) -> Factsheet:
    from core.factsheet.run import factsheet_for_run

    return factsheet_for_run(result, _command_line(ctx))


# ---------------------------------------------------------------- tune


async def _tune(ctx: JobContext) -> TuneResult:
    from core.tune.job import run_tune
    from core.tune.journal import JOURNAL_NAME

    journal = None if ctx.out_dir is None else ctx.out_dir / JOURNAL_NAME
    async with ctx.options.executor_spec().open(ctx.sink, "tune") as executor:
        return await run_tune(
            ctx.profile,
            backend_kind=ctx.options.backend,
            sink=ctx.sink,
            seed=ctx.options.seed,
            journal_path=journal,
            resume=ctx.options.resume,
            backend=ctx.backend,
            spec=ctx.tuner_spec,
            executor=executor,
        )


def _tune_summary(result: TuneResult) -> Event:
    from core.tune.job import tune_batch_summary

    return tune_batch_summary(result)


def _tune_report(result: TuneResult, ctx: JobContext) -> JobReport:
    from core.factsheet.jobs import tune_headline
    from core.jobs.run import scheduling_mode_that_ran

    tuned = result.tuned
    report = JobReport(ExitCode.OK, tune_headline(result))
    if result.journal_path is not None:
        report.info.append(f"tune journal: {result.journal_path}")
    ran = scheduling_mode_that_ran(result.backend)
    if ran != result.profile.mode:
        report.warnings.append(
            f"the tuner measured its segments in mode {ran}, not {result.profile.mode}: on the simulator it tunes "
            "vLLM's knobs under vLLM's own scheduler"
        )
    if result.interrupted:
        report.status = ExitCode.INTERRUPTED
        report.warnings.append("interrupted: finished segments are in the journal; run again with --resume to continue")
    if tuned is None or not tuned.ok:
        if not result.interrupted:
            report.status = ExitCode.FAILED
            report.errors.append("no configuration could be measured; see the error field of the tune_segment events")
        return report
    baseline = result.baseline
    report.info.append(
        f"{result.profile.name}: tuned {tuned.point.label()}: p99 {tuned.p99_s:.3f} s, goodput "
        f"{tuned.goodput_rps:.2f} req/s, x{result.goodput_gain():.2f} the baseline's; baseline = the profile's knobs "
        f"({result.start.label()}): p99 {'n/a' if baseline is None else f'{baseline.p99_s:.3f}'} s, goodput "
        f"{'n/a' if baseline is None else f'{baseline.goodput_rps:.2f}'} req/s; {result.segments_used} segments"
    )
    return report


def _tune_factsheet(result: TuneResult, ctx: JobContext) -> Factsheet:
    from core.factsheet.jobs import tune_factsheet

    return tune_factsheet(result, _command_line(ctx), ctx.started_at)


# ---------------------------------------------------------------- compare


async def _compare(ctx: JobContext) -> CompareResult:
    from core.compare import run_compare

    options = ctx.options
    async with options.executor_spec().open(ctx.sink, "compare") as executor:
        return await run_compare(
            ctx.profile,
            seed=options.seed,
            requests=options.requests,
            duration_s=options.duration_s,
            sink=ctx.sink,
            executor=executor,
        )


def _compare_summary(result: CompareResult) -> Event:
    from core.compare import compare_summary_event

    return compare_summary_event(result)


def _compare_report(result: CompareResult, ctx: JobContext) -> JobReport:
    from core.compare import format_table
    from core.factsheet.jobs import compare_headline

    heading = f"{result.profile.name}: compare, seed {result.seed}, {result.wall_s:.1f} s wall"
    report = JobReport(ExitCode.OK, compare_headline(result), info=[f"{heading}\n{format_table(result)}"])
    if ctx.options.mode is not None:
        report.info.insert(0, f"--job compare runs every mode; --mode {ctx.options.mode} is ignored")
    report.warnings += [f"mode {mode} skipped: {reason}" for mode, reason in result.skipped.items()]
    if result.interrupted:
        report.status = ExitCode.INTERRUPTED
        report.warnings.append("interrupted: the table covers the modes finished before Ctrl-C")
    elif not result.rows:
        report.status = ExitCode.FAILED
        report.errors.append("no mode could run this workload; see the skipped reasons above")
    return report


def _compare_factsheet(result: CompareResult, ctx: JobContext) -> Factsheet:
    from core.factsheet.jobs import compare_factsheet

    return compare_factsheet(result, _command_line(ctx), ctx.started_at)


# ---------------------------------------------------------------- capacity


@dataclass(slots=True)
class CapacityRun:
    """`--job capacity`'s result: each mode's capacity on the profile's workload."""

    profile: Profile
    results: list[CapacityResult]
    seed: int
    target: float
    wall_s: float


async def _capacity(ctx: JobContext) -> CapacityRun:
    from core.capacity import TARGET_ATTAINMENT, run_capacity

    options = ctx.options
    # --mode NAME: that mode beside the fcfs baseline; without it, every mode.
    modes = None if options.mode is None else list(dict.fromkeys(["fcfs", options.mode]))
    start = time.perf_counter()
    async with options.executor_spec().open(ctx.sink, "capacity") as executor:
        results = await run_capacity(
            ctx.profile, modes=modes, seed=options.seed, requests=options.requests, sink=ctx.sink, executor=executor
        )
    seed = ctx.profile.seed if options.seed is None else options.seed
    profile = as_run(ctx.profile, options.requests, None)  # each probe's workload, at its own rate
    return CapacityRun(profile, results, seed, TARGET_ATTAINMENT, time.perf_counter() - start)


def _capacity_summary(run: CapacityRun) -> Event:
    return make_event(
        "summary",
        job="capacity",
        profile=run.profile.name,
        replicas=run.profile.replicas,
        modes={r.mode: r.fields() for r in run.results},
    )


def _capacity_report(run: CapacityRun, ctx: JobContext) -> JobReport:
    from core.capacity import format_table
    from core.factsheet.jobs import capacity_verdict

    _, headline = capacity_verdict(run.profile, run.results, run.target)
    report = JobReport(ExitCode.OK, headline, info=[format_table(run.profile, run.results)])
    if not run.results:
        report.status = ExitCode.FAILED
        report.errors.append("no mode could run this workload; see the capacity_row events for why")
    return report


def _capacity_factsheet(run: CapacityRun, ctx: JobContext) -> Factsheet:
    from core.factsheet.jobs import capacity_factsheet

    return capacity_factsheet(run.profile, run.results, run.target, _command_line(ctx), run.seed, ctx.started_at)


# ---------------------------------------------------------------- calibrate


async def _calibrate(ctx: JobContext) -> CalibrateResult:
    from core.calibrate.job import CalibrationFailed, run_calibrate

    out_dir = ctx.out_dir if ctx.out_dir is not None else JOBS["calibrate"].default_out(ctx.profile)
    assert out_dir is not None
    try:
        return await run_calibrate(
            ctx.profile,
            backend_kind=ctx.options.backend,
            url=ctx.options.url,
            sink=ctx.sink,
            out_dir=out_dir,
            command=" ".join(ctx.options.command_line),
        )
    except CalibrationFailed as exc:
        raise JobFailed(f"calibration failed: {exc}") from exc


def _calibrate_summary(result: CalibrateResult) -> Event:
    fit = result.fit
    return make_event(
        "summary",
        job="calibrate",
        profile=result.profile.name,
        interrupted=result.interrupted,
        path=None if result.path is None else str(result.path),
        points=len(result.sweep.points),
        observations=None if fit is None else len(fit.observations),
        rms_relative_error=None if fit is None else fit.rms_relative_error,
        max_relative_error=None if fit is None else fit.max_relative_error,
        **{k: v for k, v in result.extra.items() if isinstance(v, int | float | str) or v is None},
        calibrate_wall_s=result.wall_s,
    )


def _calibrate_report(result: CalibrateResult, ctx: JobContext) -> JobReport:
    from core.factsheet.jobs import calibration_headline

    report = JobReport(ExitCode.OK, calibration_headline(result))
    fit = result.fit
    if result.interrupted or result.calibration is None or fit is None:
        report.status = ExitCode.INTERRUPTED
        report.warnings.append("interrupted: no calibration written; the points measured so far are in sweep.json")
        return report
    rms = fit.rms_relative_error
    report.info.append(
        f"{result.profile.name}: calibration written to {result.path} ({len(fit.observations)} observations, "
        f"RMS error {'n/a' if not math.isfinite(rms) else f'{100 * rms:.1f}%'})"
    )
    return report


def _calibrate_factsheet(result: CalibrateResult, ctx: JobContext) -> Factsheet:
    from core.factsheet.jobs import calibration_factsheet

    seed = ctx.profile.seed if ctx.options.seed is None else ctx.options.seed
    return calibration_factsheet(result, _command_line(ctx), seed, ctx.started_at)


# ---------------------------------------------------------------- the registry

JOBS: dict[JobName, JobSpec] = {
    "run": JobSpec(
        "run",
        "run the profile's workload and report latency, goodput and SLO attainment",
        BACKEND_KINDS,
        _run,
        summary_event,
        _run_report,
        _run_factsheet,
    ),
    "tune": JobSpec(
        "tune",
        "SLO-Tuner: hill-climb vLLM's knobs against the p99 SLO",
        ("sim", "vllm"),
        _tune,
        _tune_summary,
        _tune_report,
        _tune_factsheet,
        wrong_backend="--job tune restarts the server per segment; use --backend sim or vllm",
        default_dir="tune",
    ),
    "calibrate": JobSpec(
        "calibrate",
        "sweep a live server and fit the simulator's step-time model",
        ("vllm", "url"),
        _calibrate,
        _calibrate_summary,
        _calibrate_report,
        _calibrate_factsheet,
        wrong_backend="--job calibrate measures a live server; use --backend vllm or --backend url",
        default_dir="calibrate",
    ),
    "compare": JobSpec(
        "compare",
        "every scheduling mode on the same seeded arrivals (simulator)",
        ("sim",),
        _compare,
        _compare_summary,
        _compare_report,
        _compare_factsheet,
        wrong_backend="--job compare runs on the simulator; drop --backend (live modes: --job run --mode NAME)",
    ),
    "capacity": JobSpec(
        "capacity",
        "each mode's highest rate at >= 90% SLO attainment (simulator)",
        ("sim",),
        _capacity,
        _capacity_summary,
        _capacity_report,
        _capacity_factsheet,
        wrong_backend="--job capacity bisects on the simulator; drop --backend",
    ),
}
assert set(JOBS) == set(JOB_NAMES), "every JobName has a JobSpec"
