"""The controller seam in the simulator: fcfs unchanged, every request accounted for, several replicas."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from core.backend_api import LoadPlan
from core.controller_api import ControlledRequest, HeldQueue, Policy, Release, ReplicaView, Verdict, least_loaded
from core.metrics import summarize
from core.modes import MODES, ModeContext, make_policy
from core.profile import KnobsSpec, ProfileError, SLOSpec, SmoothGoodputSpec, load_calibration, load_profile
from core.records import RequestSpec, Status
from core.sim.engine import SimEngine
from tests.sim_fingerprint import ControlledFcfs, fingerprint_profile, records_digest, run_profile
from tests.test_sim import tiny_calibration

FINGERPRINTS = json.loads((Path(__file__).parent / "data" / "fcfs_fingerprints.json").read_text())["profiles"]


@pytest.mark.parametrize("name", sorted(FINGERPRINTS))
def test_fcfs_timelines_on_shipped_profiles_stay_what_they_were(name: str) -> None:
    # Pinned before the controller seam existed (the refactor was checked byte for byte against the old
    # engine); regenerate with tests/data/make_fcfs_fingerprints.py only for a deliberate model change.
    assert fingerprint_profile(name) == FINGERPRINTS[name]


@pytest.mark.parametrize("name", ["quickstart", "saber-w1", "adaserve-mix", "slos-serve-coder"])
def test_fcfs_through_the_full_controller_path_equals_the_fast_path(name: str) -> None:
    assert records_digest(run_profile(name, ControlledFcfs)) == FINGERPRINTS[name]["sha256"]


def _summary(records):  # type: ignore[no-untyped-def]
    return summarize(records, slo=SLOSpec(e2e_s=1.0), smooth=SmoothGoodputSpec())


def _specs(n: int, *, gap_s: float = 0.01, prompt: int = 64, output: int = 32) -> list[RequestSpec]:
    return [
        RequestSpec(request_id=i, prompt_tokens=prompt, output_tokens=output, arrival_s=i * gap_s) for i in range(n)
    ]


class RejectOdd(Policy):
    name = "reject-odd"
    passthrough = False

    def on_arrival(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> Verdict:
        if req.request_id % 2:
            return Verdict.reject("odd ids are refused")
        return Verdict.release(least_loaded(replicas))


class HoldAll(Policy):
    """Holds every request and releases one at a time, only while the replica is empty; never releases
    requests whose id is a multiple of 5 (they must end as deferred)."""

    name = "hold-all"
    passthrough = False

    def __init__(self) -> None:
        self.queue = HeldQueue()

    def on_arrival(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> Verdict:
        self.queue.push(req)
        return Verdict.hold("low" if req.request_id % 5 == 0 else "high")

    def release(self, now: float, replicas: Sequence[ReplicaView]) -> list[Release]:
        if replicas[0].load > 0:
            return []
        for req in self.queue.head(len(self.queue)):
            if req.request_id % 5:
                self.queue.remove(req)
                return [Release(req, 0)]
        return []

    def drain(self) -> list[ControlledRequest]:
        return self.queue.take_all()


def test_rejected_requests_become_records_with_the_reason() -> None:
    engine = SimEngine(tiny_calibration(), KnobsSpec(), LoadPlan(requests=iter(_specs(40))), policy=RejectOdd())
    records = engine.run()
    statuses = Counter(r.status for r in records)
    assert statuses == {Status.OK: 20, Status.REJECTED: 20}
    rejected = [r for r in records if r.status is Status.REJECTED]
    assert all(r.error == "odd ids are refused" and r.end_s == r.arrival_s for r in rejected)
    summary = _summary(records)
    assert summary.failed_by_status == {"rejected": 20}


def test_held_requests_are_served_later_or_end_deferred() -> None:
    engine = SimEngine(tiny_calibration(), KnobsSpec(), LoadPlan(requests=iter(_specs(30))), policy=HoldAll())
    records = engine.run()
    assert len(records) == 30 and len({r.request_id for r in records}) == 30
    deferred = [r for r in records if r.status is Status.DEFERRED]
    assert sorted(r.request_id for r in deferred) == [0, 5, 10, 15, 20, 25]
    assert all(r.tier == "low" and r.end_s is None for r in deferred)
    served = sorted((r for r in records if r.ok), key=lambda r: r.dispatched_s or 0.0)
    # One at a time: each was released after the previous one ended.
    for earlier, later in itertools.pairwise(served):
        assert later.dispatched_s >= earlier.end_s
    assert all(r.dispatched_s >= r.arrival_s for r in served)


def test_closed_loop_clients_continue_after_a_rejection() -> None:
    plan = LoadPlan(requests=iter(_specs(60, gap_s=0.0)), mode="closed", concurrency=4)
    records = SimEngine(tiny_calibration(), KnobsSpec(), plan, policy=RejectOdd()).run()
    assert len(records) == 60
    assert Counter(r.status for r in records) == {Status.OK: 30, Status.REJECTED: 30}


def test_two_replicas_share_the_load_and_cut_the_tail() -> None:
    def run(replicas: int) -> tuple[list, float]:
        plan = LoadPlan(requests=iter(_specs(400, gap_s=0.004, prompt=128, output=64)))
        records = SimEngine(tiny_calibration(), KnobsSpec(max_num_seqs=8), plan, replicas=replicas).run()
        return records, _summary(records).p99_s

    _, p99_one = run(1)
    two, p99_two = run(2)
    assert all(r.ok for r in two) and len(two) == 400
    served_by = Counter(r.replica for r in two)
    assert set(served_by) == {0, 1} and min(served_by.values()) > 150
    assert p99_two < 0.6 * p99_one
    # A request never starts before it arrived, on any replica.
    assert all(r.first_token_s > r.arrival_s for r in two)


def test_unknown_mode_is_one_clear_line() -> None:
    profile = load_profile("quickstart")
    ctx = ModeContext(profile=profile, calibration=load_calibration(profile))
    with pytest.raises(ProfileError, match="mode 'nope' is not a scheduling mode; choose one of: fcfs"):
        make_policy("nope", ctx)  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match=r"did you mean saber\?"):
        make_policy("sabre", ctx)  # type: ignore[arg-type]
    assert isinstance(make_policy("fcfs", ctx), Policy)
    assert next(iter(MODES)) == "fcfs"


def test_controlled_request_deadline() -> None:
    from core.records import RequestSLO

    req = ControlledRequest(spec=RequestSpec(1, 10, 10, slo=RequestSLO(e2e_s=2.0)), arrival_s=3.0)
    assert req.deadline_s() == 5.0
    assert ControlledRequest(spec=RequestSpec(2, 10, 10), arrival_s=1.0).deadline_s() == math.inf
