"""The planner path of a replica (core/sim/stepwise.py) models the engine as the fast path does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from core.backend_api import LoadPlan
from core.controller_api import Policy
from core.profile import KnobsSpec, load_profile
from core.records import RequestSpec
from core.sim.engine import SimEngine
from core.sim.stepwise import FcfsStepPlanner
from core.step_planner_api import draw_accepted
from core.step_time import expected_accepted_tokens
from tests.sim_fingerprint import records_digest, run_profile
from tests.test_sim import tiny_calibration

FINGERPRINTS = json.loads((Path(__file__).parent / "data" / "fcfs_fingerprints.json").read_text())["profiles"]


class PlannedFcfs(Policy):
    """fcfs whose batches the planner path forms."""

    name = "fcfs-planned"

    def step_planner(self, replica_index: int) -> FcfsStepPlanner:
        return FcfsStepPlanner(width=0)


# Profiles without speculation (with it, the fast path emits the expected count per step, the planner path
# draws each step: equal in the mean, not per timeline).
NO_SPEC = [n for n in sorted(FINGERPRINTS) if load_profile(n).knobs.effective_spec_width == 0]


@pytest.mark.parametrize("name", NO_SPEC)
def test_vllm_batching_as_a_planner_reproduces_the_fast_path(name: str) -> None:
    assert records_digest(run_profile(name, PlannedFcfs)) == FINGERPRINTS[name]["sha256"]


def test_preemption_on_the_planner_path_matches_the_fast_path() -> None:
    calibration = tiny_calibration(kv_capacity_tokens=2048)

    def specs() -> list[RequestSpec]:
        return [RequestSpec(request_id=i, prompt_tokens=100, output_tokens=200, arrival_s=0.0) for i in range(12)]

    fast = SimEngine(calibration, KnobsSpec(max_num_seqs=16), LoadPlan(requests=iter(specs())))
    planned = SimEngine(calibration, KnobsSpec(max_num_seqs=16), LoadPlan(requests=iter(specs())), policy=PlannedFcfs())
    fast_records, planned_records = fast.run(), planned.run()
    assert fast.preemptions > 0 and planned.preemptions == fast.preemptions

    # Same tokens at the same times (the fast path keeps explicit chunk sizes for a preempted request's runs,
    # the planner path None for one token per chunk: the same timeline written two ways).
    def timelines(records):  # type: ignore[no-untyped-def]
        return {r.request_id: (r.end_s, r.preemptions, r.token_times().tobytes()) for r in records}

    assert timelines(planned_records) == timelines(fast_records)


def test_drawn_acceptance_matches_the_expected_tokens_per_step() -> None:
    rng = np.random.default_rng(7)
    for acceptance, drafted in [(0.6, 4), (0.9, 8), (0.2, 2)]:
        draws = [draw_accepted(rng, acceptance, drafted) for _ in range(20000)]
        assert max(draws) <= drafted + 1 and min(draws) >= 1
        assert np.mean(draws) == pytest.approx(expected_accepted_tokens(acceptance, drafted), rel=0.03)


class _ThreeEach(FcfsStepPlanner):
    """Verifies three positions per decoding request and emits all three, told either way: drawn with the
    plan (BatchPlan.emitted, `accepted` then must not be asked) or answered by `accepted`."""

    def __init__(self, with_plan: bool) -> None:
        super().__init__(width=2)
        self.with_plan = with_plan

    def plan(self, replica, now):  # type: ignore[no-untyped-def]
        batch = super().plan(replica, now)
        if self.with_plan:
            batch.emitted = [3] * len(batch.decode)
        return batch

    def accepted(self, request, verified, rng):  # type: ignore[no-untyped-def]
        assert not self.with_plan, "the replica asked accepted() although the plan carried the emitted tokens"
        return 3


def test_the_plans_emitted_tokens_are_what_the_replica_emits() -> None:
    calibration = tiny_calibration()

    def run(with_plan: bool):  # type: ignore[no-untyped-def]
        class Policy3(Policy):
            name = "three-each"

            def step_planner(self, replica_index: int) -> FcfsStepPlanner:
                return _ThreeEach(with_plan)

        specs = [RequestSpec(request_id=i, prompt_tokens=50, output_tokens=20, arrival_s=0.1 * i) for i in range(6)]
        return SimEngine(calibration, KnobsSpec(max_num_seqs=8), LoadPlan(requests=iter(specs)), policy=Policy3()).run()

    planned, asked = run(True), run(False)
    for record in planned:
        # The first token ends the prefill, then three a step, the last step what is left (20 = 1 + 6 * 3 + 1).
        assert record.chunk_tokens is not None and record.chunk_tokens.tolist() == [1, 3, 3, 3, 3, 3, 3, 1]
    assert records_digest(planned) == records_digest(asked)
