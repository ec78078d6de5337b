"""SLOs-Serve on the simulator: the whole mode (admission, step planner, best-effort tier, routing)."""

from __future__ import annotations

import asyncio

import pytest

from core.backends.factory import make_backend
from core.capacity import at_rate, find_capacity
from core.events import null_sink
from core.jobs import RunOptions, run_workload
from core.profile import load_profile
from core.records import Status

REQUESTS = 300


def _run(profile, mode: str, requests: int = REQUESTS):
    backend = make_backend("sim", profile, mode=mode)
    return asyncio.run(run_workload(profile, backend, null_sink, RunOptions(requests=requests, engine_events=False)))


@pytest.fixture(scope="module")
def coder_overload():
    """Bursty Coder arrivals at 6 req/s: three times what plain FCFS batching holds at 90% attainment."""
    profile = at_rate(load_profile("slos-serve-coder"), 6.0)
    return {mode: _run(profile, mode) for mode in ("fcfs", "slos-serve")}


def test_every_request_is_accounted_for_and_admitted_ones_keep_their_slos(coder_overload):
    result = coder_overload["slos-serve"]
    records = result.records
    assert len(records) == REQUESTS
    assert {r.status for r in records} <= {Status.OK, Status.DEFERRED}
    measured = [r for r in records if not r.warmup]
    high = [r for r in measured if r.tier == "high"]
    best_effort = [r for r in measured if r.tier == "best-effort"]
    assert high and best_effort  # the burst split the requests between the tiers

    def attained(r):
        return r.ok and r.ttft_s <= r.slo.ttft_s and (r.tpot_s is None or r.tpot_s <= r.slo.tpot_s)

    assert sum(map(attained, high)) / len(high) >= 0.95


def test_slos_serve_attains_more_than_fcfs_under_bursts(coder_overload):
    fcfs = coder_overload["fcfs"].summary.slo_attainment
    slos = coder_overload["slos-serve"].summary.slo_attainment
    assert slos > fcfs + 0.2, (fcfs, slos)


def test_two_replicas_share_a_burst_by_sequential_routing():
    profile = at_rate(load_profile("slos-serve-coder"), 8.0).model_copy(update={"replicas": 2})
    result = _run(profile, "slos-serve")
    assert len(result.records) == REQUESTS
    served = [r for r in result.records if r.ok]
    assert {r.replica for r in served} == {0, 1}
    share = sum(r.replica == 1 for r in served) / len(served)
    assert 0.3 < share < 0.7


def test_capacity_bisection_brackets_the_90_percent_rate():
    profile = load_profile("slos-serve-chatbot")
    found = asyncio.run(find_capacity(profile, "fcfs", requests=200, rel_tol=0.05))
    low, high = found.bracket
    assert found.capacity_rps == low > 0 and high > low and (high - low) <= 0.05 * high
    by_rate = {p.rate_rps: p.attainment for p in found.probes}
    assert by_rate[low] >= 0.9 and by_rate[high] < 0.9
