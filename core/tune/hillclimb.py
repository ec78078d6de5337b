"""The paper's controller: SLO-Tuner's hill-climb (paper 000 sec. II-B, Algorithm 1), the reference search.

Per step t = 1..T: measure the current point K and every neighbour, score them with eq. 3, and move to the
best neighbour K* when it gains at least delta, or when K violates the SLO and K* scores higher at all.
The best-so-far is taken over the current points only (as in Algorithm 1, where neighbours are candidates
for the next move, not for the answer). No restarts; the caller re-measures the best once at the end.

Simulator variant (sec. II-B, end of "implementation"): the p99 the move rule sees is an exponential
moving average over the trajectory, p_hat(t) = beta * p99(t) + (1 - beta) * p_hat(t-1), which damps a
spike in one segment; the current point and every neighbour are smoothed with the same p_hat(t-1), so
the rule compares them the same way. The violation term is weighted 10 x lambda (see score.py). The
best-so-far compares configurations by their own measured score, not the smoothed one: the average mixes
in the previous configuration's p99 and would otherwise under-rate the point the controller just found.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from core.events import EventSink, make_event
from core.tune.evaluator import BudgetExhausted, Evaluator
from core.tune.knobspace import KnobSpace, Point
from core.tune.score import Segment

# A gain of exactly delta counts (">= delta"), also when float subtraction lands a hair below it.
GAIN_TOLERANCE = 1e-9


@dataclass(slots=True)
class StepRecord:
    step: int
    point: Point
    segment: Segment
    p99_used_s: float  # the p99 the move rule saw (EMA on the simulator)
    score_used: float
    best_neighbour: Point | None
    best_neighbour_score: float
    moved: bool
    reason: str

    def as_event_fields(self) -> dict[str, Any]:
        seg = self.segment
        return {
            "step": self.step,
            "knobs": self.point.as_dict(),
            "p50_s": seg.p50_s,
            "p95_s": seg.p95_s,
            "p99_s": seg.p99_s,
            "p99_used_s": self.p99_used_s,
            "goodput_rps": seg.goodput_rps,
            "score": None if not math.isfinite(self.score_used) else self.score_used,
            "best_neighbour": None if self.best_neighbour is None else self.best_neighbour.as_dict(),
            "best_neighbour_score": (
                None if not math.isfinite(self.best_neighbour_score) else self.best_neighbour_score
            ),
            "moved": self.moved,
            "reason": self.reason,
        }


@dataclass(slots=True)
class SearchResult:
    """What a search found: its answer, its trajectory, and every segment it took."""

    algorithm: str
    best: Segment | None
    steps: list[StepRecord] = field(default_factory=list)
    stopped_by: str = "budget"  # "budget" (steps or segments spent), "converged", "segments"
    candidates: list[Segment] = field(default_factory=list)  # ranked answers (guided search verifies these)


def move_decision(
    current_score: float, best_score: float, current_p99: float, slo_s: float, min_gain: float
) -> tuple[bool, str]:
    """Algorithm 1's move rule, with the reason a person reads in the trajectory."""
    if not math.isfinite(best_score):
        return False, "no neighbour produced a usable measurement"
    if not math.isfinite(current_score):
        return True, "current configuration failed; moving to the best neighbour"
    gain = best_score - current_score
    violates = not math.isfinite(current_p99) or current_p99 > slo_s
    if gain >= min_gain - GAIN_TOLERANCE:
        return True, f"best neighbour gains {gain:.3f} >= delta {min_gain}"
    if violates and gain > 0:
        return True, f"p99 {current_p99:.3f} s violates the SLO and the best neighbour scores higher (+{gain:.3f})"
    if violates:
        return False, f"p99 {current_p99:.3f} s violates the SLO but no neighbour scores higher"
    return False, f"best neighbour gains {gain:.3f} < delta {min_gain}"


class Trajectory:
    """Smoothing of p99 across steps (simulator variant only). The current point and each neighbour are
    smoothed alike: both blend their own p99 with the estimate carried from the previous step, so the move
    rule compares like with like (a neighbour's raw p99 against the current point's average would show a
    "gain" for a step that changes nothing)."""

    def __init__(self, beta: float, enabled: bool) -> None:
        self.beta = beta
        self.enabled = enabled
        self.ema: float | None = None  # p_hat(t - 1)

    def blend(self, p99_s: float) -> float:
        """beta * p99 + (1 - beta) * p_hat(t - 1): what the estimate would be at this point."""
        if not self.enabled or not math.isfinite(p99_s) or self.ema is None:
            return p99_s
        return self.beta * p99_s + (1 - self.beta) * self.ema

    def observe(self, p99_s: float) -> float:
        """The current point's measurement: advance the estimate."""
        smoothed = self.blend(p99_s)
        if self.enabled and math.isfinite(p99_s):
            self.ema = smoothed
        return smoothed


async def hill_climb(
    evaluator: Evaluator,
    space: KnobSpace,
    start: Point,
    *,
    steps: int,
    sink: EventSink | None = None,
    algorithm: str = "hillclimb",
) -> SearchResult:
    """Algorithm 1 with budget `steps`. Stops early only if the evaluator's segment budget runs out."""
    spec = evaluator.spec
    slo_s = evaluator.slo_s
    smoothing = Trajectory(spec.sim_ema_beta, enabled=evaluator.variant == "sim")
    result = SearchResult(algorithm=algorithm, best=None)
    best_score = -math.inf
    point = start
    try:
        for step in range(1, steps + 1):
            around = space.neighbours(point)
            current, *segments = await evaluator.evaluate_many([point, *around], phase="search", step=step)
            neighbours = list(zip(around, segments, strict=True))
            # Neighbours are smoothed with the estimate the current point starts this step from.
            scored = [(n, _smoothed_score(evaluator, smoothing, seg)) for n, seg in neighbours]
            p99_used = smoothing.observe(current.p99_s)
            score_used = evaluator.score_of(point, current.goodput_rps, p99_used) if current.ok else -math.inf
            if result.best is None or current.score > best_score:
                best_score, result.best = current.score, current
            best_neighbour: Point | None = None
            best_neighbour_score = -math.inf
            for neighbour, neighbour_score in scored:
                if neighbour_score > best_neighbour_score:  # strict: ties keep the earlier, fixed-order one
                    best_neighbour, best_neighbour_score = neighbour, neighbour_score
            moved, reason = move_decision(score_used, best_neighbour_score, p99_used, slo_s, spec.min_gain)
            # Neighbours never share the current configuration (KnobSpace.neighbours), so a move changes what
            # runs; the check keeps a step that would not from ever reading as a move.
            moved = moved and best_neighbour is not None and best_neighbour.config_key != point.config_key
            record = StepRecord(
                step, point, current, p99_used, score_used, best_neighbour, best_neighbour_score, moved, reason
            )
            result.steps.append(record)
            if sink is not None:
                sink(make_event("tune_step", algorithm=algorithm, world=evaluator.variant, **record.as_event_fields()))
            if moved and best_neighbour is not None:
                point = best_neighbour
        result.stopped_by = "steps"
    except BudgetExhausted:
        result.stopped_by = "segments"
    result.candidates = ranked(evaluator.history)
    return result


def _smoothed_score(evaluator: Evaluator, smoothing: Trajectory, segment: Segment) -> float:
    if not segment.ok:
        return -math.inf
    return evaluator.score_of(segment.point, segment.goodput_rps, smoothing.blend(segment.p99_s))


def ranked(segments: list[Segment]) -> list[Segment]:
    """Distinct configurations, best score first (full-length search segments only)."""
    best_by_config: dict[tuple[int, int, int], Segment] = {}
    for seg in segments:
        if seg.phase == "final" or seg.measure_fraction != 1.0:
            continue
        kept = best_by_config.get(seg.point.config_key)
        if kept is None or seg.score > kept.score:
            best_by_config[seg.point.config_key] = seg
    return sorted(best_by_config.values(), key=lambda s: (-s.score if math.isfinite(s.score) else math.inf, s.point))
