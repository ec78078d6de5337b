"""AdaServe where speculation cannot pay (issue 21): prefill-heavy steps and SLOs that need no speculation.

The loss this pins: AdaServe's verification took max_num_batched_tokens from the prompts a step carries and
its draft passes lengthened every step, so on long prompts (long-prompt-chat) and tight TTFT SLOs
(slos-serve-reasoning: 0.446 against fcfs's 0.996) it lost to vLLM's batching without speculation.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from core.backends.sim import SimBackend
from core.control.adaserve.policy import AdaServePolicy, StepLengths, TreePlanner
from core.control.adaserve.scheduler import PrefillLoad, TreeScheduler, roofline_budget
from core.metrics import summarize
from core.profile import AdaServeSpec, Profile, load_calibration, load_profile
from core.records import RequestSLO, RequestSpec
from core.sim.sim_request import SimRequest
from core.step_planner_api import BatchPlan, StepRequest
from core.step_time import StepTimeModel
from core.workload import build_load_plan

CALIBRATION = load_calibration(load_profile("adaserve-mix"))  # llama-7b-a100
MODEL = StepTimeModel.from_calibration(CALIBRATION)
TOKEN_BUDGET = 2048
STEP_S = 0.012  # the decoders' steps so far


def decoder(i: int, tpot_s: float) -> StepRequest:
    """A request 10 steps into decoding (11 tokens out, 200 to go), one token every STEP_S."""
    spec = RequestSpec(i, prompt_tokens=1000, output_tokens=211, slo=RequestSLO(tpot_s=tpot_s), acceptance=0.7)
    item = StepRequest(req=SimRequest(spec=spec, latency_from_s=0.0, prompt_left=0), prompt_left=0, out_left=200)
    item.acceptance, item.decoding, item.admitted_order, item.context = 0.7, True, i, 1008
    item.chunk_times = [STEP_S * k for k in range(11)]
    item.chunk_tokens = [1] * 11
    return item


def queued(i: int, prompt: int) -> StepRequest:
    spec = RequestSpec(i, prompt_tokens=prompt, output_tokens=100, slo=RequestSLO(ttft_s=1.0, tpot_s=0.05))
    return StepRequest(
        req=SimRequest(spec=spec, latency_from_s=0.0, prompt_left=prompt), prompt_left=prompt, out_left=100
    )


def replica(decoding: list[StepRequest], waiting: list[StepRequest], max_seqs: int = 128) -> SimpleNamespace:
    return SimpleNamespace(
        index=0,
        model=MODEL,
        width=0,
        max_seqs=max_seqs,
        token_budget=TOKEN_BUDGET,
        chunked=True,
        block=16,
        kv_capacity=CALIBRATION.kv_capacity_tokens,
        kv_used=float(sum(r.context for r in decoding)),
        waiting=deque(waiting),
        prefilling=[],
        decoding=decoding,
        running=len(decoding),
    )


def plan(spec: AdaServeSpec, view: SimpleNamespace) -> BatchPlan:
    """The planner's plan for the step starting when the decoders' last step ended, after it has seen the
    steps before it last STEP_S each (it learns step lengths from the steps it plans)."""
    planner = TreePlanner(TreeScheduler(spec, MODEL, np.random.default_rng(0)), spec)
    now = STEP_S * 10
    for _ in range(10):
        planner._steps.add(STEP_S)
    planner._last_plan_s = now - STEP_S
    return planner.plan(view, now)


def verified(batch: BatchPlan) -> list[int]:
    return [count for _, count in batch.decode]


def test_a_step_that_no_slo_needs_speculation_for_is_vllms_step() -> None:
    """Eight decoders far inside a 100 ms TPOT SLO (12 ms steps) and a 12k-token prompt waiting: nothing is
    at stake, so the step verifies one token per decoder, runs no draft pass, and the prompt gets all the
    token budget the decodes leave, exactly as vLLM's step would (before: the knee's draft tokens took
    budget from the prompt, and three draft passes lengthened the step)."""
    decoding = [decoder(i, tpot_s=0.1) for i in range(8)]
    batch = plan(AdaServeSpec(), replica(decoding, [queued(100, 12_000)]))
    assert verified(batch) == [1] * 8 and batch.spec_steps == 0
    assert [chunk for _, chunk in batch.prefill] == [TOKEN_BUDGET - 8]
    # The ablation is the behaviour before: draft tokens and passes, and less prompt.
    before = plan(AdaServeSpec(must_pay=False), replica(decoding, [queued(100, 12_000)]))
    assert sum(verified(before)) > 8 and before.spec_steps > 0
    assert sum(chunk for _, chunk in before.prefill) < TOKEN_BUDGET - 8


def test_a_prefill_saturated_step_verifies_no_draft_token_even_when_slos_are_at_stake() -> None:
    """Decoders behind a 10 ms TPOT SLO, and a long prompt that fills the step: the prompt chunk has made the
    step compute-bound, so a draft token is not free beside it and would take a prompt token's place."""
    decoding = [decoder(i, tpot_s=0.010) for i in range(8)]
    batch = plan(AdaServeSpec(), replica(decoding, [queued(100, 12_000)]))
    assert verified(batch) == [1] * 8 and batch.spec_steps == 0
    assert [chunk for _, chunk in batch.prefill] == [TOKEN_BUDGET - 8]


def test_a_short_prompt_leaves_free_verification_that_the_step_uses() -> None:
    """The same decoders beside a 20-token prompt: the step stays memory-bound, so AdaServe verifies draft
    tokens up to the knee of the step with its prompt, and the prompt is prefilled whole."""
    decoding = [decoder(i, tpot_s=0.010) for i in range(8)]
    view = replica(decoding, [queued(100, 20)])
    batch = plan(AdaServeSpec(), view)
    tokens = sum(verified(batch))
    assert tokens > 8 and batch.spec_steps > 0
    assert [chunk for _, chunk in batch.prefill] == [20]
    # Free: without the draft passes, the step is no longer than vLLM's (one token per decoder + the prompt).
    plain = MODEL.step_time(8 + 20, view.kv_used, 0, 9)
    assert MODEL.step_time(tokens + 20, view.kv_used, 0, 9) == pytest.approx(plain, rel=0.01)


def test_requests_waiting_for_a_sequence_slot_let_speculation_pay() -> None:
    """Nothing at stake, but the batch is full (max_num_seqs) and a request queues: finishing decodes sooner
    frees its slot sooner, so the step speculates."""
    decoding = [decoder(i, tpot_s=0.1) for i in range(8)]
    batch = plan(AdaServeSpec(), replica(decoding, [queued(100, 500)], max_seqs=8))
    assert sum(verified(batch)) > 8 and batch.spec_steps > 0 and batch.prefill == []


def test_the_roofline_budget_sees_the_prefill_in_the_step() -> None:
    # llama-7b-a100: alone, one sequence verifies 93 tokens for free; beside a 50-token prompt (one more
    # sequence) the knee is 2 + 0.086 (1 + 50 + x) = 10.1 ms, x = 43 more; beside 200 tokens, none.
    assert roofline_budget(MODEL) == 93
    assert roofline_budget(MODEL, 0.0, 1, PrefillLoad(50, 1, TOKEN_BUDGET)) == 44
    assert roofline_budget(MODEL, 0.0, 1, PrefillLoad(200, 1, TOKEN_BUDGET)) == 1
    scheduler = TreeScheduler(AdaServeSpec(budget=500), MODEL, np.random.default_rng(0))
    # A fixed budget is held to the free tokens too, and never takes the prompt's share of the token budget.
    assert scheduler.budget(4, 0.0) == 500
    assert scheduler.budget(4, 0.0, PrefillLoad(2044, 1, TOKEN_BUDGET)) == 4


def test_step_lengths_mean_of_the_last_k() -> None:
    steps = StepLengths()
    assert steps.mean_of_last(5) == 0.0
    for seconds in (1.0, 2.0, 3.0, 6.0):
        steps.add(seconds)
    assert steps.mean_of_last(1) == 6.0 and steps.mean_of_last(2) == 4.5 and steps.mean_of_last(100) == 3.0


def attainment(profile: Profile, policy: AdaServePolicy | None) -> float:
    calibration = load_calibration(profile)
    backend = SimBackend(calibration, profile.knobs, seed=0, policy_factory=None if policy is None else lambda: policy)
    records = asyncio.run(backend.run(build_load_plan(profile))).records
    return summarize(records, slo=profile.slo, smooth=profile.smooth_goodput).slo_attainment


def shortened(name: str, requests: int) -> Profile:
    profile = load_profile(name)
    copy = profile.model_copy(update={"workload": profile.workload.model_copy(update={"requests": requests})})
    copy._source = profile._source
    return copy


def test_adaserve_no_longer_loses_to_fcfs_on_a_tight_ttft_slo() -> None:
    """slos-serve-reasoning: a 15 ms TTFT SLO beside 5 ms decode steps and a 57 ms TPOT SLO the decoders meet
    without speculation. Before, every step ran three draft passes, and arrivals waited for them."""
    profile = shortened("slos-serve-reasoning", 100)
    calibration = load_calibration(profile)
    fcfs = attainment(profile, None)
    assert attainment(profile, AdaServePolicy(profile.adaserve, calibration)) >= fcfs - 0.02
    before = profile.adaserve.model_copy(update={"must_pay": False})
    assert attainment(profile, AdaServePolicy(before, calibration)) < fcfs - 0.3


def test_adaserve_beats_fcfs_on_long_prompts() -> None:
    """long-prompt-chat (12k-token prompts, 32k context): AdaServe speculates where a request's TPOT is at
    stake and leaves the prompts their token budget."""
    profile = shortened("long-prompt-chat", 300)
    calibration = load_calibration(profile)
    assert attainment(profile, AdaServePolicy(profile.adaserve, calibration)) > attainment(profile, None)
