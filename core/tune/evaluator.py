"""Turn "what is S(K)?" into a segment, at most once per configuration, journaled, within a budget.

Every search algorithm asks the evaluator; it answers from, in order:
1. the run's memory of configurations already measured (unless the profile asks to re-measure): a
   configuration is one experiment, measured once per run (issue 4 part 3);
2. the journal of an interrupted run being resumed: the search replays deterministically, so the same
   (phase, step, configuration) key comes up again and its stored result is used;
3. a new segment on the runner, appended to the journal as soon as it finishes.
Only 2 and 3 are segments of the run; the budget counts them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from core.events import EventSink, make_event
from core.profile import TunerSpec
from core.tune.journal import Journal
from core.tune.knobspace import Point
from core.tune.score import FAILED_SCORE, Segment, score
from core.tune.segment import Measurement, SegmentRunner

FINAL_SEED_OFFSET = 1  # the final re-measurement sees fresh randomness (simulator), not the search's draws


class BudgetExhausted(Exception):
    """The segment budget is spent; the search stops and reports what it has."""


class Evaluator:
    def __init__(
        self,
        runner: SegmentRunner,
        spec: TunerSpec,
        slo_s: float,
        *,
        seed: int,
        journal: Journal | None = None,
        sink: EventSink | None = None,
        budget: int | None = None,
        label: str = "",
    ) -> None:
        self.runner = runner
        self.spec = spec
        self.slo_s = slo_s
        self.seed = seed
        self.journal = journal
        self.sink = sink
        self.budget = budget
        self.label = label  # prefixes journal keys so two evaluators (simulator guide, live) never collide
        self.memo: dict[tuple[tuple[int, int, int], float], Segment] = {}
        self.history: list[Segment] = []  # every segment of the run, in the order it was taken
        self.measured = 0  # new segments in this process
        self.resumed = 0  # segments taken from the journal
        self.memo_hits = 0
        # Segments measured ahead by evaluate_many (already journaled), by journal key, each used once.
        self.ready: dict[str, Segment] = {}

    @property
    def variant(self) -> str:
        return self.runner.variant

    @property
    def used(self) -> int:
        return self.measured + self.resumed

    def budget_left(self) -> float:
        return math.inf if self.budget is None else self.budget - self.used

    def known(self, point: Point, fraction: float = 1.0) -> Segment | None:
        if self.spec.remeasure:
            return None
        return self.memo.get((point.config_key, fraction))

    def segment_key(self, point: Point, phase: str, step: int, fraction: float) -> str:
        conc, seqs, width = point.config_key
        key = f"{phase}:{step}:c{conc or 'inf'}-s{seqs}-w{width}"
        if fraction != 1.0:
            key += f":f{fraction:.4f}"
        return f"{self.label}/{key}" if self.label else key

    def score_of(self, point: Point, goodput_rps: float, p99_s: float) -> float:
        return score(goodput_rps, p99_s, self.slo_s, point, self.spec, self.runner.variant)  # type: ignore[arg-type]

    async def evaluate(
        self, point: Point, *, phase: str, step: int, fraction: float = 1.0, force: bool = False
    ) -> Segment:
        if not force:
            cached = self.known(point, fraction)
            if cached is not None:
                self.memo_hits += 1
                return cached
        key = self.segment_key(point, phase, step, fraction)
        ahead = self.ready.pop(key, None)
        stored = self.journal.lookup(key) if self.journal is not None and ahead is None else None
        if ahead is not None:
            segment = ahead
            self.measured += 1
            source = "measured"
        elif stored is not None:
            self.resumed += 1
            segment = stored
            source = "journal"
        else:
            if self.budget_left() <= 0:
                raise BudgetExhausted
            segment = await self._measure(point, key, phase, step, fraction)
            self.measured += 1
            source = "measured"
            if self.journal is not None:
                self.journal.append(segment)
        self.memo.setdefault((point.config_key, fraction), segment)
        if not force:
            self.memo[(point.config_key, fraction)] = segment
        self.history.append(segment)
        self._emit(segment, source)
        return segment

    async def evaluate_many(
        self, points: Sequence[Point], *, phase: str, step: int, fraction: float = 1.0
    ) -> list[Segment]:
        """`[await self.evaluate(p, phase=phase, step=step, fraction=fraction) for p in points]`, with the
        same segments, events and budget; on a parallel runner (a process pool, Ray tasks, live segments on
        Ray) the points that loop would measure are measured side by side first, each journaled the moment
        it finishes (a Ctrl-C or a kill mid-step keeps the finished ones for --resume), so the loop's
        answers and its BudgetExhausted come out exactly as they would one by one. A runner with
        `sweep_rounds` (the simulator's) is measured ahead in its rounds, serial or not, so that the points a
        run stands for are answered from it (core/sim/reach.py)."""
        rounds = getattr(self.runner, "sweep_rounds", None)
        if getattr(self.runner, "parallel", False) or rounds is not None:
            todo = self._ahead_of(points, phase, step, fraction)
            seed = self.seed_for(phase, step)
            # A simulator runner orders a sweep in rounds so that one run can answer for others (core/sim/reach.py);
            # the points no round measured are answered by the runner in the loop below, at no cost.
            key_of = {point: key for key, point in todo}
            batches = [[p for _, p in todo]] if rounds is None else rounds(list(key_of), seed=seed, fraction=fraction)
            for batch in batches:
                await self._measure_side_by_side([(key_of[p], p) for p in batch], phase, step, fraction, seed)
        return [await self.evaluate(point, phase=phase, step=step, fraction=fraction) for point in points]

    async def _measure_side_by_side(
        self, todo: list[tuple[str, Point]], phase: str, step: int, fraction: float, seed: int
    ) -> None:
        measuring = [asyncio.ensure_future(self._measure_ahead(p, k, phase, step, fraction, seed)) for k, p in todo]
        try:
            await asyncio.gather(*measuring)
        finally:
            for task in measuring:  # one failed or the step was cancelled: stop the others
                task.cancel()
            await asyncio.gather(*measuring, return_exceptions=True)

    def _ahead_of(self, points: Sequence[Point], phase: str, step: int, fraction: float) -> list[tuple[str, Point]]:
        """(key, point) for each point the one-by-one loop would measure, in its order: not known, not in
        the journal, within the budget (a journaled point spends budget too, as `evaluate` counts it)."""
        left = self.budget_left()
        seen: set[tuple[int, int, int]] = set()
        todo: list[tuple[str, Point]] = []
        for point in points:
            if self.known(point, fraction) is not None or point.config_key in seen:
                continue
            seen.add(point.config_key)
            key = self.segment_key(point, phase, step, fraction)
            if self.journal is None or self.journal.lookup(key) is None:
                if left <= 0:
                    break
                todo.append((key, point))
            left -= 1
        return todo

    async def _measure_ahead(self, point: Point, key: str, phase: str, step: int, fraction: float, seed: int) -> None:
        result = await self.runner.measure(point, seed=seed, fraction=fraction)
        segment = self._segment(point, key, phase, step, fraction, result)
        if self.journal is not None:
            self.journal.append(segment)
        self.ready[key] = segment

    def seed_for(self, phase: str, step: int) -> int:
        # Each take of the final re-measurement (core/tune/job.remeasure_final) draws afresh: a retake with the
        # first take's seed would repeat it exactly on the simulator.
        return self.seed + (FINAL_SEED_OFFSET + step if phase == "final" else 0)

    async def _measure(self, point: Point, key: str, phase: str, step: int, fraction: float) -> Segment:
        result = await self.runner.measure(point, seed=self.seed_for(phase, step), fraction=fraction)
        return self._segment(point, key, phase, step, fraction, result)

    def _segment(self, point: Point, key: str, phase: str, step: int, fraction: float, result: Measurement) -> Segment:
        summary = result.summary
        segment = Segment(
            key=key,
            point=point,
            phase=phase,
            step=step,
            score=FAILED_SCORE,
            wall_s=result.wall_s,
            error=result.error,
            measure_fraction=fraction,
        )
        if summary is not None:
            segment.p50_s = summary.p50_s
            segment.p95_s = summary.p95_s
            segment.p99_s = summary.p99_s
            segment.goodput_rps = summary.goodput_rps
            segment.throughput_rps = summary.throughput_rps
            segment.requests = summary.requests
            segment.completed = summary.completed
            segment.failed = summary.failed
            segment.window_s = summary.window_s
            segment.summary = summary.to_dict()
            if result.notes and result.notes.get("failure_causes"):
                segment.summary["failure_causes"] = result.notes["failure_causes"]
        if result.error is None and summary is not None:
            segment.score = self.score_of(point, summary.goodput_rps, summary.p99_s)
            if not math.isfinite(segment.score):
                segment.error = "no latency measured (no request completed)"
        return segment

    def _emit(self, segment: Segment, source: str) -> None:
        if self.sink is None:
            return
        fields: dict[str, Any] = {
            "world": self.runner.variant,
            "phase": segment.phase,
            "step": segment.step,
            "knobs": segment.point.as_dict(),
            "source": source,
            "segments_used": self.used,
            **segment.metrics(),
            "wall_s": segment.wall_s,
        }
        if segment.error:
            fields["error"] = segment.error
        if segment.summary.get("failure_causes"):
            fields["failure_causes"] = segment.summary["failure_causes"]
        if segment.measure_fraction != 1.0:
            fields["measure_fraction"] = segment.measure_fraction
        self.sink(make_event("tune_segment", **fields))

    def best(self, *, full_only: bool = True) -> Segment | None:
        """The answer of the searches beyond the paper: the highest-scoring segment whose p99 meets the SLO,
        else the highest-scoring one (full-length segments only, unless asked). SLO first (the paper's
        design goal 2): with lambda = 5, eq. 3 lets a point a few percent over the SLO outscore one under it
        when its goodput is higher, and a re-measurement of such a point on a noisy machine lands over the
        SLO. The paper's hill-climb keeps Algorithm 1's best-so-far by score."""
        candidates = [s for s in self.history if s.phase != "final" and (not full_only or s.measure_fraction == 1.0)]
        feasible = [s for s in candidates if s.ok and s.p99_s <= self.slo_s]
        return max(feasible or candidates, key=lambda s: s.score, default=None)
