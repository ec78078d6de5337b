"""What a faulty request costs the gateway (issue 25: requests no fault touched keep their fault-free latency).

A fault that leaves the upstream connection whole (an HTTP error status, a stream that ends without [DONE],
malformed or in-stream-error events, a slow reader or a trickle, a hold) must not cost a new upstream
connection: each new one is a connect, a handshake and a first write on the gateway's one loop. A fault that
breaks the connection costs exactly its replacement (a reset: also the one retry on a fresh connection,
StaleConnectionRetry). The scheduling wakeup is armed once per moment, not once per arrival and completion,
and the soak's scripted mode, which runs in the gateway's process, answers a pump without reading the requests
it holds for good. The faults are the soak's own (benchmarks/soak_faults.py), each carried out by its upstream.
The connection tests run on both event loops: uvloop's, which `slo-console gateway` serves on, and asyncio's.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from benchmarks.soak_faults import FAULTS, HOLD_S, HOST, ScriptedFaults, Upstream, send_one
from core.controller_api import ControlledRequest
from core.gateway.admission import AdmissionController
from core.gateway.server import Gateway
from core.gateway.standalone import run_on_gateway_loop
from core.records import RequestSpec

# The product's loop (uvloop where installed) and asyncio's own.
Runner = Callable[[Coroutine[Any, Any, Any]], Any]
LOOPS: dict[str, Runner] = {"gateway's": run_on_gateway_loop, "asyncio's": asyncio.run}
on_both_loops = pytest.mark.parametrize("run", LOOPS.values(), ids=LOOPS.keys())

# Faults whose upstream answer ends as HTTP allows a reuse of its connection (no `refused`: it goes to the
# dead port; no `rejected`/`deferred`/`held_hangup`: they never reach an upstream).
CONNECTION_KEEPING = [
    "status_429",
    "status_500",
    "status_503",
    "truncated",
    "malformed",
    "stream_error",
    "slow_reader",
    "trickle",
    "held",
]
# Faults that leave the connection broken (the upstream aborts it, or the gateway must close it mid-answer),
# and how many upstream connections each may open: its own, plus the one fresh retry of a reset.
CONNECTION_BREAKING = {"die": 1, "hang": 1, "hangup_early": 1, "reset": 2}


class _CountingUpstream(Upstream):
    """The soak's misbehaving upstream, recording each request's client port: one port per TCP connection the
    gateway opened (a port is not reused while its old connection lingers in TIME_WAIT)."""

    def __init__(self) -> None:
        super().__init__(on_served=lambda index, seconds: None)
        self.ports: list[int] = []

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        self.ports.append(request.transport.get_extra_info("peername")[1])
        return await super()._completions(request)

    def connections(self) -> int:
        return len(set(self.ports))


async def _through_gateway(faults: list[str], timeout_s: float = 0.5) -> tuple[_CountingUpstream, Gateway]:
    """Send `faults` one after the other (each after the previous ended) through a gateway over the counting
    upstream; the second upstream is a port where nothing listens, as in the soak."""
    upstream = _CountingUpstream()
    await upstream.start()
    gateway = Gateway(
        [upstream.url, f"http://{HOST}:9"], ScriptedFaults(), request_timeout_s=timeout_s, keep_decisions=False
    )
    await gateway.start()
    try:
        async with aiohttp.ClientSession() as session:
            for index, fault in enumerate(faults):
                sent = await send_one(session, gateway.base_url, index, fault, wait_s=10.0)
                assert sent.error is None or fault in ("hangup_early",), (fault, sent.error)
                await gateway.settle(timeout_s=5.0)  # its handler ended, its connection released or closed
        outcomes = gateway.stats.as_dict()
        assert outcomes["received"] == len(faults)
        assert outcomes["completed"] + outcomes["failed"] == len(faults)
    finally:
        await gateway.stop(grace_s=1.0)
        await upstream.stop()
    return upstream, gateway


@on_both_loops
def test_faults_that_end_their_answer_cleanly_keep_the_upstream_connection(run: Callable[..., Any]) -> None:
    async def scenario() -> None:
        faults = ["none"] + [fault for fault in CONNECTION_KEEPING for _ in range(3)] + ["none"]
        upstream, gateway = await _through_gateway(faults)
        assert len(upstream.ports) == len(faults)
        # One connection served them all, faults included (none of them is a reason to close it).
        assert upstream.connections() == 1, list(zip(faults, upstream.ports, strict=True))
        assert gateway.stats.failed == sum(FAULTS[fault][1] == "failed" for fault in faults)

    run(scenario())


@on_both_loops
def test_a_fault_that_breaks_the_connection_costs_its_replacement_and_no_more(run: Callable[..., Any]) -> None:
    async def scenario() -> None:
        for fault, allowed in CONNECTION_BREAKING.items():
            upstream, _ = await _through_gateway(["none", fault, "none", "none"])
            # The first request's connection, then what the fault may open; the requests after it share one.
            opened = upstream.connections() - 1
            assert opened <= allowed, f"{fault}: {opened} upstream connections opened (at most {allowed})"
            assert upstream.ports[-1] == upstream.ports[-2], f"{fault}: the requests after it did not share one"

    run(scenario())


def _held(request_id: int, arrival_s: float) -> ControlledRequest:
    spec = RequestSpec(request_id, 4, 8, arrival_s=arrival_s, task="held")
    return ControlledRequest(spec, arrival_s=arrival_s)


def test_the_wakeup_timer_is_armed_once_per_moment_not_once_per_pump() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        controller = AdmissionController(["http://127.0.0.1:9"], ScriptedFaults())
        armed: list[float] = []  # the delays of the timers the controller armed
        call_later = loop.call_later

        def counting_call_later(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
            if getattr(callback, "__self__", None) is controller:
                armed.append(delay)
            return call_later(delay, callback, *args)

        loop.call_later = counting_call_later  # type: ignore[method-assign]
        arrival = controller.now()
        # Twenty requests arriving at one moment are due at one moment: each arrival pumps, one timer serves.
        waits = [asyncio.ensure_future(controller.admit(_held(i, arrival), None)) for i in range(20)]
        await asyncio.sleep(0)
        assert len(armed) == 1 and controller.stats.held == 20
        results = await asyncio.wait_for(asyncio.gather(*waits), timeout=HOLD_S + 5.0)
        assert [action for action, _ in results] == ["release"] * 20
        assert controller.stats.held == 0 and controller.stats.in_flight == 20
        assert len(armed) == 1, armed  # it fired, and nothing was left to arm it for

    asyncio.run(scenario())


class _Unreadable:
    """A request spec that fails when read: the scripted mode must not read what it holds for good."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the scripted mode read .{name} of a request it holds until the end")


def test_the_scripted_mode_answers_a_pump_without_reading_what_it_holds_for_good() -> None:
    """The gateway pumps the mode twice per request; the soak's mode holds its `deferred` and `held_hangup`
    requests for the whole run (thousands at 100,000 requests), so it must not scan them on every pump."""
    policy = ScriptedFaults()
    forever = [_held(i, 0.0) for i in range(1000)]
    for request in forever:
        request.spec.task = "deferred"
        assert policy.on_arrival(request, 0.0, []).action == "hold"
        request.spec = _Unreadable()  # type: ignore[assignment]
    timed = [_held(1000 + i, arrival) for i, arrival in enumerate([0.3, 0.1, 0.2])]
    for request in timed:
        policy.on_arrival(request, request.arrival_s, [])
    policy.on_finish(timed[2], 0.25, [])  # its client hung up while it was held: never released
    assert policy.next_wakeup(0.0) == 0.1 + HOLD_S
    assert [r.request.request_id for r in policy.release(0.2 + HOLD_S, [])] == [1001]
    assert policy.next_wakeup(0.2 + HOLD_S) == 0.3 + HOLD_S
    assert [r.request.request_id for r in policy.release(0.3 + HOLD_S, [])] == [1000]
    assert policy.next_wakeup(1.0) == float("inf") and len(policy.held) == 1000
    assert len(policy.drain()) == 1000 and not policy.held


@on_both_loops
def test_a_failed_upstream_request_leaves_no_reference_cycle_to_the_garbage_collector(run: Callable[..., Any]) -> None:
    """aiohttp's error, its traceback and the frames in it form a cycle only the collector frees; each
    collection pauses the gateway's loop. The gateway unlinks a handled error from its traceback, so a
    refused connection (no transport made: nothing else can cycle) leaves nothing behind."""

    async def scenario() -> int:
        upstream = _CountingUpstream()
        await upstream.start()
        gateway = Gateway([upstream.url, f"http://{HOST}:9"], ScriptedFaults(), keep_decisions=False)
        await gateway.start()
        try:
            async with aiohttp.ClientSession() as session:
                await send_one(session, gateway.base_url, 0, "refused", wait_s=10.0)  # warm: imports, caches
                gc.collect()
                gc.disable()
                for index in range(1, 21):
                    sent = await send_one(session, gateway.base_url, index, "refused", wait_s=10.0)
                    assert sent.status == 502
                cyclic = gc.collect()
        finally:
            gc.enable()
            await gateway.stop(grace_s=1.0)
            await upstream.stop()
        assert gateway.stats.failed == 21
        return cyclic

    cyclic = run(scenario())
    print(f"objects in reference cycles after 20 refused requests: {cyclic}")
    assert cyclic < 20, f"{cyclic} objects in reference cycles after 20 refused requests"
