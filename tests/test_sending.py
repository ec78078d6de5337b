"""The sending rules (core/workload/sending.py) hold the same in both worlds: the simulator's clients and the
live load run (against the in-process fake server) send the same requests of the same plan."""

from __future__ import annotations

import asyncio
import math

import pytest

from core.backend_api import LoadPlan, RunOutcome
from core.backends.live import UrlBackend
from core.backends.sim import SimBackend
from core.profile import KnobsSpec
from core.records import RequestSpec, Status
from core.workload.sending import within_duration
from tests.fakeserver import FakeOpenAIServer, StreamReply
from tests.test_sim import tiny_calibration

# Each request takes about 0.2 s in both worlds: 20 tokens at 0.01 s a step (simulator), or a chunk (fake server).
OUTPUT_TOKENS = 20
STEP_S = 0.01
WORLDS = ["sim", "live"]


def specs(count: int, spacing_s: float) -> list[RequestSpec]:
    return [RequestSpec(i, 8, OUTPUT_TOKENS, arrival_s=i * spacing_s) for i in range(count)]


async def serve(world: str, plan: LoadPlan) -> RunOutcome:
    if world == "sim":
        return await SimBackend(tiny_calibration(), KnobsSpec(max_num_seqs=64)).run(plan)
    async with FakeOpenAIServer(reply=StreamReply(chunk_delay_s=STEP_S)) as server:
        return await UrlBackend(server.base_url, metrics_interval_s=None).run(plan)


def sent_ids(outcome: RunOutcome) -> list[int]:
    return sorted(r.request_id for r in outcome.records if r.status is not Status.NOT_SENT)


def test_the_window_is_half_open() -> None:
    assert within_duration(0.0, None) and within_duration(math.inf, None)
    assert within_duration(math.nextafter(0.2, 0.0), 0.2)
    assert not within_duration(0.2, 0.2)
    assert not within_duration(0.0, 0.0)


@pytest.mark.parametrize("world", WORLDS)
async def test_an_arrival_exactly_at_the_duration_is_outside_the_run(world: str) -> None:
    outcome = await serve(world, LoadPlan(requests=iter(specs(3, 0.1)), duration_s=0.2))  # arrivals 0, 0.1, 0.2

    assert sorted(r.request_id for r in outcome.records) == [0, 1]
    assert all(r.ok for r in outcome.records)


@pytest.mark.parametrize("world", WORLDS)
async def test_closed_loop_clients_due_at_the_duration_send_nothing(world: str) -> None:
    # Every client's first send is at 0.0, exactly the end of a zero-length window.
    plan = LoadPlan(requests=iter(specs(10, 0.0)), mode="closed", concurrency=2, duration_s=0.0)

    outcome = await serve(world, plan)

    assert outcome.records == []


def test_a_simulated_client_whose_next_send_is_exactly_the_duration_stops() -> None:
    think_s = 0.05

    def run(count: int, duration_s: float | None) -> RunOutcome:
        plan = LoadPlan(
            requests=iter(specs(count, 0.0)), mode="closed", concurrency=1, think_time_s=think_s, duration_s=duration_s
        )
        return asyncio.run(SimBackend(tiny_calibration(), KnobsSpec()).run(plan))

    first_end = run(1, None).records[0].end_s
    assert first_end is not None
    second_send = first_end + think_s

    assert sent_ids(run(5, second_send)) == [0]
    assert sent_ids(run(5, math.nextafter(second_send, math.inf))) == [0, 1]


@pytest.mark.parametrize("world", WORLDS)
async def test_requests_queued_for_a_slot_when_the_window_closes_are_not_sent(world: str) -> None:
    plan = LoadPlan(requests=iter(specs(3, 0.0)), concurrency=1, duration_s=0.1)  # the first takes ~0.2 s

    outcome = await serve(world, plan)

    statuses = {r.request_id: r.status for r in outcome.records}
    assert statuses == {0: Status.OK, 1: Status.NOT_SENT, 2: Status.NOT_SENT}
    assert all(r.sent_s is None and r.end_s is None for r in outcome.records if r.request_id > 0)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("cap", [None, 1])
async def test_max_requests_counts_the_requests_taken_from_the_plan(world: str, cap: int | None) -> None:
    plan = LoadPlan(requests=iter(specs(5, 0.01)), concurrency=cap, max_requests=2)

    outcome = await serve(world, plan)

    assert sorted(r.request_id for r in outcome.records) == [0, 1]


@pytest.mark.parametrize("world", WORLDS)
async def test_warmup_goes_by_the_scheduled_time_when_a_cap_delays_the_send(world: str) -> None:
    # Request 1 is due at 0.01 s, inside the 0.05 s warm-up, but waits for request 0's slot until ~0.2 s.
    plan = LoadPlan(requests=iter([*specs(2, 0.01), RequestSpec(2, 8, 3, arrival_s=0.3)]), concurrency=1, warmup_s=0.05)

    outcome = await serve(world, plan)

    records = sorted(outcome.records, key=lambda r: r.request_id)
    assert [r.warmup for r in records] == [True, True, False]
    assert records[1].sent_s is not None and records[1].sent_s > 0.05
