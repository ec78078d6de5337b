"""SLOs-Serve's planner (core/control/slos_serve): admission DP, batch formation, adaptive speculation."""

from __future__ import annotations

import pytest

from core.control.slos_serve.admission import AdmissionPlanner, PlannerSettings, PlanRequest
from core.control.slos_serve.batching import DecodeTask, PrefillTask, form_batch, schedule_batches
from core.control.slos_serve.budget import BudgetModel
from core.step_time import StepTimeModel

# Figure 3's toy system: 6 tokens per time unit whatever the batch (one compute term, no fixed cost).
SIX_PER_UNIT = StepTimeModel(((0.0, 1 / 6, 0.0, 0.0, 0.0),))
UNBOUNDED = PlannerSettings(max_batch_tokens=10**6, kv_capacity_tokens=10**9)


def _running_decodes(n: int, tpot: float = 1.0, left: int = 100) -> list[PlanRequest]:
    return [PlanRequest(i, 0.0, 0, left, tpot, 1000, 100, decode_start_s=0.0) for i in range(n)]


def _new(first_id: int, n: int, prefill: int, deadline: float, tpot: float = 1.0, kv: int = 200) -> list[PlanRequest]:
    return [PlanRequest(first_id + i, deadline, prefill, 50, tpot, kv) for i in range(n)]


def test_figure_3_three_running_decodes_and_a_burst_of_four():
    """Paper 004 Fig. 3: 6 tokens/unit, three running decodes (TPOT 1), four new requests of 6 prefill
    tokens with TTFT 6: every running request keeps its SLO and three of the four new ones are admitted."""
    planner = AdmissionPlanner(SIX_PER_UNIT, UNBOUNDED)
    running = _running_decodes(3)
    new = _new(10, 4, prefill=6, deadline=6.0)
    admission = planner.admit(0.0, running, new)
    assert len(admission.admitted) == 3
    assert admission.declined == [13]  # ties go to the earlier requests
    assert admission.prefill_slack_tokens == pytest.approx(0.0, abs=1e-6)

    # The admitted plan is executable: Algorithm 2's batches last the tightest TPOT (1 unit) and hold 6
    # tokens; every running decode gets its token in every batch, the three prefills finish by 6.
    budget = planner.budget_model(running, new)
    decodes = [DecodeTask(r.request_id, 1.0, 1.0, 100) for r in running]
    prefills = [PrefillTask(i, 6.0, 6, tpot_s=1.0, decode_tokens=50) for i in admission.admitted]
    batches = schedule_batches(0.0, 6.0, decodes, prefills, budget)
    assert len(batches) == 6
    for batch in batches:
        assert batch.duration_s == pytest.approx(1.0)
        assert batch.token_budget == 6
        assert sorted(batch.decode) == [0, 1, 2]
    assert sum(sum(b.prefill.values()) for b in batches) == 18  # 3 x 6: every admitted prompt by the deadline
    # Admitting the fourth as well cannot work: the same batches leave 6 of its tokens unserved by t = 6.
    prefills.append(PrefillTask(13, 6.0, 6, tpot_s=1.0, decode_tokens=50))
    batches = schedule_batches(0.0, 6.0, decodes, prefills, budget)
    assert sum(sum(b.prefill.values()) for b in batches) == 18


def test_dp_prefers_two_small_requests_over_one_large_earlier_one():
    """Greedy in deadline order would take the large early request and then nothing; the DP takes two."""
    planner = AdmissionPlanner(SIX_PER_UNIT, UNBOUNDED)
    large = PlanRequest(1, 5.0, 30, 50, 1.0, 200)
    small = _new(2, 2, prefill=6, deadline=6.0)
    admission = planner.admit(0.0, [], [large, *small])
    assert admission.admitted == [2, 3]
    assert admission.declined == [1]
    # Alone, the large one fits.
    assert planner.admit(0.0, [], [large]).admitted == [1]


def test_running_prefill_is_protected_by_forced_admission():
    planner = AdmissionPlanner(SIX_PER_UNIT, UNBOUNDED)
    # Running request still prefilling: 12 tokens due by t = 3 (18 tokens of budget by then). A new one due
    # at t = 2 takes its prompt from the 12 tokens made by then and 1 token/unit of decode after that.
    running = [PlanRequest(0, 3.0, 12, 50, 1.0, 200)]
    assert planner.admit(0.0, running, _new(5, 1, prefill=5, deadline=2.0)).admitted == [5]  # 18 - 5 - 1 = 12
    # 6 tokens by t = 2 would fit on their own (12 available) but leave the running one a token short.
    assert planner.admit(0.0, running, _new(5, 1, prefill=6, deadline=2.0)).declined == [5]


def test_looser_tpot_tier_leaves_more_prefill_budget():
    planner = AdmissionPlanner(SIX_PER_UNIT, UNBOUNDED)
    # Five decodes at TPOT 1 leave 1 token/unit: by t = 6 only one 6-token prompt fits.
    tight = planner.admit(0.0, _running_decodes(5, tpot=1.0), _new(10, 4, prefill=6, deadline=6.0, tpot=2.0))
    # The same five decodes at TPOT 2 need 2.5 tokens/unit: 21 tokens of prefill by t = 6, three prompts.
    loose = planner.admit(0.0, _running_decodes(5, tpot=2.0), _new(10, 4, prefill=6, deadline=6.0, tpot=2.0))
    assert len(tight.admitted) == 1
    assert len(loose.admitted) == 3


def test_decodes_must_keep_fitting_after_the_last_deadline():
    planner = AdmissionPlanner(SIX_PER_UNIT, UNBOUNDED)
    # Six running decodes at TPOT 1 use the whole 6 tokens/unit: nothing new can start decoding.
    admission = planner.admit(0.0, _running_decodes(6, left=10**6), _new(10, 1, prefill=1, deadline=6.0))
    assert admission.admitted == []


def test_kv_memory_limits_admission():
    settings = PlannerSettings(max_batch_tokens=10**6, kv_capacity_tokens=1000)
    planner = AdmissionPlanner(SIX_PER_UNIT, settings)
    admission = planner.admit(0.0, [], _new(10, 4, prefill=1, deadline=6.0, kv=300))
    assert len(admission.admitted) == 3


def test_sequence_slots_limit_admission():
    """The engine holds at most max_seqs requests: a burst is admitted only into the slots the running
    requests leave (without the limit the DP admitted requests that then queued past their TTFT)."""
    running = _running_decodes(2, tpot=10.0)
    new = _new(10, 4, prefill=1, deadline=6.0, tpot=10.0)
    unlimited = AdmissionPlanner(SIX_PER_UNIT, UNBOUNDED).admit(0.0, running, new)
    assert len(unlimited.admitted) == 4
    limited = PlannerSettings(max_batch_tokens=10**6, kv_capacity_tokens=10**9, max_seqs=5)
    assert len(AdmissionPlanner(SIX_PER_UNIT, limited).admit(0.0, running, new).admitted) == 3


def test_past_deadline_is_declined():
    planner = AdmissionPlanner(SIX_PER_UNIT, UNBOUNDED)
    assert planner.admit(5.0, [], _new(1, 1, prefill=1, deadline=4.0)).declined == [1]


def test_tokens_within_inverts_step_time():
    model = StepTimeModel(((0.010, 0.0, 3.4e-7, 0.0015, 5e-5), (0.002, 8.6e-5, 0.0, 0.0015, 0.0)))
    tokens = model.tokens_within(0.050, 20000, 0, 30)
    assert model.step_time(tokens, 20000, 0, 30) == pytest.approx(0.050)
    assert model.step_time(tokens + 10, 20000, 0, 30) > 0.050
    assert model.tokens_within(0.005, 20000, 0, 30) == 0.0  # the fixed cost alone is over budget


def test_batch_time_follows_tightest_tpot_and_loose_tier_skips_batches():
    budget = BudgetModel(SIX_PER_UNIT, [1.0, 2.0], max_batch_tokens=10**6)
    decodes = [DecodeTask(0, 1.0, 1.0, 10), DecodeTask(1, 2.0, 2.0, 10)]
    batch = form_batch(0.0, decodes, [PrefillTask(9, 5.0, 100)], budget)
    assert batch.duration_s == pytest.approx(1.0)
    assert batch.decode == {0: 1}  # the TPOT-2 request is not due in this batch: its token goes to prefill
    assert batch.prefill == {9: 5}
    # Only loose decodes: the batch may last 2 units and hold 12 tokens.
    batch = form_batch(0.0, decodes[1:], [PrefillTask(9, 5.0, 100)], budget)
    assert batch.duration_s == pytest.approx(2.0)
    assert batch.token_budget == 12


def test_best_effort_gets_only_what_slo_requests_leave():
    budget = BudgetModel(SIX_PER_UNIT, [1.0], max_batch_tokens=10**6)
    decodes = [DecodeTask(0, 1.0, 1.0, 10), DecodeTask(7, 1.0, 0.0, 10, best_effort=True)]
    batch = form_batch(0.0, decodes, [PrefillTask(9, 5.0, 4), PrefillTask(8, 0.0, 100, best_effort=True)], budget)
    assert batch.decode[0] == 1 and batch.prefill[9] == 4
    assert batch.prefill[8] == 1  # the one token left
    assert 7 not in batch.decode


def test_speculation_is_used_where_it_raises_prefill_throughput():
    # Memory-bound: a 40 ms fixed cost per batch. With a 50 ms TPOT, verifying drafts lets a batch last
    # TPOT x Acc(sl) and amortise the fixed cost over more prefill tokens.
    memory_bound = StepTimeModel(((0.040, 1e-5, 0.0, 0.001, 0.0),))
    spec = BudgetModel(
        memory_bound, [0.05], max_batch_tokens=100000, max_spec_len=4, acceptance=0.8, reference_counts=[20]
    )
    assert spec.spec_len[0] > 0
    plain = BudgetModel(memory_bound, [0.05], max_batch_tokens=100000, reference_counts=[20])
    assert spec.prefill_rate([20], 1) > plain.prefill_rate([20], 1)
    # Compute-bound (no fixed cost): drafts only cost tokens, so the planner does not speculate.
    compute_bound = BudgetModel(
        SIX_PER_UNIT, [1.0], max_batch_tokens=10**6, max_spec_len=4, acceptance=0.8, reference_counts=[3]
    )
    assert compute_bound.spec_len == (0,)


def _feasible_alone(now, running, new, chosen, budget):
    """Exhaustive check of one admitted set in the planner's fluid model, written independently of the DP:
    walk every deadline (running prefills and all new requests, in order), earn the prefill budget of the
    decode plan in force, pay the prompts of the running and chosen requests at their deadlines; from the
    first chosen request on, the budget must never be negative, and at the last deadline the decodes still
    going must fit the batches."""
    if not chosen:
        return True
    tiers = budget.tiers
    chosen_ids = {r.request_id for r in chosen}
    decoders = [r for r in running if r.decoding and r.decode_tokens > 0]
    visits = sorted([r for r in running if not r.decoding] + list(new), key=lambda r: r.prefill_deadline_s)
    base_mask = 0
    for r in decoders:
        base_mask |= 1 << tiers.index(r.tpot_s)

    def owed(t):  # running decodes' tokens due by t, per tier
        out = [0.0] * len(tiers)
        for r in decoders:
            out[tiers.index(r.tpot_s)] += min(r.decode_tokens, max(0.0, (t - r.decode_start_s) / r.tpot_s))
        return out

    def mask_of(counts):
        mask = base_mask
        for i, n in enumerate(counts):
            if n:
                mask |= 1 << i
        return mask

    pb, t, counts, previous, started = 0.0, now, [0] * len(tiers), [0.0] * len(tiers), False
    for r in visits:
        plan = budget.plan(mask_of(counts))
        dt = r.prefill_deadline_s - t
        now_owed = owed(r.prefill_deadline_s)
        pb += plan.supply_tps * dt
        for i in range(len(tiers)):
            pb -= plan.cost_per_token[i] * (now_owed[i] - previous[i] + counts[i] * dt / tiers[i])
        t, previous = r.prefill_deadline_s, now_owed
        if started and pb < -1e-6:
            return False
        is_new = r.request_id >= 100
        if is_new and r.request_id not in chosen_ids:
            continue
        if is_new:
            if r.prefill_deadline_s <= now:
                return False
            started = True
        pb -= r.prefill_tokens
        if started and pb < -1e-6:
            return False
        counts[tiers.index(r.tpot_s)] += 1
    alive = [0] * len(tiers)
    for r in decoders:
        if r.decode_start_s + r.decode_tokens * r.tpot_s > t:
            alive[tiers.index(r.tpot_s)] += 1
    total = [c + a for c, a in zip(counts, alive, strict=True)]
    return budget.prefill_rate(total, mask_of(counts)) >= -1e-6


@pytest.mark.parametrize("seed", range(40))
def test_dp_admits_as_many_as_exhaustive_search(seed):
    """On random small instances (two TPOT tiers, running decodes and prefills, 7 new requests) the DP's
    count equals the largest admissible subset found by trying all 128 subsets, and its choice is one."""
    import itertools

    import numpy as np

    rng = np.random.default_rng(seed)
    planner = AdmissionPlanner(SIX_PER_UNIT, UNBOUNDED)
    running = [
        PlanRequest(
            i,
            0.0,
            0,
            int(rng.integers(1, 12)),
            float(rng.choice([1.0, 2.0])),
            100,
            10,
            decode_start_s=float(rng.uniform(-0.5, 0.5)),
        )
        for i in range(int(rng.integers(0, 4)))
    ]
    running += [
        PlanRequest(50 + i, float(rng.uniform(1, 6)), int(rng.integers(1, 8)), 20, 1.0, 100)
        for i in range(int(rng.integers(0, 2)))
    ]
    new = [
        PlanRequest(
            100 + i, float(rng.uniform(0.5, 8.0)), int(rng.integers(1, 14)), 20, float(rng.choice([1.0, 2.0])), 100
        )
        for i in range(7)
    ]
    admission = planner.admit(0.0, running, new)
    budget = planner.budget_model(running, new)
    best = max(
        len(c)
        for k in range(len(new) + 1)
        for c in itertools.combinations(new, k)
        if _feasible_alone(0.0, running, new, c, budget)
    )
    assert len(admission.admitted) == best
    chosen = [r for r in new if r.request_id in admission.admitted]
    assert _feasible_alone(0.0, running, new, chosen, budget)
