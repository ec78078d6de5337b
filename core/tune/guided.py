"""Simulator-guided tuning (paper 000 sec. II-A, "simulator for guidance, online measurements for
correctness"; issue 4 part 4).

1. Run the chosen search on the calibrated simulator: segments cost seconds, not a vLLM start each.
2. Measure live only the baseline and the `guided_verify` configurations the simulator ranks highest
   (distinct real configurations); the live measurement, never the simulator's, picks the answer.
The live segments saved are those the same search would have spent live (it spent them on the simulator)
minus the ones spent here. A miscalibrated simulator can rank badly; verifying a few, not one, and
choosing by live score is what keeps the answer correct.
"""

from __future__ import annotations

import math

from core.events import EventSink, make_event
from core.tune.evaluator import Evaluator
from core.tune.hillclimb import SearchResult, StepRecord
from core.tune.knobspace import Point
from core.tune.score import Segment


async def verify_live(
    target: Evaluator,
    start: Point,
    sim_result: SearchResult,
    *,
    verify: int,
    headroom: float = 1.0,
    sink: EventSink | None = None,
) -> SearchResult:
    result = SearchResult(algorithm=f"guided-{sim_result.algorithm}", best=None, stopped_by="verified")
    slo_s = target.slo_s
    baseline = await target.evaluate(start, phase="baseline", step=0)
    usable = [
        seg for seg in sim_result.candidates if seg.point.config_key != start.config_key and math.isfinite(seg.score)
    ]
    # Within headroom first (best simulated score among those), then the rest: a simulator that is
    # optimistic about the tail would otherwise send every verification to the edge of the SLO.
    limit = headroom * slo_s
    ordered = [s for s in usable if s.p99_s <= limit] + [s for s in usable if not s.p99_s <= limit]
    # Configurations the simulator cannot tell apart (identical results: e.g. batch slots beyond the number
    # of clients) would spend live segments on one question; verify one of each.
    picks: list[Segment] = []
    outcomes: set[tuple[float, float]] = set()
    for seg in ordered:
        outcome = (round(seg.p99_s, 6), round(seg.goodput_rps, 6))
        if outcome not in outcomes:
            outcomes.add(outcome)
            picks.append(seg)
        if len(picks) == verify:
            break
    best: Segment = baseline
    _step(result, sink, target, 0, baseline, None, "baseline (the starting configuration)", moved=False)
    for rank, predicted in enumerate(picks, start=1):
        live = await target.evaluate(predicted.point, phase="verify", step=rank)
        better = target.best() is live
        reason = (
            f"simulator rank {rank} (sim score {predicted.score:.2f}); live score "
            f"{'beats' if better else 'does not beat'} the best so far (SLO first, then score)"
        )
        _step(result, sink, target, rank, live, predicted, reason, moved=better)
        if better:
            best = live
    result.best = target.best() or best
    result.candidates = sorted(target.history, key=lambda s: -s.score if math.isfinite(s.score) else math.inf)
    return result


def _step(
    result: SearchResult,
    sink: EventSink | None,
    target: Evaluator,
    step: int,
    live: Segment,
    predicted: Segment | None,
    reason: str,
    *,
    moved: bool,
) -> None:
    record = StepRecord(step, live.point, live, live.p99_s, live.score, None, -math.inf, moved, reason)
    result.steps.append(record)
    if sink is None:
        return
    fields = record.as_event_fields()
    fields.pop("best_neighbour")
    fields.pop("best_neighbour_score")
    if predicted is not None:
        fields["sim_p99_s"] = predicted.p99_s
        fields["sim_goodput_rps"] = predicted.goodput_rps
        fields["sim_score"] = predicted.score
    sink(make_event("tune_step", algorithm=result.algorithm, world=target.variant, phase="verify", **fields))
