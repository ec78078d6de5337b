"""Drain-and-restart replica swaps (core/backends/launched_replicas.py, issue 23 item 2): where two servers do not
fit (GPU memory, `one_at_a_time`, or a second server's start failed for lack of memory), a swap pauses the
gateway (arrivals held there, in order), drains and stops the old server, starts the new one and resumes.
Over scripted servers under steady load from closed-loop clients: no request dropped, failed or reordered,
the account closed at every audit, and the pause counted in the events."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from core.backends.launched_replicas import DRAIN_AND_RESTART, out_of_memory
from core.control.concurrency_cap import ConcurrencyCapPolicy
from core.gateway.server import Gateway
from core.profile import KnobsSpec
from core.serve.process import ServerStartError
from core.tune.knobspace import Point
from core.tune.online import OnlineTuner
from core.tune.online_space import online_space
from tests.fakeserver import FakeLaunchedReplicas, StreamReply
from tests.test_gateway import assert_accounted, completion, post
from tests.test_gateway_tune_endpoints import QUICK, quick_profile
from tests.test_online_tune import _drive

START_S = 0.3  # a scripted server's start-up: the pause must last at least this long
CLIENTS = 4


class OneGpuReplicas(FakeLaunchedReplicas):
    """Scripted servers that take START_S to start; with `fits_one`, a second one beside a running one fails as
    vLLM does when the GPU has no room for it."""

    def __init__(self, profile: Any, *, fits_one: bool = False, one_at_a_time: bool = False) -> None:
        super().__init__(profile, StreamReply(first_delay_s=0.02, chunk_delay_s=0.01))
        self.one_at_a_time = one_at_a_time
        self.drain_timeout_s = 5.0  # a drain that never ends (arrivals not held) fails the test, not hangs it
        self.fits_one = fits_one
        self.events: list[dict[str, Any]] = []
        self.sink = self.events.append
        self.out_of_memory_starts = 0

    async def _start(self, knobs: KnobsSpec, slot: int) -> Any:
        await asyncio.sleep(START_S)
        if self.fits_one and self.servers:
            self.out_of_memory_starts += 1
            tail = ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
            raise ServerStartError("vllm exited with code 1 during start-up", tail, None, 1)
        return await super()._start(knobs, slot)


async def swap_under_load(replicas: OneGpuReplicas, swaps: list[int]) -> dict[str, Any]:
    """Closed-loop clients send numbered requests through a gateway (cap 2) in front of `replicas` while it swaps
    to each max_num_seqs of `swaps`; an audit checks the account every 2 ms. Returns what the test checks."""
    first = await replicas.start_first()
    dispatched: list[tuple[int, float, int]] = []  # (request id, arrival, upstream) in dispatch order
    statuses: list[int] = []
    audits = {"runs": 0, "open": 0, "paused_dispatches": 0}
    try:
        async with Gateway([first], ConcurrencyCapPolicy(2)) as gateway, aiohttp.ClientSession() as session:
            dispatch = gateway._dispatch

            def logged(request: Any, replica: int, tier: str, now: float) -> None:
                if gateway.paused:
                    audits["paused_dispatches"] += 1
                dispatched.append((request.request_id, request.arrival_s, replica))
                dispatch(request, replica, tier, now)

            gateway._dispatch = logged  # type: ignore[method-assign]
            done = asyncio.Event()

            async def client() -> None:
                while not done.is_set():
                    statuses.append((await post(session, gateway.base_url, completion(max_tokens=3)))[0])

            async def audit() -> None:
                while not done.is_set():
                    assert gateway.stats.accounted(), gateway.stats
                    audits["runs"] += 1
                    audits["open"] = max(audits["open"], gateway.stats.open())
                    await asyncio.sleep(0.002)

            tasks = [asyncio.create_task(client()) for _ in range(CLIENTS)] + [asyncio.create_task(audit())]
            await asyncio.sleep(0.3)
            for max_num_seqs in swaps:
                knobs = replicas.current_knobs(gateway).model_copy(update={"max_num_seqs": max_num_seqs})
                await replicas.swap_knobs(gateway, knobs)
                await asyncio.sleep(0.2)
            done.set()
            await asyncio.gather(*tasks)
            await gateway.settle(10.0)
            assert_accounted(gateway, len(statuses))
            return {
                "stats": gateway.stats.as_dict(),
                "upstreams": [(u.served, u.retired, u.load) for u in gateway.upstreams],
                "dispatched": dispatched,
                "statuses": statuses,
                "audits": audits,
            }
    finally:
        await replicas.close()


def check_served_in_order_and_nothing_lost(last: dict[str, Any]) -> None:
    stats = last["stats"]
    assert last["statuses"] and set(last["statuses"]) == {200}  # nothing rejected, failed or dropped
    assert stats["failed"] == 0 and stats["rejected"] == 0 and stats["deferred"] == 0
    assert stats["completed"] == len(last["statuses"])
    assert last["audits"]["runs"] > 50 and last["audits"]["paused_dispatches"] == 0
    arrivals = [arrival for _, arrival, _ in last["dispatched"]]
    assert arrivals == sorted(arrivals)  # fcfs behind the cap: released in arrival order, across the pause
    assert len({rid for rid, _, _ in last["dispatched"]}) == len(last["dispatched"]) == stats["completed"]


def test_a_drain_and_restart_swap_holds_arrivals_at_the_gateway_and_loses_or_reorders_none() -> None:
    replicas = OneGpuReplicas(quick_profile(), one_at_a_time=True)
    result = asyncio.run(swap_under_load(replicas, [12, 16]))
    check_served_in_order_and_nothing_lost(result)
    swaps = [e for e in replicas.events if e["event"] == "replica_swap"]
    assert [e["how"] for e in swaps] == [DRAIN_AND_RESTART] * 2 and replicas.swaps == 2
    assert all(e["paused_s"] >= START_S and e["held"] >= 1 and e["cut_in_flight"] == 0 for e in swaps)
    # One server at a time: each starts on the cores the stopped one used, and each stopped before the next.
    assert [k.max_num_seqs for k in replicas.started] == [8, 12, 16] and replicas.started_slots == [0, 0, 0]
    assert [(retired, load) for _, retired, load in result["upstreams"]] == [(True, 0), (True, 0), (False, 0)]
    # Nothing reached a stopped server: each served only what was dispatched to it.
    served = [sum(1 for _, _, up in result["dispatched"] if up == index) for index in range(3)]
    assert served == [s for s, _, _ in result["upstreams"]] and all(served)


def test_a_second_server_that_does_not_fit_turns_swaps_into_drain_and_restart() -> None:
    replicas = OneGpuReplicas(quick_profile(), fits_one=True)
    result = asyncio.run(swap_under_load(replicas, [12, 4]))
    check_served_in_order_and_nothing_lost(result)
    names = [e["event"] for e in replicas.events]
    assert names.count("replica_one_at_a_time") == 1 and replicas.one_at_a_time
    assert replicas.out_of_memory_starts == 1  # the second swap went straight to drain-and-restart
    swaps = [e for e in replicas.events if e["event"] == "replica_swap"]
    assert [(e["how"], e["max_num_seqs"]) for e in swaps] == [(DRAIN_AND_RESTART, 12), (DRAIN_AND_RESTART, 4)]
    assert all(e["paused_s"] >= START_S for e in swaps)


def test_out_of_memory_is_read_from_the_error_or_its_log() -> None:
    assert out_of_memory(ServerStartError("exited", ["ValueError: No available memory for the cache blocks."], None))
    assert out_of_memory(RuntimeError("CUDA out of memory"))
    assert not out_of_memory(ServerStartError("not ready after 300 s", ["INFO: loading weights"], None))


def test_the_next_tune_step_event_carries_the_pause_and_the_held_arrivals() -> None:
    profile = quick_profile()
    events: list[dict[str, Any]] = []
    space = online_space(profile, server_flags=True)
    start = space.point(Point(4, 8, 0, False), "fcfs")
    tuner = OnlineTuner(space, start, profile, QUICK, sink=events.append)
    tuner.begin(0.0)
    _drive(tuner, {2: 2.0, 4: 2.0, 6: 2.0}, seconds=3)  # one window at the incumbent: a trial is in force
    assert tuner.current != start and not events
    tuner.note_pause(0.5, 3)  # its swap held arrivals twice (there and back)
    tuner.note_pause(0.25, 2)
    assert tuner.trial_failed(3.0, "no server") == start
    assert events[-1]["paused_s"] == 0.75 and events[-1]["held"] == 5
    _drive(tuner, {2: 2.0, 4: 2.0, 6: 2.0}, seconds=3)
    tuner.trial_failed(7.0, "no server")
    assert events[-1]["paused_s"] == 0.0 and events[-1]["held"] == 0  # counted once, in the step after the pause
