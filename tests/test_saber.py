"""SABER (paper 001): required speed, the fitted speed model, and Algorithm 1's admission decisions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.control.saber.policy import REQUIRED_SPEED_KEY, SaberPolicy, required_speed
from core.control.saber.speed_model import SpeedModel, SpeedSample, fit_all, fit_speed_model, speed_samples
from core.controller_api import TIER_HIGH, TIER_LOW, ControlledRequest
from core.records import RequestRecord, RequestSLO, RequestSpec
from tests.fakes import FakeReplica

# f(L) = 100 / (1 + 0.1 (L - 1)): f(1) = 100, f(2) = 90.9, f(3) = 83.3, f(4) = 76.9 tok/s.
MODEL = SpeedModel(kind="usl", params=(100.0, 0.1, 0.0), r2=1.0, points=0)


def request(rid: int, tokens: int, sla_s: float, arrival_s: float = 0.0) -> ControlledRequest:
    spec = RequestSpec(request_id=rid, prompt_tokens=10, output_tokens=tokens, slo=RequestSLO(e2e_s=sla_s))
    return ControlledRequest(spec=spec, arrival_s=arrival_s)


def running(rid: int, recorded_tps: float | None) -> ControlledRequest:
    req = request(rid, 10, 100.0)
    if recorded_tps is not None:
        req.state[REQUIRED_SPEED_KEY] = recorded_tps
    return req


def test_required_speed_paper_example() -> None:
    # Sec. IV-C step 1: 500 tokens with 10 s left need 50 tok/s; after 5 s in the queue, 100 tok/s.
    assert required_speed(500, deadline_s=10.0, now=0.0) == pytest.approx(50.0)
    assert required_speed(500, deadline_s=10.0, now=5.0) == pytest.approx(100.0)
    assert required_speed(500, deadline_s=10.0, now=10.0) == math.inf
    # The same through a request the controller tracks (arrival + e2e SLA = deadline).
    policy = SaberPolicy(MODEL)
    req = request(1, 500, 10.0, arrival_s=3.0)
    assert policy._required(req, 3.0) == pytest.approx(50.0)
    assert policy._required(req, 8.0) == pytest.approx(100.0)


def test_the_sla_is_each_request_own_slo_and_ttft_plus_tpot_bound_its_end() -> None:
    """SABER's deadline (sec. IV-C step 1) comes from the request's own SLO: its e2e objective, or, for a
    TTFT + TPOT objective, the latest end at which both can hold, TTFT + TPOT x (tokens - 1)."""

    def deadline(slo: RequestSLO, tokens: int = 101) -> float:
        spec = RequestSpec(request_id=0, prompt_tokens=10, output_tokens=tokens, slo=slo)
        return ControlledRequest(spec=spec, arrival_s=2.0).deadline_s()

    assert deadline(RequestSLO(e2e_s=8.0)) == 10.0
    assert deadline(RequestSLO(ttft_s=0.5, tpot_s=0.05)) == pytest.approx(2.0 + 0.5 + 0.05 * 100)
    assert deadline(RequestSLO(e2e_s=4.0, ttft_s=0.5, tpot_s=0.05)) == 6.0  # the tighter of the two
    assert deadline(RequestSLO(e2e_s=9.0, ttft_s=0.5, tpot_s=0.05)) == pytest.approx(7.5)
    assert deadline(RequestSLO(tpot_s=0.05)) == math.inf  # a speed, not an end
    assert deadline(RequestSLO()) == math.inf


def test_infeasible_arrival_goes_to_low_tier() -> None:
    # The paper's example: the engine gives one request 100 tok/s at best; one needing 120 is demoted.
    policy = SaberPolicy(MODEL)
    verdict = policy.on_arrival(request(1, 120, 1.0), 0.0, [FakeReplica(0)])
    assert verdict.action == "hold" and verdict.tier == TIER_LOW
    feasible = policy.on_arrival(request(2, 90, 1.0), 0.0, [FakeReplica(0)])
    assert feasible.action == "hold" and feasible.tier == TIER_HIGH


def test_admits_when_predicted_speed_meets_required_and_records_it() -> None:
    policy = SaberPolicy(MODEL)
    replica = FakeReplica(0)
    req = request(1, 500, 10.0)
    policy.on_arrival(req, 0.0, [replica])
    released = policy.release(0.0, [replica])
    assert [(r.request.request_id, r.replica) for r in released] == [(1, 0)]
    assert req.state[REQUIRED_SPEED_KEY] == pytest.approx(50.0)


def test_refuses_when_load_plus_one_is_too_slow_for_the_newcomer() -> None:
    policy = SaberPolicy(MODEL)
    busy = FakeReplica(0, {10: running(10, None), 11: running(11, None)})  # L = 2: f(3) = 83.3
    req = request(1, 85, 1.0)  # needs 85 tok/s
    policy.on_arrival(req, 0.0, [busy])
    assert policy.release(0.0, [busy]) == []
    assert req.tier == TIER_HIGH and len(policy.high) == 1  # stays in the high tier for later
    del busy.in_flight[11]  # L = 1: f(2) = 90.9 >= 85
    assert [r.request.request_id for r in policy.release(0.0, [busy])] == [1]


def test_refuses_when_a_running_request_would_lose_its_recorded_speed() -> None:
    policy = SaberPolicy(MODEL)
    replica = FakeReplica(0, {10: running(10, 95.0)})  # admitted needing 95; f(2) = 90.9 would break it
    policy.on_arrival(request(1, 10, 10.0), 0.0, [replica])  # needs only 1 tok/s itself
    assert policy.release(0.0, [replica]) == []
    replica.in_flight[10].state[REQUIRED_SPEED_KEY] = 90.0
    assert len(policy.release(0.0, [replica])) == 1


def test_refusals_are_counted_by_which_check_of_line_10_failed_and_the_ablation_drops_the_second() -> None:
    replica = FakeReplica(0, {10: running(10, 95.0)})  # admitted needing 95; f(2) = 90.9 would break it
    policy = SaberPolicy(MODEL)
    policy.on_arrival(request(1, 10, 10.0), 0.0, [replica])  # needs 1 tok/s: refused for the running one
    policy.on_arrival(request(2, 95, 1.0), 0.0, [replica])  # needs 95 > f(2): refused for itself
    assert policy.release(0.0, [replica]) == []
    assert (policy.refused_running, policy.refused_own) == (1, 1)
    assert policy.describe()["refused_running"] == 1
    # Without the second check (the ablation) the light request is admitted at once; the other still is not.
    ablated = SaberPolicy(MODEL, protect_running=False)
    ablated.on_arrival(request(1, 10, 10.0), 0.0, [replica])
    ablated.on_arrival(request(2, 95, 1.0), 0.0, [replica])
    assert [r.request.request_id for r in ablated.release(0.0, [replica])] == [1]
    assert ablated.refused_running == 0 and ablated.refused_own >= 1  # once or twice, by the window's order


def test_admits_several_per_call_with_the_load_it_adds_itself() -> None:
    policy = SaberPolicy(MODEL)
    replica = FakeReplica(0)
    for rid in range(5):
        policy.on_arrival(request(rid, 80, 1.0), 0.0, [replica])  # each needs 80 tok/s
    released = policy.release(0.0, [replica])
    # f(1) = 100, f(2) = 90.9, f(3) = 83.3 meet 80; f(4) = 76.9 does not: three admitted, two wait.
    assert len(released) == 3
    assert len(policy.high) == 2


def test_window_avoids_head_of_line_blocking() -> None:
    # The head needs 95 tok/s (f(2) = 90.9 is too slow at L = 1); the one behind it needs 10.
    for window, expected in ((1, []), (2, [2])):
        policy = SaberPolicy(MODEL, window_size=window)
        replica = FakeReplica(0, {10: running(10, None)})
        policy.on_arrival(request(1, 95, 1.0), 0.0, [replica])
        policy.on_arrival(request(2, 10, 1.0), 0.0, [replica])
        assert [r.request.request_id for r in policy.release(0.0, [replica])] == expected


def test_window_order_is_random_but_seeded() -> None:
    def first_admitted(seed: int) -> int:
        policy = SaberPolicy(MODEL, window_size=4, seed=seed)
        replica = FakeReplica(0, {i: running(i, 90.0) for i in range(100, 101)})  # only one more fits
        for rid in range(4):
            policy.on_arrival(request(rid, 10, 10.0), 0.0, [replica])
        return policy.release(0.0, [replica])[0].request.request_id

    picks = {first_admitted(seed) for seed in range(20)}
    assert len(picks) > 1  # not always the head
    assert first_admitted(7) == first_admitted(7)


def test_demotion_as_the_request_waits_and_low_tier_served_when_high_is_empty() -> None:
    policy = SaberPolicy(MODEL)
    full = FakeReplica(0, {10: running(10, 99.0)})  # nothing else fits: f(2) < 99
    req = request(1, 500, 10.0)  # 50 tok/s now; reaches f(1) = 100 tok/s at t = 5
    policy.on_arrival(req, 0.0, [full])
    assert policy.release(0.0, [full]) == []
    assert policy.next_wakeup(0.0) == pytest.approx(5.0)
    policy.release(5.01, [full])
    assert req.tier == TIER_LOW and len(policy.high) == 0 and len(policy.low) == 1
    assert policy.next_wakeup(5.01) == math.inf
    # Best-effort: still not while it would take speed the running request was promised ...
    assert policy.release(5.01, [full]) == []
    # ... but once that request is gone, with the high tier empty, it runs.
    full.in_flight.clear()
    assert [r.request.request_id for r in policy.release(6.0, [full])] == [1]


def test_low_tier_waits_while_the_high_tier_has_requests() -> None:
    policy = SaberPolicy(MODEL)
    replica = FakeReplica(0, {10: running(10, 95.0)})
    policy.on_arrival(request(1, 500, 1.0), 0.0, [replica])  # needs 500 tok/s: low tier
    policy.on_arrival(request(2, 10, 10.0), 0.0, [replica])  # high tier, blocked by the running request
    replica.in_flight[10].state[REQUIRED_SPEED_KEY] = 0.0  # best-effort condition would now hold
    released = policy.release(0.0, [replica])
    assert [r.request.request_id for r in released] == [2, 1]  # high tier first, then the low tier


def test_best_effort_load_cap() -> None:
    policy = SaberPolicy(MODEL, best_effort_max_load=2)
    replica = FakeReplica(0, {10: running(10, None), 11: running(11, None)})
    policy.on_arrival(request(1, 500, 1.0), 0.0, [replica])
    assert policy.release(0.0, [replica]) == []
    del replica.in_flight[11]
    assert len(policy.release(0.0, [replica])) == 1


def test_routes_to_a_replica_where_both_conditions_hold() -> None:
    policy = SaberPolicy(MODEL)
    strict = FakeReplica(0, {10: running(10, 95.0)})
    loose = FakeReplica(1, {11: running(11, 20.0), 12: running(12, 20.0)})
    policy.on_arrival(request(1, 50, 1.0), 0.0, [strict, loose])
    released = policy.release(0.0, [strict, loose])
    assert [(r.request.request_id, r.replica) for r in released] == [(1, 1)]


def test_drain_returns_every_held_request() -> None:
    policy = SaberPolicy(MODEL)
    replica = FakeReplica(0, {10: running(10, 99.0)})
    policy.on_arrival(request(1, 500, 1.0), 0.0, [replica])
    policy.on_arrival(request(2, 10, 10.0), 0.0, [replica])
    assert sorted(r.request_id for r in policy.drain()) == [1, 2]
    assert len(policy.high) == 0 and len(policy.low) == 0


# ---------------------------------------------------------------- speed model (sec. IV-B, VII)


def test_usl_fit_recovers_its_parameters_and_ranks_above_linear() -> None:
    rng = np.random.default_rng(0)
    loads = rng.integers(1, 101, 1000).astype(float)
    truth = 60.0 / (1 + 0.02 * (loads - 1) + 0.0002 * loads * (loads - 1))
    samples = [SpeedSample(load=x, speed_tps=y) for x, y in zip(loads, truth * rng.normal(1, 0.01, 1000), strict=True)]
    models = fit_all(samples)
    usl = models["usl"]
    assert usl.params[0] == pytest.approx(60.0, rel=0.02)
    assert usl.params[1] == pytest.approx(0.02, rel=0.15)
    assert usl.params[2] == pytest.approx(0.0002, rel=0.15)
    assert usl.r2 > 0.99
    assert models["linear"].r2 < usl.r2
    assert usl.fastest_tps == pytest.approx(60.0, rel=0.02)


def test_fit_needs_points() -> None:
    with pytest.raises(ValueError, match="at least 4"):
        fit_speed_model([SpeedSample(1, 10.0)])


def _record(rid: int, sent: float, end: float, tokens: int) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        task="t",
        slo=RequestSLO(),
        prompt_tokens=1,
        max_tokens=tokens,
        scheduled_s=sent,
        arrival_s=sent,
        sent_s=sent,
        end_s=end,
        output_tokens=tokens,
    )


def test_speed_samples_use_the_load_seen_during_execution() -> None:
    # A runs 0-4 s alone for half of it; B runs 2-4 s next to A all along.
    samples = speed_samples([_record(1, 0.0, 4.0, 100), _record(2, 2.0, 4.0, 40)])
    by_speed = sorted((s.speed_tps, s.load) for s in samples)
    assert by_speed[0] == pytest.approx((20.0, 2.0))  # B: 40 tokens / 2 s at load 2
    assert by_speed[1] == pytest.approx((25.0, 1.5))  # A: 100 tokens / 4 s at mean load 1.5
    assert len(speed_samples([_record(1, 0.0, 4.0, 100), _record(2, 2.0, 4.0, 40)], skip_first=1)) == 1


def test_track_progress_protects_what_a_running_request_still_needs() -> None:
    def newcomer_admitted(track: bool) -> bool:
        policy = SaberPolicy(MODEL, track_progress=track)
        replica = FakeReplica(0)
        first = request(1, 950, 10.0)  # needs 95 tok/s; admitted alone (f(1) = 100)
        policy.on_arrival(first, 0.0, [replica])
        assert [r.request.request_id for r in policy.release(0.0, [replica])] == [1]
        replica.in_flight[1] = first
        # At t = 5, f(1) x 5 s = 500 tokens are done by the model: 450 left in 5 s need 90 tok/s <= f(2).
        policy.on_arrival(request(2, 10, 5.0, arrival_s=5.0), 5.0, [replica])
        return [r.request.request_id for r in policy.release(5.0, [replica])] == [2]

    assert newcomer_admitted(track=True)
    assert not newcomer_admitted(track=False)  # the paper's literal check: f(2) = 90.9 < recorded 95


def test_offered_load_feasibility_demotes_what_only_a_near_idle_engine_could_serve() -> None:
    # L f(L) = 100, 181.8, 250, 307.7, 357.1, 400: the 380 output tokens of the last second's arrivals need
    # L* = 6, so f(6) = 66.7 tok/s is the feasible speed.
    def tier_of_tight_request(feasibility: str) -> str:
        policy = SaberPolicy(MODEL, feasibility=feasibility, demand_window_s=1.0)
        replica = FakeReplica(0)
        for rid in range(10):
            policy.on_arrival(request(rid, 30, 10.0, arrival_s=rid * 0.1), rid * 0.1, [replica])
        tight = request(99, 80, 1.0, arrival_s=1.0)  # needs 80 tok/s: below f(1), above f(6)
        policy.on_arrival(tight, 1.0, [replica])
        return tight.tier

    assert tier_of_tight_request("fastest") == TIER_HIGH
    assert tier_of_tight_request("offered-load") == TIER_LOW


# ---------------------------------------------------------------- on the simulator


def test_offline_phase_profiles_about_a_thousand_points_and_usl_fits_best() -> None:
    from core.control.saber.speed_model import offline_phase
    from core.profile import load_calibration, load_profile
    from core.sim.engine import simulate

    profile = load_profile("saber-w3")
    speeds = offline_phase(profile, load_calibration(profile), simulate)
    assert 900 <= len(speeds.samples) <= 1100
    loads = np.array([s.load for s in speeds.samples])
    assert loads.min() < 1.5 and loads.max() > 80  # the sweep spans the concurrency range
    usl = speeds.models["usl"]
    assert usl.r2 > speeds.models["logistic"].r2 > speeds.models["linear"].r2 > 0.8
    assert usl(1) > usl(10) > usl(100) > 0  # speed falls with concurrency


def test_saber_in_the_simulator_accounts_for_every_request_and_keeps_its_promises() -> None:
    import asyncio

    from core.backends.factory import make_backend
    from core.events import null_sink
    from core.jobs import RunOptions, run_workload
    from core.profile import PoissonArrival, load_profile
    from core.records import Status

    base = load_profile("saber-w3")
    workload = base.workload.model_copy(
        update={"arrival": PoissonArrival(rate_rps=10), "requests": 300, "warmup_requests": 0}
    )
    profile = base.model_copy(update={"workload": workload, "mode": "saber"})
    result = asyncio.run(run_workload(profile, make_backend("sim", profile), null_sink, RunOptions()))
    records = result.records
    assert len(records) == 300 and all(r.status is Status.OK for r in records)
    assert result.outcome.notes["mode"]["mode"] == "saber"
    high = [r for r in records if r.tier == TIER_HIGH]
    low = [r for r in records if r.tier == TIER_LOW]
    assert len(high) + len(low) == 300 and high and low
    # Admitted requests were predicted to meet their SLAs; nearly all do. Demoted ones were already lost.
    met_high = sum(r.e2e_s <= r.slo.e2e_s for r in high) / len(high)
    met_low = sum(r.e2e_s <= r.slo.e2e_s for r in low) / len(low)
    assert met_high > 0.9
    assert met_low < 0.2


def test_drift_correction_keeps_the_promises_on_an_engine_slower_than_profiled() -> None:
    """f(L) profiled on the engine as calibrated, served by one whose steps all take 1.5x as long (a live
    server whose speed has drifted): without the correction SABER admits requests that then miss; with it
    the admitted ones meet their SLAs and more requests meet them in all."""
    import asyncio

    from core.backends.sim import SimBackend
    from core.control.saber.speed_model import offline_phase
    from core.events import null_sink
    from core.jobs import RunOptions, run_workload
    from core.profile import PoissonArrival, load_calibration, load_profile
    from core.sim.engine import simulate

    base = load_profile("saber-w3")
    calibration = load_calibration(base)
    model = offline_phase(base, calibration, simulate).models["usl"]
    cost_fields = ("base_s", "per_token_s", "per_ctx_token_s", "per_spec_step_s", "per_seq_s")
    slower = calibration.model_copy(
        update={
            "terms": [
                term.model_copy(update={name: getattr(term, name) * 1.5 for name in cost_fields})
                for term in calibration.terms
            ]
        }
    )
    workload = base.workload.model_copy(
        update={"arrival": PoissonArrival(rate_rps=10), "requests": 600, "warmup_requests": 0}
    )
    profile = base.model_copy(update={"workload": workload})

    def run(drift: bool) -> tuple[float, int, dict | None]:
        backend = SimBackend(
            slower,
            profile.knobs,
            seed=1,
            policy_factory=lambda: SaberPolicy(model, drift_correction=drift, max_load=100),
        )
        result = asyncio.run(run_workload(profile, backend, null_sink, RunOptions()))
        admitted = [r for r in result.records if r.tier == TIER_HIGH and r.ok]
        met = sum(r.e2e_s <= r.slo.e2e_s for r in admitted)
        return met / len(admitted), met, result.outcome.notes["mode"]["drift"]

    plain_attainment, plain_met, no_drift = run(False)
    corrected_attainment, corrected_met, drift = run(True)
    assert no_drift is None and drift is not None
    assert 0.55 < drift["ratio"] < 0.8  # it sees the engine running at about 1/1.5 of the profile
    assert plain_attainment < 0.6 < 0.9 < corrected_attainment
    assert corrected_met > 2 * plain_met  # measured: 164 against 48


def test_live_priority_puts_the_low_tier_behind_admitted_requests_only_when_asked() -> None:
    high, low = request(1, 10, 5.0), request(2, 10, 5.0)
    high.tier, low.tier = TIER_HIGH, TIER_LOW
    assert SaberPolicy(MODEL).upstream_priority(high) is None  # vLLM's default policy takes no priority
    policy = SaberPolicy(MODEL, send_priority=True)
    assert policy.upstream_priority(high) == 0 and policy.upstream_priority(low) == 1
