"""`--job tune`: SLO-Tuner end to end, written once for batch and console (events on a sink, a result).

    result = await run_tune(profile, backend_kind="sim", sink=print_event, journal_path=Path("runs/x.jsonl"))

The flow: pick the start point K0 from the profile's knobs, run the profile's search (`tuner.algorithm`) on
the target world (simulator, or a vLLM restarted per segment), or with `tuner.guided` search the simulator
and verify the top few live; then re-measure the best once (Algorithm 1's last line) and report baseline
against tuned. Events: `start`, `tune_segment` per segment, `tune_step` per step, `tune_summary`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.backend_api import Backend
from core.events import EventSink, make_event
from core.executor import Executor
from core.profile import ClosedLoopArrival, Profile, ProfileError, TunerSpec, load_calibration, profile_hash
from core.tune.evaluator import Evaluator
from core.tune.guided import guided_search, verify_live
from core.tune.hillclimb import SearchResult, hill_climb, ranked
from core.tune.journal import Journal
from core.tune.knobspace import KnobSpace, Point
from core.tune.score import Segment
from core.tune.search import simrank_climb, successive_halving
from core.tune.segment import LiveSegmentRunner, SegmentRunner, SimSegmentRunner, TuneInterrupted

# The final re-measurement of the tuned configuration is taken FINAL_RETAKES more times when it contradicts the
# search's own measurement of it (SLO met there and missed here, or p99 more than FINAL_CONTRADICTION times
# apart either way), and the median-scored take is reported. On the shared 2-core machine vLLM's API process
# falls into slow spells that last a whole segment: a CI run (2026-11-24) re-measured its tuned point at
# attainment 0.0 and score -0.3, against 4.5 for the start. A spell in one of three takes no longer decides.
FINAL_RETAKES = 2
FINAL_CONTRADICTION = 2.0
GUIDED_BUDGET = 16  # the guided search's target-world segments when the profile sets no budget
SEGMENTS_PER_STEP = 8  # the paper's accounting: the current point and up to 7 neighbours


@dataclass(slots=True)
class TuneResult:
    profile: Profile
    backend: dict[str, Any]
    algorithm: str
    guided: bool
    seed: int
    start: Point
    baseline: Segment | None
    best: Segment | None
    final: Segment | None  # the re-measurement of the best
    search: SearchResult | None
    sim_search: SearchResult | None  # guided: the search on the simulator
    segments_used: int  # in the target world (live segments for --backend vllm), final included
    segments_resumed: int
    sim_segments: int  # guided: segments spent on the simulator (guide and ranker)
    wall_s: float
    sim_wall_s: float = 0.0  # wall time of those simulator segments
    guide_segments: int = 0  # guided (live flag): the simulator search's own segments
    interrupted: bool = False
    journal_path: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    history: list[Segment] = field(default_factory=list)  # every target-world segment, in the order taken

    @property
    def live_segments_saved(self) -> int | None:
        """Guided only: segments the same search would have measured live, minus those actually measured."""
        if not self.guided:
            return None
        return self.guide_segments + 1 - self.segments_used  # +1: that search would also re-measure its best

    @property
    def tuned(self) -> Segment | None:
        return self.final if self.final is not None else self.best

    def goodput_gain(self) -> float:
        if self.baseline is None or self.tuned is None:
            return math.nan
        base, tuned = self.baseline.goodput_rps, self.tuned.goodput_rps
        if not (math.isfinite(base) and math.isfinite(tuned)) or base <= 0:
            return math.inf if math.isfinite(tuned) and tuned > 0 else math.nan
        return tuned / base


def default_budget(spec: TunerSpec) -> int:
    """Segments in the target world, the final re-measurement included."""
    if spec.segment_budget is not None:
        return spec.segment_budget
    if spec.algorithm == "guided":
        return GUIDED_BUDGET
    return spec.steps * SEGMENTS_PER_STEP + 1


def knob_space(profile: Profile, spec: TunerSpec) -> tuple[KnobSpace, Point]:
    """The space to search and its start, the profile's knobs as given. For an open-loop workload the
    concurrency knob is an in-flight cap, and no cap (the profile's default) is one of its values."""
    arrival = profile.workload.arrival
    closed = isinstance(arrival, ClosedLoopArrival)
    space = KnobSpace(spec, open_loop=not closed)
    return space, space.start_point(profile.knobs, arrival.clients if closed else None)


async def _search(
    algorithm: str,
    evaluator: Evaluator,
    ranker: Evaluator,
    space: KnobSpace,
    start: Point,
    spec: TunerSpec,
    sink: EventSink | None,
) -> SearchResult:
    if algorithm == "hillclimb":
        return await hill_climb(evaluator, space, start, steps=spec.steps, sink=sink)
    if algorithm == "halving":
        return await successive_halving(evaluator, space, start, sink=sink)
    if algorithm == "simrank":
        return await simrank_climb(evaluator, ranker, space, start, sink=sink)
    raise ProfileError(f"tuner.algorithm {algorithm!r}: unknown; use guided, hillclimb, halving or simrank")


def _contradicts(take: Segment, searched: Segment, slo_s: float | None) -> bool:
    """Whether a re-measurement disagrees with the search's measurement of the same configuration by more
    than a shared machine's ordinary drift."""
    if not take.ok:
        return True
    if slo_s is not None and searched.p99_s <= slo_s < take.p99_s:
        return True
    low, high = sorted((take.p99_s, searched.p99_s))
    return math.isfinite(high) and low > 0 and high / low > FINAL_CONTRADICTION


async def remeasure_final(target: Evaluator, best: Segment, slo_s: float | None) -> Segment:
    """Re-measure the tuned configuration; on a contradiction take it FINAL_RETAKES more times and return the
    median-scored take (every take is in the history, the journal and the events)."""
    takes = [await target.evaluate(best.point, phase="final", step=0, force=True)]
    if not _contradicts(takes[0], best, slo_s):
        return takes[0]
    for step in range(1, FINAL_RETAKES + 1):
        takes.append(await target.evaluate(best.point, phase="final", step=step, force=True))
    return sorted(takes, key=lambda s: s.score)[len(takes) // 2]


async def run_tune(
    profile: Profile,
    *,
    backend_kind: str = "sim",
    sink: EventSink,
    seed: int | None = None,
    journal_path: Path | None = None,
    resume: bool = False,
    backend: Backend | None = None,
    spec: TunerSpec | None = None,
    executor: Executor | None = None,
    make_server: Callable[[Profile], Backend] | None = None,
) -> TuneResult:
    """Tune the profile's knobs. `backend`: a ready backend object for `backend_kind` "vllm" (tests inject
    one; default: `make_backend`). `spec` overrides `profile.tuner`. Raises ProfileError for bad input and
    BackendUnavailable when the engine cannot run at all; a single configuration that fails is scored -inf.
    `executor` (core/executor.py) runs the simulator's segments; with a pool or Ray, a sweep's segments run
    side by side (the same segments as one by one). With Ray and no `backend`, live segments are Ray tasks
    too, one serving slot each (core/tune/live_parallel.py), each starting its server with `make_server`
    (a module-level function, default: the vLLM backend the serial tuner builds)."""
    spec = spec or profile.tuner
    if profile.slo.e2e_s is None:
        raise ProfileError(f"profile {profile.name!r}: --job tune needs slo.e2e_s (the p99 target); add it")
    if backend_kind not in ("sim", "vllm"):
        raise ProfileError(f"--backend {backend_kind}: --job tune restarts the server per segment; use sim or vllm")
    seed = profile.seed if seed is None else seed
    slo_s = profile.slo.e2e_s
    space, start = knob_space(profile, spec)
    sim_runner = SimSegmentRunner(profile, load_calibration(profile), spec, executor)
    target_runner: SegmentRunner
    if backend_kind == "sim":
        target_runner = sim_runner
    elif backend is None and executor is not None and executor.kind == "ray":
        from core.tune.live_parallel import RayLiveSegmentRunner, vllm_backend

        target_runner = RayLiveSegmentRunner(profile, spec, executor, make_server or vllm_backend)
    else:
        if backend is None:
            from core.backends.factory import make_backend

            backend = make_backend("vllm", profile)
        target_runner = LiveSegmentRunner(profile, backend, spec)
    guided = spec.guided
    algorithm = spec.algorithm
    budget = None if algorithm == "hillclimb" else default_budget(spec) - 1  # -1: keep one for the final
    journal = None
    if journal_path is not None:
        journal = Journal(
            journal_path,
            {
                "profile": profile.name,
                "profile_hash": profile_hash(profile),
                "backend": backend_kind,
                "algorithm": algorithm,
                "guided": guided,
                "seed": seed,
                "start": start.as_dict(),
            },
            resume=resume,
        )
    target = Evaluator(target_runner, spec, slo_s, seed=seed, journal=journal, sink=sink, budget=budget)
    # Simulator evaluators never write the journal: their segments are cheap and a replay recomputes them
    # identically. `guide` runs a guided search's simulator phase (its count is what the same search would
    # have spent live); `ranker` only ranks moves for simrank and is no search's cost.
    guide = Evaluator(sim_runner, spec, slo_s, seed=seed, sink=None, label="guide")
    ranker = Evaluator(sim_runner, spec, slo_s, seed=seed, sink=None, label="rank")
    sink(
        make_event(
            "start",
            job="tune",
            profile=profile.name,
            seed=seed,
            backend=target_runner.description,
            algorithm=algorithm,
            guided=guided,
            slo_p99_s=slo_s,
            start_knobs=start.as_dict(),
            steps=spec.steps,
            segment_budget=None if budget is None else budget + 1,
            journal=None if journal_path is None else str(journal_path),
            resumed_segments=0 if journal is None else len(journal.segments),
        )
    )
    wall_start = time.perf_counter()
    interrupted = False
    search: SearchResult | None = None
    sim_search: SearchResult | None = None
    final: Segment | None = None
    try:
        if guided and backend_kind == "vllm":
            guide.sink = sink  # the console shows the simulator phase too (world "sim" in the events)
            target.budget = default_budget(spec) - 1
            sim_search = await _search(algorithm, guide, ranker, space, start, spec, sink)
            if spec.guided_headroom < 1.0:
                # The search saw only its own path; to find configurations with tail headroom, the
                # simulator (seconds per segment) sweeps the whole space. Not a cost the search would have.
                sweep = Evaluator(sim_runner, spec, slo_s, seed=seed, label="sweep")
                await sweep.evaluate_many(space.distinct_configs(start), phase="sweep", step=0)
                sim_search.candidates = ranked(guide.history + sweep.history)
            search = await verify_live(
                target, start, sim_search, verify=spec.guided_verify, headroom=spec.guided_headroom, sink=sink
            )
            if spec.guided_refine and target.budget_left() > 0 and search.best is not None and search.best.ok:
                refined = await simrank_climb(
                    target,
                    ranker,
                    space,
                    search.best.point,
                    sink=sink,
                    first_step=len(search.steps),
                    algorithm=f"guided-{algorithm}-refine",
                )
                search.steps.extend(refined.steps)
                search.stopped_by = refined.stopped_by
                search.best = target.best()
                search.candidates = refined.candidates
        elif algorithm == "guided":
            search = await guided_search(target, guide, space, start, sink=sink)
        else:
            search = await _search(algorithm, target, ranker, space, start, spec, sink)
        if search.best is not None and search.best.ok:
            target.budget = None  # the final re-measurement is part of every algorithm's budget already
            final = await remeasure_final(target, search.best, slo_s)
    except (TuneInterrupted, asyncio.CancelledError):
        interrupted = True
    finally:
        await target_runner.close()
        if journal is not None:
            journal.note("end", interrupted=interrupted, segments_used=target.used)
            journal.close()
    baseline = next((s for s in target.history if s.point.config_key == start.config_key and s.phase != "final"), None)
    best = search.best if search is not None else target.best()
    result = TuneResult(
        profile=profile,
        backend=target_runner.description,
        algorithm=algorithm,
        guided=guided and backend_kind == "vllm",
        seed=seed,
        start=start,
        baseline=baseline,
        best=best,
        final=final,
        search=search,
        sim_search=sim_search,
        segments_used=target.used,
        segments_resumed=target.resumed,
        sim_segments=guide.used + ranker.used,
        guide_segments=guide.used,
        sim_wall_s=sum(seg.wall_s for seg in guide.history + ranker.history),
        wall_s=time.perf_counter() - wall_start,
        interrupted=interrupted,
        journal_path=journal_path,
        history=list(target.history),
    )
    sink(tune_summary_event(result))
    return result


def _headline(segment: Segment | None) -> dict[str, Any]:
    if segment is None:
        return {"knobs": None, "p50_s": None, "p95_s": None, "p99_s": None, "goodput_rps": None, "score": None}
    return {
        "knobs": segment.point.as_dict(),
        "p50_s": segment.p50_s,
        "p95_s": segment.p95_s,
        "p99_s": segment.p99_s,
        "goodput_rps": segment.goodput_rps,
        "score": segment.score if math.isfinite(segment.score) else None,
    }


def tune_summary_event(result: TuneResult) -> dict[str, Any]:
    """The one summary of a tune result: what it found (baseline against tuned) and what it cost. The batch
    contract's last line (`tune_batch_summary`) takes its figures from here."""
    slo_s = result.profile.slo.e2e_s
    tuned = result.tuned
    return make_event(
        "tune_summary",
        algorithm=result.algorithm,
        guided=result.guided,
        slo_p99_s=slo_s,
        baseline=_headline(result.baseline),
        tuned=_headline(tuned),
        best_in_search=_headline(result.best),
        tuned_meets_slo=bool(tuned is not None and slo_s is not None and tuned.ok and tuned.p99_s <= slo_s),
        goodput_gain_x=result.goodput_gain(),
        segments_used=result.segments_used,
        segments_resumed=result.segments_resumed,
        sim_segments=result.sim_segments,
        sim_wall_s=result.sim_wall_s,
        live_segments_saved=result.live_segments_saved,
        steps=len(result.search.steps) if result.search is not None else 0,
        stopped_by=result.search.stopped_by if result.search is not None else None,
        wall_s=result.wall_s,
        interrupted=result.interrupted,
    )


def tune_batch_summary(result: TuneResult) -> dict[str, Any]:
    """The batch contract's last line: the tuned configuration's headline metrics (the final
    re-measurement's summary, every field a `run` summary has), plus what the tuning found and cost, as
    the tune summary (`tune_summary_event`) says it under the batch contract's flat names."""
    tuned = result.tuned
    headline = dict(tuned.summary) if tuned is not None else {}
    account = tune_summary_event(result)
    return make_event(
        "summary",
        job="tune",
        profile=result.profile.name,
        backend=result.backend.get("backend"),
        seed=result.seed,
        interrupted=result.interrupted,
        **headline,
        tuned_knobs=account["tuned"]["knobs"],
        baseline_knobs=result.start.as_dict(),
        baseline_p99_s=account["baseline"]["p99_s"],
        baseline_goodput_rps=account["baseline"]["goodput_rps"],
        goodput_gain_x=account["goodput_gain_x"],
        algorithm=account["algorithm"],
        guided=account["guided"],
        segments_used=account["segments_used"],
        sim_segments=account["sim_segments"],
        live_segments_saved=account["live_segments_saved"],
        tune_wall_s=account["wall_s"],
    )
