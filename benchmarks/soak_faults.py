"""The faults of the soak (benchmarks/soak.py): the seeded schedule, the upstream that carries them out, the
scripted mode that routes, holds and rejects by them, and the client that hangs up or reads slowly.

Everything listens and connects on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp
import numpy as np
from aiohttp import web

from core.controller_api import ControlledRequest, Policy, Release, ReplicaView, Verdict

HOST = "127.0.0.1"  # loopback only: the soak never listens or connects anywhere else
FAULT_HEADER = "x-soak-fault"
ID_HEADER = "x-soak-id"  # the upstream's own copy of the request id (the gateway drops x-request-id)
TOKENS = 8  # chunks per stream
TRICKLE_S = 0.03  # between chunks of a slow stream
SLOW_READ_S = 0.01  # the slow reader's pause between reads
HOLD_S = 0.1  # how long a `held` request waits before the scripted mode releases it
CLIENT_HANGUP_S = 0.5  # a client that gives up on a request held for good (`held_hangup`) does so after this
UPSTREAM_TIMEOUT_S = 3.0  # the gateway's per-request upstream deadline (a hanging upstream ends here)
CLIENT_TIMEOUT_S = 10.0  # the client's own deadline per request (never reached when the gateway is right)

# name: (weight, the gateway's outcome for it). Weights are per 100 requests.
FAULTS: dict[str, tuple[int, str]] = {
    "none": (52, "completed"),
    "trickle": (4, "completed"),
    "slow_reader": (4, "completed"),
    "held": (3, "completed"),
    "die": (4, "failed"),
    "reset": (3, "failed"),
    "hang": (2, "failed"),
    "truncated": (3, "failed"),
    "malformed": (3, "failed"),
    "stream_error": (3, "failed"),
    "status_429": (2, "failed"),
    "status_500": (2, "failed"),
    "status_503": (2, "failed"),
    "refused": (3, "failed"),
    "rejected": (3, "rejected"),
    "hangup_early": (4, "failed"),
    "held_hangup": (2, "failed"),
    "deferred": (1, "deferred"),
}
UNTOUCHED = "none"  # the requests whose latency is compared with the fault-free run


# `soak.py --one-fault NAME` sets it, and the client's and upstream's processes inherit it: a schedule of half
# untouched requests and half that fault, to measure what one fault costs the gateway (docs/gateway.md).
ONE_FAULT_ENV = "SOAK_ONE_FAULT"


def draw_faults(count: int, seed: int, faulty: bool) -> list[str]:
    """The seeded schedule: one fault per request (all `none` for the fault-free run; half `none`, half the one
    fault when ONE_FAULT_ENV names one)."""
    if not faulty:
        return [UNTOUCHED] * count
    one = os.environ.get(ONE_FAULT_ENV)
    names = [UNTOUCHED, one] if one else list(FAULTS)
    weights = np.ones(2) if one else np.array([FAULTS[name][0] for name in names], dtype=float)
    rng = np.random.default_rng(seed)
    return [names[i] for i in rng.choice(len(names), size=count, p=weights / weights.sum())]


def arrival_gaps(count: int, rate: float, seed: int) -> np.ndarray:
    """The seeded open-loop arrivals: Poisson at `rate` per second (the same for the fault-free run)."""
    return np.random.default_rng(seed + 1).exponential(1.0 / rate, size=count)


# ---------------------------------------------------------------- the scripted mode


class ScriptedFaults(Policy):
    """Routes, holds and rejects by the fault each request carries (its task): `refused` goes to replica 1
    (nothing listens there), `rejected` is rejected, `held` is held for HOLD_S, `held_hangup` until its client
    gives up and `deferred` until the load ends; everything else goes to replica 0 at once.

    Every call costs O(log held), not O(held): the gateway asks `release()` and `next_wakeup()` after every
    arrival and completion, and the `deferred` and `held_hangup` requests (3 in 100) stay held for the whole
    run (the gateway tells a mode of a held request whose client hung up only when the mode releases it), so
    a scan of them all grew with the run (about 3,000 held at 100,000 requests, 90 us per pump here) and was
    counted as the gateway's own work (docs/gateway.md, "What a faulty request costs the gateway")."""

    name = "soak-script"
    passthrough = False

    def __init__(self) -> None:
        self.held: dict[int, ControlledRequest] = {}
        # (due time, request id) of the `held` requests, earliest first; an entry whose request has left
        # `held` (its client hung up) is dropped when it reaches the top.
        self._due: list[tuple[float, int]] = []

    def on_arrival(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> Verdict:
        task = req.spec.task
        if task == "rejected":
            return Verdict.reject("scripted rejection")
        if task in ("held", "held_hangup", "deferred"):
            self.held[req.request_id] = req
            if task == "held":
                heapq.heappush(self._due, (req.arrival_s + HOLD_S, req.request_id))
            return Verdict.hold()
        return Verdict.release(1 if task == "refused" else 0)

    def release(self, now: float, replicas: Sequence[ReplicaView]) -> list[Release]:
        due: list[Release] = []
        while self._due and self._due[0][0] <= now:
            request = self.held.pop(heapq.heappop(self._due)[1], None)
            if request is not None:
                due.append(Release(request, 0))
        return due

    def on_finish(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> None:
        self.held.pop(req.request_id, None)  # a held request whose client hung up

    def next_wakeup(self, now: float) -> float:
        while self._due and self._due[0][1] not in self.held:
            heapq.heappop(self._due)
        return self._due[0][0] if self._due else math.inf

    def drain(self) -> list[ControlledRequest]:
        drained = list(self.held.values())
        self.held.clear()
        self._due.clear()
        return drained


# ---------------------------------------------------------------- the misbehaving upstream


def _event(payload: str) -> bytes:
    return f"data: {payload}\n\n".encode()


def _chunk(index: int, last: bool) -> bytes:
    choice = {"index": 0, "text": " tok", "finish_reason": "length" if last else None}
    usage = {"prompt_tokens": 4, "completion_tokens": index + 1, "total_tokens": index + 5}
    return _event(json.dumps({"id": "soak", "choices": [choice], "usage": usage}, separators=(",", ":")))


@dataclass
class Upstream:
    """An aiohttp server that carries out the fault named in each request's FAULT_HEADER, and reports its own
    time per request (receipt to last byte written) for the added-latency figure."""

    on_served: Callable[[int, float], None]  # (request index, seconds the upstream spent on it)
    port: int = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        start = time.perf_counter()
        await request.read()
        fault = request.headers.get(FAULT_HEADER, UNTOUCHED)
        soak_id = int(request.headers.get(ID_HEADER, "-1"))
        try:
            return await self._answer(request, fault)
        except ConnectionResetError:  # the gateway hung up first (it gave up on a slow stream): nothing to send
            return web.Response()
        finally:
            self.on_served(soak_id, time.perf_counter() - start)

    async def _answer(self, request: web.Request, fault: str) -> web.StreamResponse:
        if fault.startswith("status_"):
            status = int(fault.removeprefix("status_"))
            return web.json_response({"error": {"message": f"scripted {status}", "code": status}}, status=status)
        if fault == "reset":
            assert request.transport is not None
            request.transport.abort()  # the connection drops before any answer
            return web.Response()
        if fault == "hang":
            await asyncio.sleep(3600)  # cancelled when the gateway gives up and closes the connection
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(TOKENS):
            if fault == "die" and index == TOKENS // 2:
                assert request.transport is not None
                request.transport.abort()
                return response
            if fault == "truncated" and index == TOKENS // 2:
                await response.write_eof()  # ends cleanly, without a finish_reason or [DONE]
                return response
            if fault == "malformed" and index == TOKENS // 2:
                await response.write(b'data: {"choices": [{"text": "unterminated\n\ndata: \xff\xfe\n\n')
                await response.write_eof()
                return response
            if fault == "stream_error" and index == TOKENS // 2:
                await response.write(_event(json.dumps({"error": {"message": "scripted engine error"}})))
                await response.write_eof()
                return response
            if fault == "hangup_early" and index:
                # The client hangs up after the first chunk: the rest never comes (the handler is cancelled when
                # the gateway closes the connection), so the hang-up is mid-stream however late the client's
                # process gets to it (with a trickle, a client stalled past the stream's end saw it complete).
                await asyncio.sleep(3600)
            if fault in ("trickle", "slow_reader") and index:
                await asyncio.sleep(TRICKLE_S if fault == "trickle" else 0)
            await response.write(_chunk(index, last=index == TOKENS - 1))
        await response.write_eof(_event("[DONE]"))
        return response


# ---------------------------------------------------------------- the client


@dataclass(slots=True)
class Sent:
    fault: str
    status: int | None = None  # HTTP status the client got; None: it hung up or could not connect
    e2e_s: float | None = None
    error: str | None = None


async def send_one(session: aiohttp.ClientSession, url: str, index: int, fault: str, wait_s: float) -> Sent:
    """One request with its fault; the client waits at most `wait_s` (CLIENT_HANGUP_S for `held_hangup`)."""
    body = {"model": "soak", "prompt": "soak", "max_tokens": TOKENS, "stream": True}
    headers = {"x-request-id": str(index), "x-task": fault, FAULT_HEADER: fault, ID_HEADER: str(index)}
    sent = Sent(fault)
    start = time.perf_counter()
    try:
        async with asyncio.timeout(CLIENT_HANGUP_S if fault == "held_hangup" else wait_s):
            async with session.post(url + "/v1/completions", json=body, headers=headers) as response:
                sent.status = response.status
                async for _ in response.content.iter_any():
                    if fault == "hangup_early":
                        break  # hang up after the first chunk: the context manager closes the connection
                    if fault == "slow_reader":
                        await asyncio.sleep(SLOW_READ_S)
        sent.e2e_s = time.perf_counter() - start
    except TimeoutError:
        sent.error = "client timeout"
    except aiohttp.ClientError as exc:
        sent.error = f"{type(exc).__name__}: {exc}"
    return sent
