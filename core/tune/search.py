"""Searches beyond the paper, under the same segment budget (issue 4 part 5). The paper names its own
limits (sec. III): first-order hill-climbing from one start can stall in a local optimum, and it spends up
to 8 segments per step. Two answers, both keeping the paper's score, step sizes and move rule:

`halving`  successive halving over a coarse, space-filling candidate set, then a local climb.
           Short segments (a third, then a ninth of the window) are enough to throw away clearly bad
           corners; only the survivors get full segments. It sees the whole space first, so a surface with
           a knee far from the start (high concurrency and batch) is reached without walking to it.
`simrank`  a hill-climb whose candidate moves are ranked by the calibrated simulator before any is
           measured: the paper's seven neighbours plus the diagonal moves (several knobs at once, up to 53
           in all). Only the `simrank_top` most promising are measured, the next ones only if none of those
           earns a move (the paper's move rule), and never more than the paper's 7 per step. A step
           costs about 1 + top segments instead of 8, so the same budget walks further, and the
           diagonals cross ridges where no single knob helps (more clients are useless without more
           batch slots, and the other way round).

Both answer with the best full-length segment of the run (every measured point is a candidate, not only
the current ones), and both stop early when a local climb finds no improving neighbour.
"""

from __future__ import annotations

import math

from core.events import EventSink, make_event
from core.tune.evaluator import BudgetExhausted, Evaluator
from core.tune.hillclimb import SearchResult, StepRecord, move_decision, ranked
from core.tune.knobspace import KnobSpace, Point
from core.tune.score import Segment

HALVING_ETA = 3  # keep a third each round; rounds measure 1/9, 1/3, then the full window
HALVING_FRACTIONS = (1 / 9, 1 / 3, 1.0)
MAX_STEPS = 200
SIMRANK_MAX_PER_STEP = 7  # a guard; the budget or convergence ends a search long before


def _levels(values: list[int], count: int) -> list[int]:
    """`count` values spread evenly over a sorted list (its ends included)."""
    if len(values) <= count:
        return values
    picks = {values[round(i * (len(values) - 1) / (count - 1))] for i in range(count)}
    return sorted(picks)


def coarse_candidates(space: KnobSpace, start: Point, levels: int) -> list[Point]:
    """A grid of `levels` values per numeric knob over the reachable space, speculation off or at the
    reachable middle width, nearest to the start first (in neighbour steps): the only prior is the user's
    own configuration, nothing about where the optimum lies. A small budget cuts the far end of this list.
    Values are ones the neighbour rule can reach, so the local climb that follows moves on the same
    lattice."""
    configs = space.distinct_configs(start)
    concs = _levels(sorted({p.concurrency for p in configs}), levels)
    seqs = _levels(sorted({p.max_num_seqs for p in configs}), levels)
    widths = sorted({p.effective_width for p in configs if p.effective_width > 0})
    spec_points: list[tuple[int, bool]] = [(start.spec_width, False)]
    if widths:
        spec_points.append((widths[len(widths) // 2], True))
    grid = [Point(conc, seq, width, on) for width, on in spec_points for conc in concs for seq in seqs]
    candidates: list[Point] = []
    seen = {start.config_key}
    for point in sorted(grid, key=lambda p: (space.steps_between(start, p), p)):
        if point.config_key not in seen:
            seen.add(point.config_key)
            candidates.append(point)
    return candidates


def halving_cost(count: int) -> int:
    """Segments the rounds take for `count` candidates (a third survives each short round)."""
    total, alive = 0, count
    for fraction in HALVING_FRACTIONS:
        total += alive
        if fraction < 1.0:
            alive = max(1, math.ceil(alive / HALVING_ETA))
    return total


async def _local_climb(
    evaluator: Evaluator,
    space: KnobSpace,
    point: Point,
    result: SearchResult,
    *,
    first_step: int,
    sink: EventSink | None,
    algorithm: str,
) -> None:
    """Steepest ascent with the paper's move rule from `point` until no neighbour earns a move."""
    spec = evaluator.spec
    for step in range(first_step, first_step + MAX_STEPS):
        neighbours = space.neighbours(point)
        current, *measured_all = await evaluator.evaluate_many([point, *neighbours], phase="search", step=step)
        best_neighbour: Point | None = None
        best_score = -math.inf
        for neighbour, measured in zip(neighbours, measured_all, strict=True):
            if measured.score > best_score:
                best_neighbour, best_score = neighbour, measured.score
        moved, reason = move_decision(current.score, best_score, current.p99_s, evaluator.slo_s, spec.min_gain)
        _record(result, sink, algorithm, evaluator, step, point, current, best_neighbour, best_score, moved, reason)
        if not moved or best_neighbour is None:
            result.stopped_by = "converged"
            return
        point = best_neighbour


def _record(
    result: SearchResult,
    sink: EventSink | None,
    algorithm: str,
    evaluator: Evaluator,
    step: int,
    point: Point,
    current: Segment,
    best_neighbour: Point | None,
    best_score: float,
    moved: bool,
    reason: str,
) -> None:
    record = StepRecord(step, point, current, current.p99_s, current.score, best_neighbour, best_score, moved, reason)
    result.steps.append(record)
    if sink is not None:
        sink(make_event("tune_step", algorithm=algorithm, world=evaluator.variant, **record.as_event_fields()))


async def successive_halving(
    evaluator: Evaluator, space: KnobSpace, start: Point, *, sink: EventSink | None = None
) -> SearchResult:
    result = SearchResult(algorithm="halving", best=None)
    budget = evaluator.budget_left()
    candidates = coarse_candidates(space, start, 3)
    # The start's full segment comes first; the rounds get what is left, minus one segment so that the
    # local climb can take at least a step.
    while len(candidates) > 1 and halving_cost(len(candidates)) + 2 > budget:
        candidates.pop()
    try:
        # The start at full length: it is the baseline every answer is compared with.
        await evaluator.evaluate(start, phase="search", step=0)
        alive = candidates
        for round_index, fraction in enumerate(HALVING_FRACTIONS, start=1):
            segments = await evaluator.evaluate_many(alive, phase="halving", step=round_index, fraction=fraction)
            scored = [
                (seg.score, -index, point, seg) for index, (point, seg) in enumerate(zip(alive, segments, strict=True))
            ]
            scored.sort(key=lambda item: (item[0], item[1]), reverse=True)
            keep = max(1, math.ceil(len(scored) / HALVING_ETA)) if fraction < 1.0 else len(scored)
            if sink is not None:
                sink(
                    make_event(
                        "tune_step",
                        algorithm="halving",
                        world=evaluator.variant,
                        step=round_index,
                        phase="halving",
                        measure_fraction=fraction,
                        knobs=scored[0][2].as_dict(),
                        score=scored[0][0] if math.isfinite(scored[0][0]) else None,
                        p99_s=scored[0][3].p99_s,
                        goodput_rps=scored[0][3].goodput_rps,
                        kept=[item[2].as_dict() for item in scored[:keep]],
                        moved=True,
                        reason=f"measured {len(scored)} at {fraction:.2f} of the window, kept the best {keep}",
                    )
                )
            alive = [item[2] for item in scored[:keep]]
        best = evaluator.best()
        assert best is not None
        await _local_climb(
            evaluator, space, best.point, result, first_step=len(HALVING_FRACTIONS) + 1, sink=sink, algorithm="halving"
        )
    except BudgetExhausted:
        result.stopped_by = "segments"
    result.best = evaluator.best()
    result.candidates = ranked(evaluator.history)
    return result


async def simrank_climb(
    evaluator: Evaluator,
    guide: Evaluator,
    space: KnobSpace,
    start: Point,
    *,
    sink: EventSink | None = None,
    first_step: int = 1,
    algorithm: str = "simrank",
) -> SearchResult:
    """Hill-climb with simulator-ranked neighbours (see the module docstring). `first_step` numbers the
    steps (and journal keys) after those of an earlier phase, e.g. guided verification."""
    spec = evaluator.spec
    top = spec.simrank_top
    result = SearchResult(algorithm=algorithm, best=None)
    point = start
    try:
        for step in range(first_step, first_step + MAX_STEPS):
            current = await evaluator.evaluate(point, phase="search", step=step)
            neighbours = space.compound_neighbours(point)
            guesses = await guide.evaluate_many(neighbours, phase="guide", step=0)
            predicted = {neighbour: seg.score for neighbour, seg in zip(neighbours, guesses, strict=True)}
            # Highest predicted first; the fixed neighbour order breaks ties (a deterministic replay).
            order = sorted(neighbours, key=lambda n: -predicted[n] if math.isfinite(predicted[n]) else math.inf)
            best_neighbour: Point | None = None
            best_score = -math.inf
            moved, reason = False, "no neighbour measured"
            # At most as many measured per step as the paper's step measures (its 7 neighbours): past that
            # the simulator's ranking has failed for this point, and the climb stops here.
            order = order[:SIMRANK_MAX_PER_STEP]
            for offset in range(0, len(order), top):
                chunk = order[offset : offset + top]
                for neighbour, measured in zip(
                    chunk, await evaluator.evaluate_many(chunk, phase="search", step=step), strict=True
                ):
                    if measured.score > best_score:
                        best_neighbour, best_score = neighbour, measured.score
                moved, reason = move_decision(current.score, best_score, current.p99_s, evaluator.slo_s, spec.min_gain)
                if moved:
                    measured_count = min(offset + top, len(order))
                    reason += f" (measured {measured_count} of the {len(neighbours)} simulator-ranked moves)"
                    break
            _record(result, sink, algorithm, evaluator, step, point, current, best_neighbour, best_score, moved, reason)
            if not moved or best_neighbour is None:
                result.stopped_by = "converged"
                break
            point = best_neighbour
    except BudgetExhausted:
        result.stopped_by = "segments"
    result.best = evaluator.best()
    result.candidates = ranked(evaluator.history)
    return result
