"""SLOs-Serve's step planner inside a simulated replica: the best-effort tier yields to SLO requests."""

from __future__ import annotations

import numpy as np

from core.control.slos_serve.admission import PlannerSettings
from core.control.slos_serve.stepping import SlosServeStepPlanner
from core.controller_api import TIER_BEST_EFFORT, TIER_HIGH
from core.profile import KnobsSpec
from core.records import RequestSLO, RequestSpec
from core.sim.sim_request import SimRequest
from core.sim.stepwise import StepwiseReplica
from core.step_time import StepTimeModel
from tests.test_sim import tiny_calibration


def _replica(max_seqs: int = 2, kv_capacity: int = 100_000) -> StepwiseReplica:
    calibration = tiny_calibration(kv_capacity_tokens=kv_capacity)
    planner = SlosServeStepPlanner(
        StepTimeModel.from_calibration(calibration),
        PlannerSettings(max_batch_tokens=2048, kv_capacity_tokens=kv_capacity),
        lambda controlled: (1.0, 0.1),
    )
    knobs = KnobsSpec(max_num_seqs=max_seqs, max_num_batched_tokens=2048)
    return StepwiseReplica(0, calibration, knobs, np.random.default_rng(0), lambda *args: None, planner)


def _request(rid: int, tier: str, prompt: int = 100, output: int = 500) -> SimRequest:
    spec = RequestSpec(rid, prompt, output, arrival_s=0.0, slo=RequestSLO(ttft_s=1.0, tpot_s=0.1))
    return SimRequest(spec=spec, latency_from_s=0.0, prompt_left=prompt, out_left=output, tier=tier)


def _ids(items) -> set[int]:  # type: ignore[no-untyped-def]
    return {item.spec.request_id for item in items}


def test_a_queued_slo_request_preempts_best_effort_work_for_a_slot():
    replica = _replica(max_seqs=2)
    for rid in (0, 1):
        replica.enqueue(_request(rid, TIER_BEST_EFFORT), 0.0)
    while replica.waiting:
        replica.step_once()
    assert _ids(replica.prefilling) | _ids(replica.decoding) == {0, 1}
    replica.enqueue(_request(2, TIER_HIGH), replica.clock)
    replica.step_once()
    admitted = _ids(replica.prefilling) | _ids(replica.decoding)
    assert 2 in admitted and len(admitted) == 2
    assert replica.preemptions == 1 and _ids(replica.waiting) == {0, 1} - admitted
    (victim,) = replica.waiting
    assert victim.generated > 0 and victim.prompt_left == 100 + victim.generated  # resumes by one prefill


def test_a_queued_slo_request_preempts_best_effort_work_for_memory_and_goes_first_in_the_queue():
    replica = _replica(max_seqs=8, kv_capacity=1024)
    replica.enqueue(_request(0, TIER_BEST_EFFORT, prompt=600), 0.0)
    replica.step_once()
    replica.enqueue(_request(1, TIER_BEST_EFFORT, prompt=100), replica.clock)  # queued ahead of the SLO one
    replica.enqueue(_request(2, TIER_HIGH, prompt=600), replica.clock)
    replica.step_once()
    assert 2 in _ids(replica.prefilling) | _ids(replica.decoding)
    assert replica.preemptions == 1 and 0 in _ids(replica.waiting)


def test_slo_requests_alone_are_never_preempted_by_the_planner():
    replica = _replica(max_seqs=2)
    for rid in (0, 1, 2):
        replica.enqueue(_request(rid, TIER_HIGH), 0.0)
    for _ in range(5):
        replica.step_once()
    assert replica.preemptions == 0 and _ids(replica.waiting) == {2}
