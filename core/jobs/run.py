"""The run job: offer a profile's workload to a backend, written once for batch and console.

A job turns a profile and a backend into events on a sink and a result. The batch runner prints the
events as JSON Lines; the console renders the same events in panels.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from core.backend_api import Backend, EngineSample, RunOutcome
from core.backends.account import client_account
from core.energy import EnergyMeter, EnergyReading, UnavailableMeter, auto_meter
from core.events import FLOAT_DIGITS, Event, EventSink, _clean, make_event, null_sink
from core.metrics import Summary, WindowedAggregator, summarize
from core.pickling import reduce_by_fields
from core.profile import DEFAULT_MODE, KnobsSpec, Profile, SchedulingMode, parse_scheduling_mode
from core.records import RequestRecord, Status
from core.workload import build_load_plan

PROGRESS_EVERY_REQUESTS = 250  # a progress event per this many finished requests
LIVE_WINDOW_S = 10.0  # the sliding window behind the live p99 / goodput in progress events


@dataclass(slots=True)
class RunOptions:
    seed: int | None = None
    requests: int | None = None
    duration_s: float | None = None
    progress_every: int = PROGRESS_EVERY_REQUESTS
    engine_events: bool = True
    # Batch: engine events at the progress cadence (the latest sample, just before each progress event) instead
    # of every sample (one per 0.5 virtual seconds: 47k JSON lines, a fifth of a 100k-request run's CPU). The
    # console keeps every sample for its live panels.
    engine_events_with_progress: bool = False
    # Called with each finished record as it finishes (batch streams requests.jsonl with it).
    on_record: Callable[[RequestRecord], None] | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(slots=True)
class RunResult:
    profile: Profile
    backend: dict[str, Any]
    summary: Summary
    outcome: RunOutcome
    seed: int
    wall_s: float
    interrupted: bool = False
    # Measured energy over the run (live backends); None: model it (simulator) or unavailable.
    energy: EnergyReading | None = None
    knobs: KnobsSpec | None = None
    started_at: datetime | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # The scheduling mode that ran, as the backend reports it (scheduling_mode_that_ran).
    scheduling_mode: SchedulingMode = DEFAULT_MODE

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    @property
    def records(self) -> list[RequestRecord]:
        return self.outcome.records


class _RunObserver:
    """Turns records and engine samples into progress events with a sliding-window view."""

    def __init__(self, profile: Profile, sink: EventSink, options: RunOptions, *, final_records: bool) -> None:
        self.sink = sink
        self.options = options
        # final_records: a record is complete when it reaches on_record (the simulator), so the window's outcomes
        # can serve the summary. A live backend may still complete records after the run (the gateway's
        # settle reconciles every record), so there the summary judges them afresh.
        self.window = WindowedAggregator(
            LIVE_WINDOW_S, profile.slo, profile.smooth_goodput, keep_outcomes=final_records
        )
        self.finished = 0
        self.failed = 0
        self.last_time_s = 0.0
        self.meter: EnergyMeter | None = None
        # Energy from the meter's start to the first measured send (server start-up and warm-up).
        self.startup_energy: EnergyReading | None = None
        self.held_sample: EngineSample | None = None  # engine_events_with_progress: the latest, not yet emitted

    def on_measurement_start(self, time_s: float) -> None:
        """A live load client sends its first measured request: energy is measured from here on."""
        if self.meter is not None and self.startup_energy is None:
            self.startup_energy = self.meter.stop()
            self.meter = _live_meter()
            self.meter.start()

    def on_record(self, record: RequestRecord) -> None:
        if self.options.on_record is not None:
            self.options.on_record(record)
        self.window.add(record)
        self.finished += 1
        # record.ok and max() written out (once per record, 100k a run): the same tests.
        if record.status is not Status.OK:
            self.failed += 1
        end_s = record.end_s
        if end_s is not None and end_s > self.last_time_s:
            self.last_time_s = end_s
        if self.finished % self.options.progress_every == 0:
            self.emit_progress()

    def emit_progress(self) -> None:
        if self.held_sample is not None:
            self.emit_engine(self.held_sample)
            self.held_sample = None
        if self.sink is null_sink:
            # Nobody reads the event (a capacity probe): the window moves on as the snapshot would move it (the
            # same records judged in the same batches, the same rows dropped), without its percentiles.
            self.window.advance(self.last_time_s)
            return
        snap = self.window.snapshot(self.last_time_s).to_dict()
        # make_event("progress", t_s=..., finished=..., failed=..., window=snap), cleaned here (compiled): one
        # event per 250 records, and make_event's interpreted _clean of each field was most of its cost.
        self.sink(
            {
                "event": "progress",
                "t_s": _cleaned(self.last_time_s),
                "finished": self.finished,
                "failed": self.failed,
                "window": {key: _cleaned(value) for key, value in snap.items()},
            }
        )

    def on_engine_sample(self, sample: EngineSample) -> None:
        if not self.options.engine_events:
            return
        if self.options.engine_events_with_progress:
            self.held_sample = sample
            return
        self.emit_engine(sample)

    def emit_engine(self, sample: EngineSample) -> None:
        # make_event("engine", ...) with its fields cleaned here (compiled), as in emit_progress.
        event: Event = {
            "event": "engine",
            "t_s": _cleaned(sample.time_s),
            "running": _cleaned(sample.running),
            "waiting": _cleaned(sample.waiting),
            "kv_usage": _cleaned(sample.kv_usage),
            "preemptions_total": _cleaned(sample.preemptions_total),
            "generated_tokens_total": _cleaned(sample.generated_tokens_total),
            "spec_draft_tokens_total": _cleaned(sample.spec_draft_tokens_total),
            "spec_accepted_tokens_total": _cleaned(sample.spec_accepted_tokens_total),
            "power_w": _cleaned(sample.power_w),
        }
        self.sink(event)


def _cleaned(value: object) -> object:
    """What core.events._clean makes of one event field (make_event cleans each): a float rounded to
    FLOAT_DIGITS, or None if not finite; None, int, str and bool as they are; anything else by _clean itself."""
    kind = type(value)
    if kind is float:
        number = cast(float, value)
        return round(number, FLOAT_DIGITS) if math.isfinite(number) else None
    if value is None or kind is int or kind is str or kind is bool:
        return value
    return _clean(value)


def scheduling_mode_that_ran(description: Mapping[str, Any]) -> SchedulingMode:
    """The mode a backend serves, from its own `describe()`: the simulator's controller (`mode`), or the
    admission gateway's (`gateway.mode`) in front of a live server. A live server with no gateway in front
    runs no controller: that is vLLM's own scheduler, fcfs."""
    gateway = description.get("gateway")
    reported = gateway.get("mode") if isinstance(gateway, Mapping) else description.get("mode")
    return DEFAULT_MODE if reported is None else parse_scheduling_mode(str(reported), "backend mode")


def summary_event(result: RunResult) -> dict[str, Any]:
    """The final line of a batch run: every headline metric, byte-stable for a given profile and seed."""
    return make_event(
        "summary",
        profile=result.profile.name,
        backend=result.backend.get("backend"),
        scheduling_mode=result.scheduling_mode,
        seed=result.seed,
        interrupted=result.interrupted,
        **result.summary.to_dict(),
        **result.extra.get("client", {}),
        **({"trace_rows": result.extra["trace_rows"]} if "trace_rows" in result.extra else {}),
    )


async def run_workload(
    profile: Profile, backend: Backend, sink: EventSink, options: RunOptions | None = None
) -> RunResult:
    """Offer the profile's workload to the backend, stream events, and summarise what was measured."""
    options = options or RunOptions()
    seed = options.seed if options.seed is not None else profile.seed
    plan = build_load_plan(profile, seed=seed, requests=options.requests, duration_s=options.duration_s)
    description = backend.describe()
    mode = scheduling_mode_that_ran(description)
    sink(
        make_event(
            "start",
            job="run",
            profile=profile.name,
            seed=seed,
            backend=description,
            scheduling_mode=mode,
            knobs=profile.knobs.model_dump(),
            mode=plan.mode,
            max_requests=plan.max_requests,
            duration_s=plan.duration_s,
        )
    )
    observer = _RunObserver(profile, sink, options, final_records=description.get("backend") == "sim")
    started_at = datetime.now(UTC)
    # Live servers: measure energy (NVML on a GPU, else RAPL on the CPU package) over the measurement
    # window: the load client restarts the meter when it sends its first measured request, so server
    # start-up and warm-up are reported apart (extra["startup_energy"]).
    if description.get("backend") != "sim":
        observer.meter = _live_meter()
        observer.meter.start()
    wall_start = time.perf_counter()
    try:
        outcome = await backend.run(plan, observer)
    finally:
        energy = observer.meter.stop() if observer.meter is not None else None
    wall_s = time.perf_counter() - wall_start
    if observer.finished % options.progress_every:
        observer.emit_progress()
    elif observer.held_sample is not None:  # the engine's last state, after the last progress event
        observer.emit_engine(observer.held_sample)
    # The live window has judged every finished record once; the summary reuses those outcomes (simulator).
    summary = summarize(outcome.records, slo=profile.slo, smooth=profile.smooth_goodput, judged=observer.window.judged)
    extra: dict[str, Any] = {}
    if observer.startup_energy is not None:
        extra["startup_energy"] = observer.startup_energy
    account = client_account(outcome)
    if account:
        extra["client"] = account
    if plan.trace_rows is not None:
        # Every row the run sent (warm-up, rejected and deferred included) has a record; the rest were cut by
        # --requests / workload.requests / the duration, or by Ctrl-C.
        extra["trace_rows"] = {"used": len(outcome.records), "total": plan.trace_rows}
    if "client_behind" in outcome.notes:
        sink(make_event("warning", source="load_client", message=outcome.notes["client_behind"], **account))
    return RunResult(
        profile=as_run(profile, options.requests, options.duration_s),
        backend=description,
        summary=summary,
        outcome=outcome,
        seed=seed,
        wall_s=wall_s,
        interrupted=outcome.interrupted,
        energy=energy,
        knobs=profile.knobs,
        started_at=started_at,
        extra=extra,
        scheduling_mode=mode,
    )


def as_run(profile: Profile, requests: int | None, duration_s: float | None) -> Profile:
    """The profile with the command line's --requests / --duration in its workload: what the factsheet
    describes is the workload that ran, not the one the file would have run."""
    update: dict[str, Any] = {}
    if requests is not None:
        update["requests"] = requests
    if duration_s is not None:
        update["duration_s"] = duration_s
    if not update:
        return profile
    return profile.model_copy(update={"workload": profile.workload.model_copy(update=update)})


def _live_meter() -> EnergyMeter:
    """NVML when a GPU is visible, else RAPL; a meter that reports why when neither is readable."""
    gpu = auto_meter("gpu")
    return auto_meter("cpu") if isinstance(gpu, UnavailableMeter) else gpu
