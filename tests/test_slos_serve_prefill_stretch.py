"""SLOs-Serve's stretches through prefill chunks: the batch they promise is the one form_batch forms.

`batching.prefill_beside_every_decode` says, from the budget, the decode count, the urgent share and the
prompt left, what form_batch gives the SLO prefills when it gives every SLO decode one token; the stepwise
replica runs such steps without the planner (stepwise.StepwiseReplica._prefill_segment, the planner's
`plain_prefill_check`). Here: on random batches, wherever it answers, form_batch agrees whatever the decodes'
due times and the prefills' deadlines; and the stretches do run on bench-chat, with requests queued, and
give the step-by-step reference's records there (tests/test_slos_serve_fast_path.py holds every shipped
profile and the pressure cases to the reference).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from core.capacity import at_rate
from core.control.slos_serve.batching import (
    URGENCY,
    DecodeTask,
    PrefillTask,
    form_batch,
    prefill_beside_every_decode,
    urgent_prefill_tokens,
)
from core.control.slos_serve.budget import BudgetModel
from core.control.slos_serve.step_requests import stable_order
from core.control.slos_serve.stepping import SlosServeStepPlanner
from core.controller_api import TIER_BEST_EFFORT
from core.modes import ModeContext, make_policy
from core.profile import load_calibration, load_profile
from core.sim import stepwise
from core.sim.engine import SimEngine
from core.step_planner_api import BatchPlan
from core.step_time import StepTimeModel
from core.workload import build_load_plan
from tests.test_sim_fast_path import assert_same_records
from tests.test_slos_serve_fast_path import COUNTED

MODEL = StepTimeModel(((0.004, 1e-5, 1e-7, 0.0, 2e-5), (0.0005, 4e-5, 0.0, 0.0, 0.0)))


def test_the_promised_prefill_is_form_batchs() -> None:
    rng = np.random.default_rng(11)
    answered = refused = 0
    for _ in range(4000):
        now = float(rng.uniform(0.0, 10.0))
        tpots = [0.02, 0.05, 0.1][: int(rng.integers(1, 4))]
        decodes = [
            DecodeTask(i, float(rng.choice(tpots)), now + float(rng.uniform(-0.05, 0.3)), int(rng.integers(1, 50)))
            for i in range(int(rng.integers(0, 40)))
        ]
        prefills = [
            PrefillTask(100 + i, now + float(rng.uniform(-0.1, 2.0)), int(rng.integers(1, 1500)))
            for i in range(int(rng.integers(1, 4)))
        ]
        budget = BudgetModel(
            MODEL,
            tpots,
            max_batch_tokens=int(rng.choice([64, 256, 512, 2048])),
            context_tokens=float(rng.uniform(0, 50_000)),
            sequences=len(decodes) + len(prefills),
            knee_efficiency=None if rng.random() < 0.3 else 0.95,
        )
        mask = 0
        for d in decodes:
            mask |= 1 << tpots.index(d.tpot_s)
        plan = budget.plan(mask)
        ordered = sorted(prefills, key=lambda p: p.deadline_s)
        urgent = urgent_prefill_tokens(now, ordered, plan.batch_time_s, URGENCY)
        left = sum(p.tokens_left for p in prefills)
        tokens = prefill_beside_every_decode(int(plan.batch_tokens), len(decodes), urgent, left)
        if tokens is None:
            refused += 1
            continue
        answered += 1
        batch = form_batch(now, decodes, prefills, budget)
        assert sorted(batch.decode.items()) == [(d.request_id, 1) for d in sorted(decodes, key=lambda d: d.request_id)]
        expected: dict[int, int] = {}
        rest = tokens
        for p in ordered:
            if rest <= 0:
                break
            expected[p.request_id] = min(p.tokens_left, rest)
            rest -= expected[p.request_id]
        assert batch.prefill == expected
    assert answered > 1000 and refused > 100  # both branches taken


def _bench_chat(requests: int, reference: bool, counts: dict[str, int], monkeypatch: pytest.MonkeyPatch) -> list:
    original = stepwise.StepwiseReplica._prefill_segment

    def counting(self: stepwise.StepwiseReplica, *args: float) -> tuple[int, bool]:
        queued = bool(self.waiting)
        ran, more = original(self, *args)
        counts["prefill"] += ran
        counts["queued"] += ran if queued else 0
        return ran, more

    monkeypatch.setattr(stepwise.StepwiseReplica, "_prefill_segment", counting)
    profile = load_profile("bench-chat")
    calibration = load_calibration(profile)
    context = ModeContext(profile=profile, calibration=calibration, seed=profile.seed)
    plan = build_load_plan(profile, seed=profile.seed, requests=requests)
    engine = SimEngine(
        calibration,
        profile.knobs,
        plan,
        seed=profile.seed,
        policy=make_policy("slos-serve", context),
        reference=reference,
    )
    records = engine.run()
    counts["steps"] = engine.step
    return records


def test_bench_chat_runs_its_prefill_chunks_in_stretches(monkeypatch: pytest.MonkeyPatch) -> None:
    """About a quarter of bench-chat's steps carry a prefill chunk beside the decodes, among them the steps that
    admit a queued request; most of them run in stretches now, with a request queued in a good share."""
    fast = {"prefill": 0, "queued": 0}
    records = _bench_chat(600, False, fast, monkeypatch)
    reference = {"prefill": 0, "queued": 0}
    assert_same_records(records, _bench_chat(600, True, reference, monkeypatch))
    assert reference["prefill"] == 0
    if COUNTED:  # (counted by a patch: the pure build only)
        assert fast["prefill"] > 0.15 * fast["steps"]
        assert fast["queued"] > 0.2 * fast["prefill"]


def _overloaded_quickstart(
    rate_rps: float, reference: bool, counts: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> list:
    """Quickstart above its capacity (the capacity job's probes): many requests go to the best-effort tier and are
    served beside the SLO ones; `counts` gets the prefill-stretch steps run with a best-effort request decoding
    or prefilling in the replica ("best_effort")."""
    original = stepwise.StepwiseReplica._prefill_segment

    def counting(self: stepwise.StepwiseReplica, *args: float) -> tuple[int, bool]:
        held = (*self.decoding, *self.prefilling)
        with_best_effort = any(item.req.tier == TIER_BEST_EFFORT for item in held)
        ran, more = original(self, *args)
        counts["best_effort"] += ran if with_best_effort else 0
        return ran, more

    monkeypatch.setattr(stepwise.StepwiseReplica, "_prefill_segment", counting)
    profile = at_rate(load_profile("quickstart"), rate_rps)
    calibration = load_calibration(profile)
    context = ModeContext(profile=profile, calibration=calibration, seed=profile.seed)
    plan = build_load_plan(profile, seed=profile.seed, requests=500)
    policy = make_policy("slos-serve", context)
    engine = SimEngine(calibration, profile.knobs, plan, seed=profile.seed, policy=policy, reference=reference)
    return engine.run()


@pytest.mark.parametrize("rate_rps", [21.25, 34.0])
def test_prefill_stretches_beside_the_best_effort_tier(rate_rps: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """With best-effort requests decoding (they take a token each from what the SLO requests leave) or prefilling
    (they take the leftovers first), the stretches still run, and give the step-by-step reference's records."""
    fast = {"best_effort": 0}
    records = _overloaded_quickstart(rate_rps, False, fast, monkeypatch)
    reference = {"best_effort": 0}
    assert_same_records(records, _overloaded_quickstart(rate_rps, True, reference, monkeypatch))
    assert reference["best_effort"] == 0
    if COUNTED:  # (counted by a patch: the pure build only)
        assert fast["best_effort"] > 100


def test_the_promised_chunks_are_plans_beside_the_best_effort_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    """At every step of the step-by-step reference on overloaded quickstart, wherever `plain_prefill_check`
    answers, `plan` gives that batch: the same (request, chunk) list in the same order (the replica admits in
    it), a token to every decoding request and nobody preempted; among them steps with the best-effort tier."""
    original = SlosServeStepPlanner.plan
    counts = {"answered": 0, "best_effort": 0}

    def checked(self: SlosServeStepPlanner, replica: stepwise.StepwiseReplica, now: float) -> BatchPlan:
        check = self.plain_prefill_check(replica)
        promised = None if check is None else check(replica.kv_used, now)
        batch = original(self, replica, now)
        if promised is not None:
            assert [(id(item), chunk) for item, chunk in batch.prefill] == [(id(i), c) for i, c in promised]
            assert sorted(id(item) for item, _ in batch.decode) == sorted(map(id, replica.decoding))
            assert all(verified == 1 for _, verified in batch.decode) and not batch.preempt
            counts["answered"] += 1
            held = (*replica.decoding, *replica.prefilling, *(item for item, _ in promised))
            counts["best_effort"] += any(item.req.tier == TIER_BEST_EFFORT for item in held)
        return batch

    monkeypatch.setattr(SlosServeStepPlanner, "plan", checked)
    for rate_rps in (21.25, 34.0):
        _overloaded_quickstart(rate_rps, True, {"best_effort": 0}, monkeypatch)
    assert counts["best_effort"] > 200


def test_stable_order_is_sorteds_order() -> None:
    """step_requests.stable_order (the stretch check's deadline order) gives `sorted`'s stable order of positions:
    ties (0.0 and -0.0 among them), infinities, a NaN (sorted's own answer) and more keys than its insertion sort
    takes."""
    rng = random.Random(42)
    for _ in range(20_000):
        pool = [0.0, -0.0, 1.0, 2.5, math.inf, -math.inf, rng.random()]
        keys = [rng.choice(pool) for _ in range(rng.randint(0, 24))]
        if keys and rng.random() < 0.05:
            keys[rng.randrange(len(keys))] = math.nan
        assert stable_order(keys) == sorted(range(len(keys)), key=keys.__getitem__), keys
