"""AdaServe's stretches of plain decode steps give what the step-by-step reference gives, exactly.

With speculation that must pay (issue 21), nothing prefilling and nothing queued, AdaServe's planner gives
vLLM's plain decode step whenever no decoding request's SLO is at stake; the replica then runs such steps
itself, asking the planner's `plain_decode_check` predicate each step instead of `plan`
(stepwise.StepwiseReplica.run_decode_steps). `SimEngine(reference=True)` asks `plan` every step. Every field of
every record, the token timelines, the engine samples, the scheduler's counts (they reach the run's summary)
and the planner's step lengths (they decide later steps) must be identical: on every shipped profile, with
TPOT SLOs that put requests at stake in the middle of a stretch, under KV pressure, with noise and stalls,
and with `must_pay: false` (no stretches).
"""

from __future__ import annotations

from typing import Any

import pytest

from core.backend_api import EngineSample, LoadPlan
from core.control.adaserve.policy import AdaServePolicy
from core.modes import ModeContext, make_policy
from core.profile import AdaServeSpec, Calibration, KnobsSpec, StallModel, load_calibration, load_profile
from core.records import RequestRecord
from core.sim.engine import SimEngine
from core.workload import build_load_plan
from tests.test_sim import tiny_calibration
from tests.test_sim_fast_path import PROFILES, assert_same_records
from tests.test_slos_serve_fast_path import COUNTED, _count_stretch_steps, _pressure_plan

REQUESTS = 200

Run = tuple[list[RequestRecord], list[EngineSample], list[Any]]


def _planner_state(policy: Any) -> list[Any]:
    """What the planners keep between steps and report: the scheduler's counts, the step lengths' sums."""
    return [(planner.scheduler.describe(), planner._steps.sums, planner._last_plan_s) for planner in policy.planners]


def _engine_run(
    calibration: Calibration, knobs: KnobsSpec, plan: LoadPlan, policy: Any, seed: int, reference: bool
) -> Run:
    samples: list[EngineSample] = []
    engine = SimEngine(
        calibration, knobs, plan, seed=seed, policy=policy, on_sample=samples.append, reference=reference
    )
    return engine.run(), samples, _planner_state(policy)


def _assert_same(fast: Run, reference: Run) -> None:
    assert_same_records(fast[0], reference[0])
    assert fast[1] == reference[1]
    assert fast[2] == reference[2]


def _profile_run(name: str, reference: bool, requests: int = REQUESTS) -> Run:
    profile = load_profile(name)
    calibration = load_calibration(profile)
    context = ModeContext(profile=profile, calibration=calibration, seed=profile.seed)
    plan = build_load_plan(profile, seed=profile.seed, requests=min(profile.workload.requests or requests, requests))
    policy = make_policy("adaserve", context)
    return _engine_run(calibration, profile.knobs, plan, policy, profile.seed, reference)


@pytest.mark.parametrize("name", PROFILES)
def test_adaserve_stretches_equal_the_step_by_step_reference(name: str) -> None:
    _assert_same(_profile_run(name, False), _profile_run(name, True))


@pytest.mark.skipif(not COUNTED, reason="patches a method of a mypyc-compiled class")
def test_bench_chat_runs_plain_steps_in_stretches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stretches are taken where they should be: a good share of bench-chat's steps (its plain ones)."""
    ran = _count_stretch_steps(monkeypatch)
    records, _, state = _profile_run("bench-chat", False, requests=400)
    assert len(records) == 400
    steps = len(state[0][1]) - 1  # every step that had decoding requests
    assert sum(ran) > 0.2 * steps


@pytest.mark.parametrize(
    ("case", "calibration", "knobs", "spec"),
    [
        # TPOT SLOs near the plain step's length: requests come to be at stake in the middle of a stretch (their
        # tokens left, counted down by the stretch, and the growing context decide it), so stretches end there.
        (
            "at-stake",
            tiny_calibration(),
            KnobsSpec(max_num_seqs=32, max_num_batched_tokens=512),
            AdaServeSpec(),
        ),
        # A small cache (recompute preemptions) and prompts longer than the token budget (chunks).
        (
            "kv-pressure",
            tiny_calibration(kv_capacity_tokens=4096),
            KnobsSpec(max_num_seqs=16, max_num_batched_tokens=256),
            AdaServeSpec(),
        ),
        # Step-time noise and stalls (a stretch's step draws them as step_once's does; the step lengths follow).
        (
            "noise-and-stalls",
            tiny_calibration(noise_cv=0.2, stalls=StallModel(rate_per_s=2.0, mean_s=0.01, cv=1.0)),
            KnobsSpec(max_num_seqs=32, max_num_batched_tokens=512),
            AdaServeSpec(),
        ),
        # Speculation that need not pay drafts every step: no plain decode batch, every step planned.
        (
            "must-pay-off",
            tiny_calibration(),
            KnobsSpec(max_num_seqs=32, max_num_batched_tokens=512),
            AdaServeSpec(must_pay=False),
        ),
    ],
)
def test_adaserve_stretches_equal_the_reference_under_pressure(
    case: str, calibration: Calibration, knobs: KnobsSpec, spec: AdaServeSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = _count_stretch_steps(monkeypatch)
    # Tiers around the plain step (10 ms at this calibration, plus the context and the prompt chunks).
    tpots = (0.0105, 0.012, 0.02, 0.05)
    runs = [
        _engine_run(calibration, knobs, _pressure_plan(tpots), AdaServePolicy(spec, calibration, seed=3), 4, reference)
        for reference in (False, True)
    ]
    _assert_same(*runs)
    if case == "must-pay-off":
        assert sum(ran) == 0
    elif COUNTED:
        assert sum(ran) > 0  # (the reference run never calls run_decode_steps)
    if case == "kv-pressure":
        assert any(record.preemptions for record in runs[0][0])
