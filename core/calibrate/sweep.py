"""The profiling sweep: what to measure on a server, and how request records become step observations.

The simulator (core/sim/engine.py) charges each engine step `step_time(batched_tokens, context_tokens,
spec_steps, sequences)`. The sweep measures those same steps from the client side, with `ignore_eos` and a
fixed output length so every request decodes exactly as long as asked:

- decode: closed-loop clients at several concurrencies with `max_num_seqs` above all of them, short and long
  prompts. Every gap between two streamed chunks of a request is one engine step (or `tokens` steps when
  the server coalesced tokens into one chunk). For each gap the sweep reconstructs, from all records of the
  run, how many requests were decoding at that moment (the batch), the KV context they held (block-rounded
  prompt plus tokens generated so far, as the simulator counts it), and whether another request finished
  its prefill inside the gap (such gaps are mixed steps and are left out). Gaps are grouped by batch size;
  a group's median is one decode observation.
- prefill: concurrency 1, several prompt lengths, 4 output tokens: the median TTFT per length is one
  prefill step plus the per-request latency outside the engine (fit.py separates the two).
- speculation (when the profile names a draft model or method): the decode sweep again with
  `num_speculative_tokens` = k, which prices the draft's k sequential passes per step (`spec_steps`), and
  the server's /metrics acceptance counters, which give the calibration's default acceptance.

Timing source. The simulator models the engine, so the fit wants engine steps. When the server exposes
vLLM's /metrics, each point is timed by the engine itself: the increments over the point of
`inter_token_latency_seconds` (engine-core timestamps between a request's consecutive outputs: the step
period, one sample per decoding request per step), `iteration_tokens_total` (tokens per engine step; its
count is the number of steps) and `request_prefill_time_seconds` (engine time from scheduling to the first
token). Their sums and counts are exact even though the buckets are coarse. The client's chunk gaps are
the fallback (the simulator target, or servers without /metrics): on a CPU shared by the engine, its
worker and the client, vLLM's API server can be starved and deliver a whole stream in one burst, so gaps
then measure delivery, not steps (seen on the 2-core development machine: ~15 us gaps, TTFT close to e2e).

A target is what is measured: a vLLM this process starts (`VllmTarget`, restarted per knob setting), a
running server (`UrlTarget`, its knobs as they are), or the simulator itself (`SimTarget`, which lets the
tests check that a sweep of a known calibration recovers it).

Modules: sweep_points.py (settings, points, results), sweep_targets.py (targets, server facts),
engine_counters.py (/metrics sums and counts), step_observations.py (records to steps); this one runs it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator

import numpy as np

from core.backend_api import LoadPlan
from core.calibrate.engine_counters import EngineCounters
from core.calibrate.fit import StepObservation
from core.calibrate.stalls import StallSample
from core.calibrate.step_observations import summarize_point
from core.calibrate.sweep_points import (
    PointResult,
    ServerFacts,
    SweepPoint,
    SweepResult,
    SweepSettings,
    Timing,
    plan_points,
)
from core.calibrate.sweep_targets import SweepTarget
from core.events import EventSink, make_event
from core.profile import KnobsSpec
from core.records import RequestSpec


class _RequestIds:
    """Request ids unique over the whole sweep: the client salts each prompt with its id, so a repeated id
    would let vLLM's prefix cache skip a prefill the sweep means to measure."""

    def __init__(self) -> None:
        self.next = 0

    def specs(self, point: SweepPoint) -> Iterator[RequestSpec]:
        while True:
            self.next += 1
            yield RequestSpec(
                request_id=self.next, prompt_tokens=point.prompt_tokens, output_tokens=point.output_tokens
            )


async def run_sweep(
    target: SweepTarget,
    settings: SweepSettings,
    base_knobs: KnobsSpec,
    *,
    with_spec: bool,
    sink: EventSink | None = None,
) -> SweepResult:
    """Measure every point of the sweep on `target`. Starts (or restarts) the server at most twice: once
    without speculation, once with it. Cancellation returns what was measured (`interrupted`)."""
    emit = sink or (lambda _event: None)
    points = plan_points(settings, with_spec and target.can_change_knobs)
    notes: list[str] = []
    if with_spec and not target.can_change_knobs:
        notes.append("speculation not measured: the server's knobs cannot be changed from here")
    longest = max(p.prompt_tokens for p in points)
    plain = base_knobs.model_copy(
        update={
            "max_num_seqs": settings.max_num_seqs,
            "spec_on": False,
            "spec_width": 0,
            "max_num_batched_tokens": max(base_knobs.max_num_batched_tokens, longest + settings.max_num_seqs),
            "concurrency": None,
        }
    )
    spec_knobs = plain.model_copy(update={"spec_on": True, "spec_width": settings.spec_width})
    ids = _RequestIds()
    results: list[PointResult] = []
    stall_samples: list[StallSample] = []
    facts = ServerFacts(None, None, None)
    interrupted = False
    measured: dict[int, list[PointResult]] = {}  # the current group's repeats, by point
    try:
        # Points run in groups of the same server knobs. Within a group the decode repeats are interleaved
        # (c1, c4, c8, c1, c4, c8, ...), and each point keeps its fastest repeat: on a shared machine whose
        # speed drifts over a minute, every point then sees the same mix of machine states, so one step
        # model can fit them (measured point after point, a CI run fitted decode c4 at 2.6 ms against 5.9).
        groups: list[tuple[KnobsSpec, list[SweepPoint]]] = []
        for point in points:
            knobs = spec_knobs if point.spec_width else plain
            if not groups or groups[-1][0] != knobs:
                groups.append((knobs, []))
            groups[-1][1].append(point)
        for knobs, group in groups:
            emit(
                make_event(
                    "calibrate_server",
                    knobs=knobs.model_dump(),
                    target=target.name,
                    knobs_applied=target.can_change_knobs,  # a --url server keeps its own
                )
            )
            await target.use(knobs)
            if facts.block_size is None:
                facts = await target.facts()
            block = facts.block_size or 16
            measured = {i: [] for i in range(len(group))}
            rounds = max(1, settings.decode_repeats)
            for repeat in range(rounds):
                for i, point in enumerate(group):
                    if point.kind != "decode" and repeat > 0:
                        continue  # prefill points are measured once
                    result, interrupted = await _measure_point(target, point, ids, settings, block)
                    measured[i].append(result)
                    stall_samples.append(result.stalls)
                    if interrupted:
                        break
                if interrupted:
                    break
            _keep_fastest(measured, results, emit)
            measured = {}
            if interrupted:
                break
    except asyncio.CancelledError:
        interrupted = True
        # Ctrl-C between two requests of a point (or while /metrics is read) lands here, not in a returned
        # `interrupted`: the repeats finished so far are kept all the same, so sweep.json holds them.
        _keep_fastest(measured, results, emit)
    description = target.describe()
    return SweepResult(settings, facts, results, description, notes, interrupted, stall_samples)


async def _measure_point(
    target: SweepTarget, point: SweepPoint, ids: _RequestIds, settings: SweepSettings, block: int
) -> tuple[PointResult, bool]:
    """One measurement of a point: (its result, whether the run was interrupted)."""
    plan = LoadPlan(
        requests=ids.specs(point),
        mode="closed",
        concurrency=point.concurrency,
        # One request per client first, discarded: connection set-up and cold paths after a start.
        warmup_requests=point.concurrency,
        max_requests=point.requests + point.concurrency,
        duration_s=settings.point_max_s,
    )
    before = await target.metrics_text()
    started = time.perf_counter()
    outcome = await target.run(plan)
    wall_s = time.perf_counter() - started
    after = await target.metrics_text() if before is not None else None
    counters = None
    if before is not None and after is not None:
        counters = EngineCounters.parse(after).since(EngineCounters.parse(before))
    return summarize_point(point, outcome, wall_s, block, counters), outcome.interrupted


def _keep_fastest(measured: dict[int, list[PointResult]], results: list[PointResult], emit: EventSink) -> None:
    """Each point of a group enters the sweep once, as its fastest repeat (in the group's order)."""
    for i in sorted(measured):
        if measured[i]:
            result = _fastest_repeat(measured[i])
            results.append(result)
            emit(make_event("calibrate_point", **result.to_dict()))


def _fastest_repeat(results: list[PointResult]) -> PointResult:
    """The repeat whose median client e2e, stalls taken out, is the lowest; it keeps its own records,
    counters and observations, so everything about it stays consistent.

    The fastest, not the median: what disturbs a point on these machines only ever slows it. vLLM's API
    process falls into spells of writing whole responses several times slower, and a spell that lasts a
    whole repeat leaves no silence inside it to take out (its own typical step is the spell's). A CI run on
    2026-11-24 had 3 of 5 repeats of one point in such spells, so their median was 3x the engine's step
    (decode c8 14.1 ms measured against 4.4 ms fitted); the fastest repeat is the server undisturbed, and the
    stalls are measured on their own (core/calibrate/stalls.py)."""
    timed = [r for r in results if r.e2e_p50_s is not None]
    if not timed:
        return results[-1]
    observed = [r for r in timed if r.e2e_observation is not None]
    if observed:
        chosen = min(observed, key=lambda r: r.e2e_observation.step_s if r.e2e_observation is not None else 0.0)
    else:
        chosen = min(timed, key=lambda r: r.e2e_p50_s or 0.0)
    chosen.repeat_e2e_p50_s = [r.e2e_p50_s for r in results if r.e2e_p50_s is not None]
    return chosen


def measured_decode_steps(result: SweepResult, timing: Timing = "e2e") -> list[tuple[StepObservation, float]]:
    """(observation, measured step) of every decode observation without speculation: the yardstick the
    fitted model is checked against."""
    decode = {id(o) for p in result.decode_points(spec=False) for o in [*p.observations, p.e2e_observation]}
    return [(o, o.step_s) for o in result.observations(timing) if id(o) in decode]


def median_itl(result: SweepResult, timing: Timing = "e2e") -> float | None:
    """Median measured decode step over the points without speculation."""
    steps = [step for _, step in measured_decode_steps(result, timing)]
    return float(np.median(steps)) if steps else None


def finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
