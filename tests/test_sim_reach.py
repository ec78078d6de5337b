"""A simulated run stands for the knob values under which it would have been the same run (core/sim/reach.py),
and the tune's sweep answers those from it (core/tune/segment.py): held here to fresh runs, record for record,
on an open loop, a closed loop, bursty long prompts under KV pressure, and with speculation."""

from __future__ import annotations

import asyncio
import itertools
import math

import numpy as np
import pytest

from core.backends.sim import SimBackend
from core.profile import Profile, TunerSpec, load_calibration, load_profile
from core.records import RequestRecord
from core.sim.reach import RunReach, run_reach
from core.tune.knobspace import UNLIMITED, Point
from core.tune.segment import Measurement, SimSegmentRunner, _plan_for, sim_segment_task

SEED = 3
# Caps below, at and above what each workload keeps in flight; max_num_seqs below and above the caps.
CONCURRENCY = (2, 6, 24, UNLIMITED)
SEQS = (3, 6, 12, 64)


def _bursty_long_prompts() -> Profile:
    """long-prompt-chat at an inter-arrival CV of 10 (gamma burstiness 0.01) and twice its rate: 12k-token
    prompts arriving in bursts fill the KV cache, so requests are preempted and recomputed."""
    profile = load_profile("long-prompt-chat")
    arrival = profile.workload.arrival.model_copy(update={"burstiness": 0.01, "rate_rps": 0.5})
    return profile.model_copy(update={"workload": profile.workload.model_copy(update={"arrival": arrival})})


PROFILES = {
    "quickstart (Poisson, open loop)": lambda: load_profile("quickstart"),
    "slo-tuner-paper (closed loop)": lambda: load_profile("slo-tuner-paper"),
    "long prompts, CV 10": _bursty_long_prompts,
}


def _spec(profile: Profile, requests: int) -> TunerSpec:
    return profile.tuner.model_copy(update={"sim_min_requests": requests, "sim_min_duration_s": 1.0})


def _records(profile: Profile, point: Point, requests: int) -> tuple[list[RequestRecord], RunReach | None]:
    plan = _plan_for(profile, point, seed=SEED, requests=requests, duration_s=None)
    backend = SimBackend(
        load_calibration(profile), point.to_knobs(profile.knobs), seed=SEED, sample_interval_s=math.inf
    )
    outcome = asyncio.run(backend.run(plan))
    assert backend.last_engine is not None
    return outcome.records, backend.last_engine.reach()


def _same_records(a: list[RequestRecord], b: list[RequestRecord]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if (x.request_id, x.status, x.arrival_s, x.end_s, x.preemptions) != (
            y.request_id,
            y.status,
            y.arrival_s,
            y.end_s,
            y.preemptions,
        ):
            return False
        if not np.array_equal(x.chunk_times, y.chunk_times):
            return False
        if (x.chunk_tokens is None) != (y.chunk_tokens is None) or (
            x.chunk_tokens is not None and not np.array_equal(x.chunk_tokens, y.chunk_tokens)
        ):
            return False
    return True


@pytest.mark.parametrize("name", list(PROFILES))
def test_a_run_is_the_same_run_under_every_knob_value_its_reach_covers_and_differs_outside_it(name: str) -> None:
    profile = PROFILES[name]()
    requests = 300
    width = 4 if name.startswith("quickstart") else 0  # speculation on one of them (acceptance draws per request)
    runs = {
        (conc, seqs): _records(profile, Point(conc, seqs, width, width > 0), requests)
        for conc, seqs in itertools.product(CONCURRENCY, SEQS)
    }
    covered = outside = 0
    for (conc, seqs), (records, reach) in runs.items():
        assert reach is not None
        for (other_conc, other_seqs), (other_records, _) in runs.items():
            if (other_conc, other_seqs) == (conc, seqs):
                continue
            same = _same_records(records, other_records)
            if reach.covers(None if other_conc == UNLIMITED else other_conc, other_seqs):
                covered += 1
                assert same, f"{name}: the run at {(conc, seqs)} ({reach}) is not the run at {(other_conc, other_seqs)}"
            elif not same:
                outside += 1
    # Both sides were exercised: runs that stand for others, and knob values that really change the run.
    assert covered >= 10
    assert outside >= 10


def test_the_sweep_answers_from_runs_that_stand_for_others_and_every_answer_equals_a_fresh_measurement() -> None:
    profile = load_profile("quickstart")
    spec = _spec(profile, 300)
    calibration = load_calibration(profile)
    runner = SimSegmentRunner(profile, calibration, spec)
    points = [Point(c, s, w, w > 0) for c, s, w in itertools.product(CONCURRENCY, SEQS, (0, 8))]

    measured: list[Point] = []

    async def sweep() -> dict[Point, Measurement]:
        for batch in runner.sweep_rounds(points, seed=SEED):
            for point in batch:
                result = await runner.measure(point, seed=SEED)
                if not (result.notes or {}).get("same_run_as"):
                    measured.append(point)
        return {point: await runner.measure(point, seed=SEED) for point in points}

    answers = asyncio.run(sweep())
    # Every seqs value at or above a cap of 2 or 6 is one run: at least 2 x 2 x 2 points answered without a run.
    assert 8 <= len(points) - len(measured) < len(points)
    for point in points:
        fresh = asyncio.run(sim_segment_task(profile, calibration, spec, point, SEED, 1.0))
        assert fresh.summary is not None
        assert answers[point].summary is not None
        assert answers[point].summary.to_dict() == fresh.summary.to_dict(), point


def test_reach_rules() -> None:
    # The count reached max_num_seqs: only its own value; an open loop whose cap held nobody: every cap from
    # its peak, and none.
    reach = run_reach(None, 8, seqs_probe=8, open_loop=True, peak_in_flight=5, cap_held=False)
    assert reach.covers(None, 8) and reach.covers(5, 8) and reach.covers(40, 8)
    assert not reach.covers(4, 8) and not reach.covers(None, 9) and not reach.covers(None, 7)
    reach = run_reach(6, 16, seqs_probe=5, open_loop=True, peak_in_flight=6, cap_held=True)
    assert reach.covers(6, 6) and reach.covers(6, 40)
    assert not reach.covers(6, 5) and not reach.covers(7, 16) and not reach.covers(None, 16)
    closed = run_reach(4, 16, seqs_probe=3, open_loop=False, peak_in_flight=4, cap_held=False)
    assert closed.covers(4, 4) and not closed.covers(5, 16) and not closed.covers(None, 16)
    joined = reach.joined(run_reach(6, 16, seqs_probe=9, open_loop=True, peak_in_flight=3, cap_held=False))
    assert joined.seqs_above == 9 and joined.cap_from is None


def test_a_mode_with_a_planner_claims_no_reach() -> None:
    from core.modes import ModeContext, make_policy

    profile = load_profile("quickstart")
    context = ModeContext(profile, load_calibration(profile))
    plan = _plan_for(profile, Point(UNLIMITED, 16, 0, False), seed=SEED, requests=50, duration_s=None)
    backend = SimBackend(
        load_calibration(profile),
        profile.knobs,
        seed=SEED,
        sample_interval_s=math.inf,
        policy_factory=lambda: make_policy("slos-serve", context),
    )
    asyncio.run(backend.run(plan))
    assert backend.last_engine is not None and backend.last_engine.reach() is None
