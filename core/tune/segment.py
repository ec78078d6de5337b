"""Run one measurement segment at a knob point, on the simulator or on a vLLM restarted for it.

Paper 000 sec. II-B ("implementation", "vLLM integration", "simulator"): a segment discards a warm-up and
then measures a window; failed requests stay out of the percentiles (core.metrics does that). Live, the
server is started with the segment's knobs and stopped after it, every time, because vLLM's batching and
speculation flags cannot be changed on a running server. On the simulator a segment runs until it has
both a minimum duration and a minimum number of measured requests, which tames its variance.

The client concurrency knob is the number of closed-loop clients (the paper's setting: a client sends
its next request when the previous one ends), or the in-flight cap of an open-loop workload (none when
the point is `UNLIMITED`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from core.backend_api import Backend, BackendUnavailable, LoadPlan, RunOutcome
from core.executor import Executor
from core.metrics import Summary, summarize
from core.profile import Calibration, Profile, ProfileError, TunerSpec
from core.records import RequestRecord
from core.sim.reach import RunReach
from core.tune.knobspace import Point
from core.tune.score import Variant
from core.workload import build_load_plan

# A count large enough that a time-bound segment is never cut short by the workload's request count.
UNBOUNDED_REQUESTS = 10**9
# Simulator: if the first run reaches the duration but not the request count, how much longer to run.
SIM_EXTEND_MARGIN = 1.1
SIM_MAX_RUNS = 4


class TuneInterrupted(Exception):
    """Ctrl-C (task cancellation) arrived during a segment; the segment is not recorded."""


@dataclass(slots=True)
class Measurement:
    """What a runner hands back: a summary, or the reason there is none."""

    summary: Summary | None
    wall_s: float
    error: str | None = None
    notes: dict[str, Any] | None = None
    # Simulator only: the other knob values this same measurement stands for (core/sim/reach.py).
    reach: RunReach | None = None


class SegmentRunner(Protocol):
    variant: Variant
    description: dict[str, Any]

    async def measure(self, point: Point, *, seed: int, fraction: float = 1.0) -> Measurement: ...

    async def close(self) -> None: ...


def _plan_for(profile: Profile, point: Point, *, seed: int, requests: int, duration_s: float | None) -> LoadPlan:
    tuned = profile.model_copy(update={"knobs": point.to_knobs(profile.knobs)})
    plan = build_load_plan(tuned, seed=seed, requests=requests, duration_s=duration_s)
    # Closed loop: the number of clients is the concurrency knob (build_load_plan takes it from the workload).
    # Open loop: the in-flight cap, None for no cap.
    plan.concurrency = None if point.unlimited else point.concurrency
    return plan


def _summarize(profile: Profile, outcome: RunOutcome) -> Summary:
    return summarize(outcome.records, slo=profile.slo, smooth=profile.smooth_goodput)


class SimSegmentRunner:
    """Segments on the embedded simulator (virtual time, seconds of wall time each). With a parallel
    `executor` (core/executor.py) each segment is a task there, and `parallel` tells the evaluator that
    a sweep may measure its points side by side (Evaluator.evaluate_many)."""

    variant: Variant = "sim"

    def __init__(
        self,
        profile: Profile,
        calibration: Calibration,
        spec: TunerSpec | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.profile = profile
        self.calibration = calibration
        self.spec = spec or profile.tuner
        self.description = {"backend": "sim", "engine": "simulator", "calibration": calibration.name}
        self.executor = executor
        self.parallel = executor is not None and executor.parallel
        # The runs measured so far with what each stands for (core/sim/reach.py), by everything else that makes a
        # run: its seed, the measured fraction and the speculation knobs (the profile is this runner's own).
        self._runs: dict[tuple[int, float, int, bool], list[tuple[Point, Measurement]]] = {}

    async def measure(self, point: Point, *, seed: int, fraction: float = 1.0) -> Measurement:
        same = self.same_run(point, seed=seed, fraction=fraction)
        if same is not None:
            return same
        args = (self.profile, self.calibration, self.spec, point, seed, fraction)
        if self.executor is None:
            result = await sim_segment_task(*args)
        else:
            result = await self.executor.run(f"segment {point.label()} x{fraction:.3g}", sim_segment_task, *args)
        if result.reach is not None and result.summary is not None and result.error is None:
            self._runs.setdefault(_run_family(point, seed, fraction), []).append((point, result))
        return result

    def same_run(self, point: Point, *, seed: int, fraction: float = 1.0) -> Measurement | None:
        """A measurement already made whose run is, draw for draw, the one `point` would make (core/sim/reach.py):
        the same summary, at no cost; None if there is none."""
        concurrency = None if point.unlimited else point.concurrency
        for measured, result in self._runs.get(_run_family(point, seed, fraction), ()):
            assert result.reach is not None
            if result.reach.covers(concurrency, point.max_num_seqs):
                notes = {"same_run_as": measured.label()}
                return Measurement(summary=result.summary, wall_s=0.0, notes=notes, reach=result.reach)
        return None

    def sweep_rounds(self, points: list[Point], *, seed: int, fraction: float = 1.0) -> Iterator[list[Point]]:
        """The order to measure a sweep's `points` in, as rounds each measured side by side once the one before
        has finished: first, for each speculation setting and concurrency, the largest max_num_seqs (a run can
        stand for the larger values only, and the largest most often stands for the rest: every value at or
        above a client cap, core/sim/reach.py); then whatever those runs do not stand for. Points left out
        are answered by `measure` from the runs that stand for them. On quickstart's 405 configurations this
        measures 225 (docs/speed-log.md, "The tune's sweep")."""
        tops: dict[tuple[int, bool, int], Point] = {}
        for point in points:
            chain = (point.spec_width, point.spec_on, point.concurrency)
            if chain not in tops or point.max_num_seqs > tops[chain].max_num_seqs:
                tops[chain] = point
        first = set(tops.values())
        yield [point for point in points if point in first]
        yield [p for p in points if p not in first and self.same_run(p, seed=seed, fraction=fraction) is None]

    async def close(self) -> None:
        return None


def _run_family(point: Point, seed: int, fraction: float) -> tuple[int, float, int, bool]:
    return (seed, fraction, point.spec_width, point.spec_on)


async def sim_segment_task(
    profile: Profile, calibration: Calibration, spec: TunerSpec, point: Point, seed: int, fraction: float
) -> Measurement:
    """One simulator segment at `point` (an executor task: everything it needs comes in, a summary goes out)."""
    from core.backends.sim import SimBackend

    wall_start = time.perf_counter()
    min_requests = max(1, math.ceil(spec.sim_min_requests * fraction))
    min_duration_s = spec.sim_min_duration_s * fraction
    warmup = profile.workload.warmup_requests
    knobs = point.to_knobs(profile.knobs)
    # First run: enough requests for the count minimum with no time limit; if that finishes before the
    # duration minimum, run again time-bound (longer), and so on until both minimums hold.
    requests, duration_s = min_requests + warmup, None
    summary: Summary | None = None
    reach: RunReach | None = None
    for run in range(SIM_MAX_RUNS):
        plan = _plan_for(profile, point, seed=seed, requests=requests, duration_s=duration_s)
        # No engine samples: a segment is judged on its records alone, and a sample every 0.5 virtual seconds
        # also ends each of the simulator's decode runs there (same timelines either way: its fast path is exact).
        backend = SimBackend(calibration, knobs, seed=seed, sample_interval_s=math.inf)
        outcome = await backend.run(plan)
        if outcome.interrupted:
            raise TuneInterrupted
        # Every run of the segment must be the same under the other knobs, so the segment stands for what all do.
        ran = backend.last_engine.reach() if backend.last_engine is not None else None
        if run == 0:
            reach = ran
        elif reach is not None:
            reach = None if ran is None else reach.joined(ran)
        summary = _summarize(profile, outcome)
        span = summary.window_s if math.isfinite(summary.window_s) else 0.0
        if summary.requests >= min_requests and span >= min_duration_s:
            break
        rate = summary.requests / span if span > 0 else 0.0
        needed_s = min_requests / rate if rate > 0 else min_duration_s
        duration_s = max(min_duration_s, needed_s) * SIM_EXTEND_MARGIN
        requests = UNBOUNDED_REQUESTS
    return Measurement(summary=summary, wall_s=time.perf_counter() - wall_start, reach=reach)


class LiveSegmentRunner:
    """Segments on a vLLM that this runner starts with the segment's knobs and stops afterwards.

    `backend` is a `VllmBackend` (start(knobs) / run / stop). A server that does not start, or dies during
    the segment, gives a Measurement with the cause and no summary: the tuner scores it -inf and goes on.
    The server is stopped in every case (finished, failed, Ctrl-C), by process group.
    """

    variant: Variant = "live"

    def __init__(self, profile: Profile, backend: Backend, spec: TunerSpec | None = None) -> None:
        self.profile = profile
        self.backend: Any = backend
        self.spec = spec or profile.tuner
        self.description = backend.describe()

    async def measure(self, point: Point, *, seed: int, fraction: float = 1.0) -> Measurement:
        ServerStartError = _server_start_error()

        wall_start = time.perf_counter()
        measure_s = self.spec.measure_s * fraction
        knobs = point.to_knobs(self.profile.knobs)
        plan = _plan_for(
            self.profile, point, seed=seed, requests=UNBOUNDED_REQUESTS, duration_s=self.spec.warmup_s + measure_s
        )
        # The warm-up is time-based live (sec. II-B: 10 s discarded); drop the workload's count-based one
        # so the two do not add up.
        plan.warmup_s = self.spec.warmup_s
        plan.warmup_requests = 0
        try:
            try:
                await self.backend.start(knobs)
            except (ServerStartError, ProfileError) as exc:
                # ProfileError here is UnsupportedKnob: this vLLM cannot express the point (e.g. speculation
                # without a draft model). Like a failed start, the point is unusable and the search goes on.
                return Measurement(None, time.perf_counter() - wall_start, error=f"server did not start: {exc}")
            outcome = await self.backend.run(plan)
        except asyncio.CancelledError:
            raise TuneInterrupted from None
        except ServerStartError as exc:
            return Measurement(None, time.perf_counter() - wall_start, error=f"server did not start: {exc}")
        finally:
            await _stop_quietly(self.backend)
        wall_s = time.perf_counter() - wall_start
        if outcome.interrupted:
            raise TuneInterrupted
        notes = outcome.notes.get("vllm") or {}
        if notes.get("state") == "crashed" or "server_lost" in outcome.notes:
            cause = notes.get("crash") or "the server went away during the segment"
            line = notes.get("log_line")
            return Measurement(None, wall_s, error=f"server crashed: {cause}" + (f"; log says: {line}" if line else ""))
        summary = _summarize(self.profile, outcome)
        if summary.completed == 0:
            return Measurement(summary, wall_s, error="no request completed in the measurement window")
        measured_notes: dict[str, Any] = {"startup_s": notes.get("startup_s")}
        if "server" in outcome.notes:
            # What the server's own /metrics counted over the segment (tokens, speculation's drafts and
            # acceptance): evidence of the flags it actually ran with, beside the client's timings.
            measured_notes["server"] = outcome.notes["server"]
        if summary.failed:
            measured_notes["failure_causes"] = failure_causes(outcome.records)
        return Measurement(summary, wall_s, notes=measured_notes)

    async def close(self) -> None:
        await _stop_quietly(self.backend)


def failure_causes(records: list[RequestRecord], most: int = 3) -> dict[str, int]:
    """The commonest causes of the measured requests that failed, with their counts: a live segment with
    failures says why (a timeout, a broken stream, an HTTP error), not only how many."""
    causes = Counter(r.error or r.status.value for r in records if not r.warmup and not r.ok)
    return dict(causes.most_common(most))


def _server_start_error() -> type[BaseException]:
    """The live path's "server did not become ready" error (core.serve.process), resolved lazily so the
    simulator-only tuner does not import the process manager."""
    try:
        from core.serve.process import ServerStartError
    except ImportError:  # pragma: no cover - a checkout without the live path
        return _NoServerStartError
    return ServerStartError


class _NoServerStartError(Exception):
    """Stands in for ServerStartError where the live path is not installed (nothing raises it)."""


async def _stop_quietly(backend: Any) -> None:
    """Stop the server even while a cancellation is pending: shield the stop so Ctrl-C cannot leave a vLLM
    process group behind (the stop itself signals the group and waits for it)."""
    stop = getattr(backend, "stop", None) or backend.close
    task = asyncio.ensure_future(stop())
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
    except BackendUnavailable:
        pass
