"""SLO-Tuner (core/tune): the paper's controller rule by rule, memo/journal/budget, failures, stronger
searches, and the paper's headline effect on the simulator (issue 4, done-means (a))."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from core.events import Event
from core.metrics import summarize
from core.profile import ProfileError, SLOSpec, SmoothGoodputSpec, TunerSpec, load_calibration, load_profile
from core.records import RequestRecord, RequestSLO
from core.tune.evaluator import Evaluator
from core.tune.hillclimb import hill_climb, move_decision
from core.tune.job import knob_space, run_tune
from core.tune.journal import Journal
from core.tune.knobspace import UNLIMITED, KnobSpace, Point
from core.tune.score import Segment, hw_cost, score
from core.tune.segment import Measurement

PAPER = "profiles/slo-tuner-paper.yaml"
SPEC = TunerSpec()
START = Point(8, 8, 8, True)


# ------------------------------------------------------------------ knob space


def test_neighbours_are_the_papers_seven_moves_in_a_fixed_order() -> None:
    assert KnobSpace(SPEC).neighbours(START) == [
        Point(6, 8, 8, True),
        Point(10, 8, 8, True),
        Point(8, 5, 8, True),
        Point(8, 11, 8, True),
        Point(8, 8, 4, True),
        Point(8, 8, 12, True),
        Point(8, 8, 8, False),
    ]


def test_neighbours_are_clamped_and_a_move_that_clamps_onto_the_point_is_dropped() -> None:
    corner = Point(2, 16, 0, True)
    # Switching speculation off at width 0 runs the same server: no move, not listed.
    assert KnobSpace(SPEC).neighbours(corner) == [
        Point(4, 16, 0, True),
        Point(2, 13, 0, True),
        Point(2, 16, 4, True),
    ]
    # max_num_seqs 14 + 3 is clamped to 16 (a move, since 16 != 14).
    assert Point(8, 16, 8, True) in KnobSpace(SPEC).neighbours(Point(8, 14, 8, True))


def test_speculation_off_is_one_configuration_whatever_the_width() -> None:
    assert Point(8, 8, 12, False).config_key == Point(8, 8, 0, True).config_key == (8, 8, 0)
    space = KnobSpace(SPEC)
    # With speculation off a width move changes nothing that runs: the neighbours are the other knobs and
    # switching speculation on (at one width step when the width is 0).
    assert space.neighbours(Point(8, 8, 0, False)) == [
        Point(6, 8, 0, False),
        Point(10, 8, 0, False),
        Point(8, 5, 0, False),
        Point(8, 11, 0, False),
        Point(8, 8, 4, True),
    ]
    for point in space.distinct_configs(START):
        assert all(n.config_key != point.config_key for n in space.neighbours(point))
        assert all(n.config_key != point.config_key for n in space.compound_neighbours(point))
    configs = space.distinct_configs(START)
    # conc {2, 4, ..., 16} x seqs {4, 5, 7, 8, 10, 11, 13, 14, 16} (steps of 3 from 8, clamps at 4 and 16
    # opening the other residues) x effective width {0, 4, 8, 12, 16}
    assert sorted({p.max_num_seqs for p in configs}) == [4, 5, 7, 8, 10, 11, 13, 14, 16]
    assert len(configs) == 8 * 9 * 5


def test_open_loop_no_cap_is_a_point_and_the_start_is_the_profiles_knobs_as_given() -> None:
    profile = load_profile("quickstart")
    assert profile.knobs.concurrency is None  # the user set no in-flight cap
    space, start = knob_space(profile, profile.tuner)
    assert start == Point(UNLIMITED, 12, 0, False) and start.as_dict()["concurrency"] is None
    assert start.to_knobs(profile.knobs) == profile.knobs  # the baseline runs exactly the user's knobs
    # No cap sits one step above the upper bound: down to the largest cap, and back up from it.
    assert Point(16, 12, 0, False) in space.neighbours(start)
    assert start in space.neighbours(Point(16, 12, 0, False))
    assert Point(UNLIMITED, 12, 0, False) not in KnobSpace(SPEC).neighbours(Point(16, 12, 0, False))  # closed
    assert Point.from_dict(start.as_dict()) == start
    # Charged as the largest cap (eq. 2): it lets at least that many requests in flight.
    assert hw_cost(start, SPEC) == pytest.approx(hw_cost(Point(16, 12, 0, False), SPEC))
    # A start outside the bounds is measured as given, not clamped.
    wide = profile.model_copy(update={"knobs": profile.knobs.model_copy(update={"max_num_seqs": 256})})
    assert knob_space(wide, wide.tuner)[1].max_num_seqs == 256


# ------------------------------------------------------------------ score (eqs. 2, 3) and the move rule


def test_score_is_goodput_minus_lambda_violation_minus_hw_cost() -> None:
    cost = 0.01 * 8 + 0.01 * 8 + 0.02 * 8
    assert hw_cost(START, SPEC) == pytest.approx(cost)
    assert score(10.0, 1.5, 1.2, START, SPEC, "live") == pytest.approx(10.0 - 5.0 * 0.3 - cost)
    assert score(10.0, 1.0, 1.2, START, SPEC, "live") == pytest.approx(10.0 - cost)
    # Simulator variant: the violation term is weighted 10 x lambda.
    assert score(10.0, 1.5, 1.2, START, SPEC, "sim") == pytest.approx(10.0 - 50.0 * 0.3 - cost)
    # Speculation off charges no width.
    assert hw_cost(Point(8, 8, 8, False), SPEC) == pytest.approx(0.16)
    assert score(0.0, math.nan, 1.2, START, SPEC, "live") == -math.inf


@pytest.mark.parametrize(
    ("current", "best", "p99", "moves"),
    [
        (10.0, 10.02, 1.0, True),  # gain == delta
        (10.0, 10.01, 1.0, False),  # gain < delta, SLO met
        (10.0, 10.01, 1.3, True),  # gain < delta but the current point violates and the neighbour is higher
        (10.0, 9.0, 1.3, False),  # violates, but nothing scores higher
        (-math.inf, 1.0, math.nan, True),  # a failed current point is left for any usable neighbour
        (5.0, -math.inf, 1.0, False),  # no usable neighbour
    ],
)
def test_move_rule(current: float, best: float, p99: float, moves: bool) -> None:
    assert move_decision(current, best, p99, 1.2, 0.02)[0] is moves


# ------------------------------------------------------------------ the controller on a synthetic surface


class SurfaceRunner:
    """A deterministic surface in place of a server, to check the controller's rules (not the metrics).

    Goodput rises with min(concurrency, max_num_seqs) and falls with speculation; p99 crosses a 1.2 s SLO
    with width. `broken` points fail like a server that does not start."""

    variant = "live"

    def __init__(self, broken: set[tuple[int, int, int]] | None = None) -> None:
        self.description: dict[str, Any] = {"backend": "surface"}
        self.calls: list[Point] = []
        self.broken = broken or set()

    def metrics(self, point: Point) -> tuple[float, float]:
        width = point.effective_width
        goodput = min(point.concurrency, point.max_num_seqs) * 2.0 / (1 + width / 4)
        p99 = 0.5 + 0.1 * width + 0.02 * point.concurrency
        return goodput, p99

    async def measure(self, point: Point, *, seed: int, fraction: float = 1.0) -> Measurement:
        self.calls.append(point)
        if point.config_key in self.broken:
            return Measurement(None, 0.0, error="server did not start: test")
        goodput, p99 = self.metrics(point)
        n = 100
        records = [
            RequestRecord(
                request_id=i,
                task="t",
                slo=RequestSLO(e2e_s=1.2),
                prompt_tokens=1,
                max_tokens=1,
                scheduled_s=0.0,
                arrival_s=0.0,
                end_s=p99 if i == n - 1 else 0.1,
                output_tokens=1,
            )
            for i in range(n)
        ]
        summary = summarize(records, slo=SLOSpec(e2e_s=1.2), smooth=SmoothGoodputSpec(), window_s=1.0)
        # The surface's numbers in a real Summary (the type the evaluator reads).
        return Measurement(dataclasses.replace(summary, goodput_rps=goodput, p99_s=p99), 0.0)

    async def close(self) -> None:
        return None


def climb(runner: SurfaceRunner, steps: int = 8, spec: TunerSpec = SPEC, **kwargs: Any):  # type: ignore[no-untyped-def]
    evaluator = Evaluator(runner, spec, 1.2, seed=0, **kwargs)
    events: list[Event] = []
    result = asyncio.run(hill_climb(evaluator, KnobSpace(spec), START, steps=steps, sink=events.append))
    return evaluator, result, events


def test_hill_climb_follows_algorithm_1_and_reports_each_step() -> None:
    runner = SurfaceRunner()
    _evaluator, result, events = climb(runner)
    steps = [e for e in events if e["event"] == "tune_step"]
    assert len(steps) == 8 and [e["step"] for e in steps] == list(range(1, 9))
    # Step 1 measures K0 and its 7 neighbours; the biggest gain is switching speculation off.
    assert runner.calls[:8] == [START, *KnobSpace(SPEC).neighbours(START)]
    assert steps[0]["moved"] is True and steps[0]["best_neighbour"] == Point(8, 8, 8, False).as_dict()
    for e in steps:
        assert {"knobs", "p50_s", "p95_s", "p99_s", "goodput_rps", "score", "moved", "reason"} <= e.keys()
    # Each move goes to the best neighbour of the step before.
    for before, after in itertools.pairwise(steps):
        if before["moved"]:
            assert after["knobs"] == before["best_neighbour"]
    # Best-so-far is the best *current* point of the trajectory.
    currents = [s.segment for s in result.steps]
    assert result.best is max(currents, key=lambda s: s.score)


def test_a_configuration_is_measured_once_per_run_unless_remeasure_is_asked() -> None:
    runner = SurfaceRunner()
    evaluator, _, _ = climb(runner)
    keys = [p.config_key for p in runner.calls]
    assert len(keys) == len(set(keys))
    assert evaluator.memo_hits > 0
    again = SurfaceRunner()
    _, result, _ = climb(again, spec=TunerSpec(remeasure=True))
    # The paper's accounting: every step measures its current point and all of its neighbours.
    space = KnobSpace(SPEC)
    assert len(again.calls) == sum(1 + len(space.neighbours(step.point)) for step in result.steps)


def test_a_failed_segment_scores_minus_infinity_and_the_run_goes_on() -> None:
    broken = {Point(8, 8, 8, False).config_key}
    runner = SurfaceRunner(broken)
    evaluator, result, events = climb(runner)
    failed = [s for s in evaluator.history if s.point.config_key in broken]
    assert failed and all(s.score == -math.inf and "did not start" in (s.error or "") for s in failed)
    assert len([e for e in events if e["event"] == "tune_step"]) == 8
    assert result.best is not None and result.best.ok


class FlatAfterStartRunner(SurfaceRunner):
    """The quickstart's old trap on a synthetic surface: the simulator variant (p99 smoothed), a start that
    violates the SLO badly, and a plateau beyond it where no move gains delta."""

    variant = "sim"

    def metrics(self, point: Point) -> tuple[float, float]:
        if point.config_key == START_OFF.config_key:
            return 2.0, 6.0
        return 10.0 + hw_cost(point, SPEC), 0.8  # every other configuration scores 10


START_OFF = Point(8, 8, 0, False)


def test_a_step_that_keeps_the_knobs_is_not_reported_as_a_move() -> None:
    runner = FlatAfterStartRunner()
    evaluator = Evaluator(runner, SPEC, 1.2, seed=0)
    events: list[Event] = []
    result = asyncio.run(hill_climb(evaluator, KnobSpace(SPEC), START_OFF, steps=6, sink=events.append))
    steps = [e for e in events if e["event"] == "tune_step"]
    assert steps[0]["moved"] is True  # off the violating start
    for before, after in itertools.pairwise(result.steps):
        # A step reported as a move changes what runs; one that keeps the configuration is "stayed".
        assert before.moved == (after.point.config_key != before.point.config_key)
    for record in result.steps:
        assert record.best_neighbour is None or record.best_neighbour.config_key != record.point.config_key
    # On the plateau the smoothed current point is compared with neighbours smoothed the same way: the
    # start's p99 still in the average is no reason to hop (before, width-only "moves" kept gaining).
    assert [e["moved"] for e in steps[1:]] == [False] * 5


# ------------------------------------------------------------------ journal


def test_journal_resume_replays_without_measuring_and_drops_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "tune-journal.jsonl"
    header = {"profile_hash": "h", "backend": "sim", "algorithm": "hillclimb", "seed": 0, "guided": False}
    first = SurfaceRunner()
    climb(first, steps=3, journal=Journal(path, header, resume=False))
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["kind"] == "header"
    assert sum(json.loads(line)["kind"] == "segment" for line in lines) == len(first.calls)
    with path.open("a") as fh:
        fh.write('{"kind":"segment","key":"torn')  # killed mid-write
    second = SurfaceRunner()
    evaluator, _, _ = climb(second, steps=5, journal=Journal(path, header, resume=True))
    assert evaluator.resumed == len(first.calls)
    measured_again = {p.config_key for p in second.calls} & {p.config_key for p in first.calls}
    assert not measured_again
    for line in path.read_text().splitlines():
        json.loads(line)  # the torn line is gone
    with pytest.raises(ProfileError, match="different run"):
        Journal(path, {**header, "seed": 1}, resume=True)


def test_a_new_run_keeps_the_old_journal(tmp_path: Path) -> None:
    path = tmp_path / "tune-journal.jsonl"
    header = {"profile_hash": "h", "backend": "sim", "algorithm": "hillclimb", "seed": 0, "guided": False}
    Journal(path, header, resume=False).close()
    journal = Journal(path, header, resume=False)
    assert journal.archived is not None and journal.archived.exists()


# ------------------------------------------------------------------ simulator: the paper's effect


def run_paper(algorithm: str = "hillclimb", **update: Any):  # type: ignore[no-untyped-def]
    profile = load_profile(PAPER)
    spec = profile.tuner.model_copy(update={"algorithm": algorithm, **update})
    events: list[Event] = []
    result = asyncio.run(run_tune(profile, sink=events.append, spec=spec))
    return result, events


def test_paper_profile_tuned_meets_the_slo_with_at_least_1_8x_baseline_goodput() -> None:
    result, events = run_paper()
    assert result.baseline is not None and result.final is not None
    assert result.baseline.point == START
    assert result.baseline.p99_s > 1.2  # the default-like start violates the SLO (paper: 1.36 s)
    assert result.final.p99_s <= 1.2
    assert result.final.goodput_rps >= 1.8 * result.baseline.goodput_rps
    assert result.final.point.effective_width < 8  # it disabled or shrank speculation
    summary = next(e for e in events if e["event"] == "tune_summary")
    assert summary["tuned_meets_slo"] is True and summary["goodput_gain_x"] >= 1.8
    assert summary["baseline"]["p99_s"] > 1.2 and summary["segments_used"] == result.segments_used


@pytest.mark.parametrize("algorithm", ["halving", "simrank"])
def test_stronger_searches_do_at_least_as_well_within_the_same_budget(algorithm: str) -> None:
    reference, _ = run_paper()
    budget = reference.segments_used
    result, _ = run_paper(algorithm, segment_budget=budget)
    assert result.segments_used <= budget
    assert result.best is not None and reference.best is not None
    assert result.best.score >= reference.best.score
    assert result.final is not None and result.final.p99_s <= 1.2


def test_the_run_is_deterministic() -> None:
    a, _ = run_paper()
    b, _ = run_paper()
    assert a.final is not None and b.final is not None
    assert (a.final.point, a.final.score, a.segments_used) == (b.final.point, b.final.score, b.segments_used)


# ------------------------------------------------------------------ live segments: restart, failure, stop


class SimServedBackend:
    """A stand-in for VllmBackend's lifecycle (start(knobs) / run / stop) that serves with the simulator and
    refuses to start with speculation, like a vLLM whose draft model is broken. It checks the tuner's side
    of the contract: one start per segment, a stop after every one (failed ones too), failures scored -inf.
    The real thing is exercised in test_tune_live.py."""

    def __init__(self) -> None:
        profile = load_profile(PAPER)
        self.calibration = load_calibration(profile)
        self.knobs: Any = None
        self.starts = 0
        self.stops = 0
        self.running = False

    def describe(self) -> dict[str, Any]:
        return {"backend": "vllm", "engine": "stand-in"}

    async def start(self, knobs: Any) -> None:
        ServerStartError = pytest.importorskip("core.serve.process").ServerStartError

        assert not self.running, "a segment started a server while the previous one was still running"
        self.starts += 1
        if knobs.effective_spec_width > 0:
            raise ServerStartError("vLLM exited with status 1 during start-up", ["RuntimeError: draft"], None, 1)
        self.knobs, self.running = knobs, True

    async def run(self, plan: Any, observer: Any = None) -> Any:
        from core.backends.sim import SimBackend

        return await SimBackend(self.calibration, self.knobs, seed=0).run(plan, observer)

    async def stop(self) -> None:
        self.stops += 1
        self.running = False

    async def close(self) -> None:
        await self.stop()


def test_live_tuning_restarts_per_segment_scores_failed_starts_minus_inf_and_stops_every_server() -> None:
    profile = load_profile(PAPER)
    spec = profile.tuner.model_copy(update={"algorithm": "hillclimb", "steps": 3, "warmup_s": 5.0, "measure_s": 20.0})
    backend = SimServedBackend()
    events: list[Event] = []
    result = asyncio.run(run_tune(profile, backend_kind="vllm", sink=events.append, backend=backend, spec=spec))
    segments = [e for e in events if e["event"] == "tune_segment" and e["world"] == "live"]
    assert backend.starts == len(segments) == result.segments_used
    assert backend.stops >= backend.starts and not backend.running
    failed = [e for e in segments if e["knobs"]["spec_on"] and e["knobs"]["spec_width"] > 0]
    assert failed and all(e["score"] is None and "did not start" in e["error"] for e in failed)
    assert result.baseline is not None and result.baseline.score == -math.inf
    assert result.final is not None and result.final.ok and result.final.point.effective_width == 0
    assert len([e for e in events if e["event"] == "tune_step"]) == 3


def test_guided_verification_prefers_tail_headroom_and_skips_configurations_the_simulator_cannot_tell_apart() -> None:
    from core.tune.guided import verify_live
    from core.tune.hillclimb import SearchResult

    def sim(point: Point, p99: float, goodput: float) -> Segment:
        return Segment(key="s", point=point, phase="search", step=1, score=goodput, p99_s=p99, goodput_rps=goodput)

    candidates = [
        sim(Point(16, 16, 0, False), 1.1, 30.0),  # best simulated, but no tail headroom
        sim(Point(6, 7, 0, False), 0.5, 14.0),
        sim(Point(6, 8, 0, False), 0.5, 14.0),  # the same result as 6/7: one question, asked once
        sim(Point(4, 4, 0, False), 0.4, 10.0),
    ]
    runner = SurfaceRunner()
    target = Evaluator(runner, SPEC, 1.2, seed=0)
    result = asyncio.run(
        verify_live(target, START, SearchResult("simrank", None, candidates=candidates), verify=2, headroom=0.5)
    )
    assert runner.calls == [START, Point(6, 7, 0, False), Point(4, 4, 0, False)]
    assert result.best is not None and result.best.point in runner.calls


# ------------------------------------------------------------------ the default: guided search


def test_guided_picks_correct_the_simulators_p99_by_its_measured_error() -> None:
    from core.tune.guided import latency_ratio, next_pick

    def sim(point: Point, p99: float, goodput: float) -> Segment:
        return Segment(key="s", point=point, phase="sweep", step=0, score=goodput, p99_s=p99, goodput_rps=goodput)

    swept = {
        seg.point.config_key: seg
        for seg in [
            sim(START, 0.6, 8.0),
            sim(Point(16, 16, 0, False), 1.1, 30.0),  # best as simulated, but at the edge of the 1.2 s SLO
            sim(Point(14, 16, 0, False), 1.1, 30.0),  # the same simulated result
            sim(Point(10, 10, 0, False), 0.5, 20.0),
            sim(Point(4, 4, 0, False), 0.3, 8.0),
        ]
    }
    target = Evaluator(SurfaceRunner(), SPEC, 1.2, seed=0)
    assert latency_ratio([], swept) == 1.0
    first = next_pick(swept, target, 1.0)
    assert first is not None and first.point == Point(14, 16, 0, False)  # ties go to the lower configuration
    # Measured: the start ran at twice the simulated p99. Scaled by 2, 16/16 would violate (2.2 s) while
    # 10/10 (1.0 s) still meets the SLO: the next pick is 10/10.
    measured = Segment(key="m", point=START, phase="baseline", step=0, score=1.0, p99_s=1.2, goodput_rps=8.0)
    assert latency_ratio([measured], swept) == pytest.approx(2.0)
    target.history.append(measured)
    second = next_pick(swept, target, 2.0)
    assert second is not None and second.point == Point(10, 10, 0, False)
    # A configuration already measured, or one the simulator cannot tell from it, is not asked again.
    target.history.append(dataclasses.replace(measured, point=Point(16, 16, 0, False)))
    assert next_pick(swept, target, 1.0).point == Point(10, 10, 0, False)  # type: ignore[union-attr]


def test_quickstart_default_tune_starts_from_the_users_knobs_and_ends_meeting_the_slo() -> None:
    """Issue 12's done-means on the simulator: `slo-console --batch --profile quickstart --job tune`."""
    profile = load_profile("quickstart")
    assert profile.tuner.algorithm == "guided"  # the default
    # Simulator segments of 800 requests / 50 s instead of 1500 / 90 s keep the sweep quick in CI.
    spec = profile.tuner.model_copy(update={"sim_min_requests": 800, "sim_min_duration_s": 50.0})
    events: list[Event] = []
    result = asyncio.run(run_tune(profile, sink=events.append, spec=spec))
    assert result.baseline is not None and result.final is not None
    assert result.baseline.point.to_knobs(profile.knobs) == profile.knobs  # no made-up concurrency cap
    assert result.baseline.p99_s > 1.2  # the quickstart's story: max_num_seqs 12 misses the 1.2 s p99
    assert result.final.p99_s <= 1.2 and result.final.point.max_num_seqs > 12
    summary = next(e for e in events if e["event"] == "tune_summary")
    assert summary["tuned_meets_slo"] is True
    assert summary["baseline"]["knobs"]["concurrency"] is None
    assert summary["goodput_gain_x"] == pytest.approx(result.final.goodput_rps / result.baseline.goodput_rps)
    assert result.segments_used <= 16
    for step in [e for e in events if e["event"] == "tune_step"]:
        if step["moved"] and step.get("best_neighbour") is not None:
            assert step["best_neighbour"] != step["knobs"]
