"""The live admission gateway: an OpenAI-compatible HTTP front that runs a scheduling mode in wall time.

Clients post /v1/completions or /v1/chat/completions here instead of to vLLM. Each request becomes a
`ControlledRequest` (task and SLO from the request, see core/control/gateway_protocol.py) and the mode's
`Policy` decides, as the simulator's controller does in virtual time:
- release: forwarded at once to that upstream; the answer streams back chunk by chunk;
- hold: the request waits in the policy's queues; `release()` is asked again after every arrival and
  completion and at `next_wakeup()`; a request still held when the gateway stops (or an embedded run ends)
  is answered 503 `deferred`;
- reject: answered 429 with the reason.
The gateway tracks what each upstream serves (ReplicaView.in_flight / load); it does not read the engine's
queue or KV use, so those are 0 in the view. Every request ends in exactly one counter: completed, rejected,
deferred or failed (`GatewayStats.accounted()`); GET /gateway/stats shows them, POST /gateway/policy swaps
the mode without touching the upstream servers, and every other path (/v1/models, /health, /metrics, ...)
is proxied to the first upstream.

HTTP is aiohttp's (server and client); nothing here parses HTTP by hand.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from core.control.gateway_protocol import (
    ERROR_DEFERRED,
    ERROR_INVALID,
    ERROR_REJECTED,
    ERROR_UPSTREAM,
    GATEWAY_HEADERS,
    BadGatewayRequest,
    SSETokenCounter,
    completion_tokens,
    error_body,
    read_request_meta,
)
from core.control.policy import ControlledRequest, Policy, Verdict
from core.events import EventSink, make_event
from core.profile import Profile, ProfileError
from core.records import RequestSpec

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
# Request headers not passed upstream: hop-by-hop ones, those aiohttp sets itself, and the gateway's own.
_DROP_HEADERS = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade"})
_DROP_HEADERS = _DROP_HEADERS | GATEWAY_HEADERS
# Response headers not copied back from the upstream (aiohttp computes framing itself).
_DROP_RESPONSE_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}
)

PolicyFactory = Callable[[str], Policy]


class GatewayError(RuntimeError):
    """The gateway cannot start (address in use, no upstream). The message is one line naming the fix."""


@dataclass(slots=True)
class GatewayStats:
    """Counters since the gateway started. Every received request ends in exactly one of the four outcomes;
    until then it is `held` (in the policy's queues) or `in_flight` (at an upstream)."""

    received: int = 0
    completed: int = 0
    rejected: int = 0
    deferred: int = 0
    failed: int = 0
    held: int = 0
    in_flight: int = 0
    policy_swaps: int = 0

    def accounted(self) -> bool:
        ended = self.completed + self.rejected + self.deferred + self.failed
        return ended + self.held + self.in_flight == self.received

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(slots=True)
class Decision:
    """How one request ended at the gateway (kept by the caller's request id, for an embedded run's records)."""

    outcome: str  # completed, rejected, deferred, failed
    reason: str | None = None
    tier: str | None = None
    replica: int | None = None
    arrival_s: float = 0.0  # gateway clock
    dispatched_s: float | None = None  # gateway clock


@dataclass(slots=True)
class Upstream:
    """One upstream server as the policy sees it (a `ReplicaView`)."""

    index: int
    url: str
    in_flight: dict[int, ControlledRequest] = field(default_factory=dict)
    served: int = 0

    @property
    def load(self) -> int:
        return len(self.in_flight)

    @property
    def engine_waiting(self) -> int:
        return 0  # the gateway does not poll the engine's queue

    @property
    def kv_usage(self) -> float:
        return 0.0


@dataclass(slots=True)
class _Held:
    request: ControlledRequest
    waiter: asyncio.Future[tuple[str, Any]]
    client_request_id: str | None


class Gateway:
    """Run `policy` in front of `upstreams` (base URLs). `start()` binds host:port (0 = any free port)."""

    def __init__(
        self,
        upstreams: Sequence[str],
        policy: Policy,
        *,
        profile: Profile | None = None,
        policy_factory: PolicyFactory | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        on_event: EventSink | None = None,
        request_timeout_s: float = 600.0,
    ) -> None:
        if not upstreams:
            raise GatewayError("the gateway needs at least one upstream URL (--upstream http://HOST:PORT)")
        self.upstreams = [Upstream(i, url.rstrip("/")) for i, url in enumerate(upstreams)]
        self.policy = policy
        self.profile = profile
        self.policy_factory = policy_factory
        self.host = host
        self.port = port
        self.on_event = on_event
        self.request_timeout_s = request_timeout_s
        self.stats = GatewayStats()
        self.decisions: dict[str, Decision] = {}  # by the caller's request id, when it sent one
        # After `end_arrivals()` (an embedded run's load has been sent) nothing is held any more: a hold
        # verdict is answered `deferred` at once, as the simulator defers what is still held at the end.
        self.arrivals_ended = False
        self._held: dict[int, _Held] = {}
        self._next_id = 0
        self._clock_zero = time.perf_counter()
        self._timer: asyncio.TimerHandle | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None  # no pooling: for the one retry of a stale connection
        self._handlers: set[asyncio.Task[Any]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop it serves on (set by start)

    # ------------------------------------------------------------------ lifecycle

    def now(self) -> float:
        return time.perf_counter() - self._clock_zero

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        """Bind and serve; returns the base URL. Raises GatewayError (one line) when the port is taken."""
        self.loop = asyncio.get_running_loop()
        self._session = aiohttp.ClientSession(
            # Idle upstream connections are dropped before uvicorn's 5 s keep-alive timeout closes them.
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=3.0),
            timeout=aiohttp.ClientTimeout(total=self.request_timeout_s, connect=10.0),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/gateway/stats", self._stats_endpoint)
        app.router.add_get("/gateway/policy", self._policy_get)
        app.router.add_post("/gateway/policy", self._policy_post)
        for path in COMPLETION_PATHS:
            app.router.add_post(path, self._completion)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        # A client that hangs up cancels its handler: a held request leaves the queue, a forwarded one is
        # aborted upstream (the closed upstream connection makes vLLM abort it).
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            await self._session.close()
            raise GatewayError(
                f"cannot listen on {self.host}:{self.port} ({exc.strerror or exc}); choose another --port"
            ) from None
        server = site._server  # the bound socket tells the port when 0 was asked for
        if server is not None and getattr(server, "sockets", None):
            self.port = server.sockets[0].getsockname()[1]
        self._clock_zero = time.perf_counter()
        self._emit(
            "gateway_started",
            url=self.base_url,
            upstreams=[u.url for u in self.upstreams],
            mode=self.policy.name,
        )
        return self.base_url

    async def stop(self, grace_s: float = 30.0) -> None:
        """Defer what is held, let forwarded requests finish (up to `grace_s`), then close."""
        self.end_arrivals()
        deadline = time.perf_counter() + grace_s
        while self.stats.in_flight and time.perf_counter() < deadline:
            await asyncio.sleep(0.02)
        if self._timer is not None:
            self._timer.cancel()
        if self._runner is not None:
            await self._runner.cleanup()  # cancels handlers still running (they count as failed)
            self._runner = None
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None
        self._emit("gateway_stopped", mode=self.policy.name, **self.stats.as_dict())

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ the controller

    def end_arrivals(self) -> int:
        """The load is over: answer every held request `deferred` (and any later hold too). Returns how many."""
        self.arrivals_ended = True
        return self._defer_held("held when the run ended; never served")

    def swap_policy(self, policy: Policy) -> None:
        """Run `policy` from now on. Held requests are offered to it again with their original arrival
        times (their deadlines stand); requests already at an upstream finish there and stay in its load."""
        old = self.policy
        carried = [r for r in old.drain() if r.request_id in self._held]
        self.policy = policy
        self.stats.policy_swaps += 1
        now = self.now()
        for request in carried:
            self._apply(request, self.policy.on_arrival(request, now, self.upstreams), now)
        settings = policy.describe()
        self._emit("gateway_mode", mode=policy.name, previous=old.name, carried=len(carried), settings=settings)
        self._pump()

    def swap_mode(self, name: str) -> Policy:
        """Build mode `name` with the policy factory and swap to it. Raises ProfileError for an unknown mode."""
        if self.policy_factory is None:
            raise ProfileError("this gateway was started without a mode registry; it cannot change mode")
        policy = self.policy_factory(name)
        self.swap_policy(policy)
        return policy

    def _apply(self, request: ControlledRequest, verdict: Verdict, now: float) -> None:
        """Carry out a verdict for a request that is already held (waiting on its future)."""
        held = self._held[request.request_id]
        if verdict.action == "release":
            assert verdict.replica is not None
            self._dispatch(request, verdict.replica, verdict.tier, now)
            self._resolve(held, ("release", verdict.replica))
        elif verdict.action == "reject":
            self._resolve(held, ("reject", verdict.reason or "rejected by the scheduling mode"))
        else:
            request.tier = verdict.tier
            if self.arrivals_ended:
                self._resolve(held, ("defer", "held when the run ended; never served"))

    def _resolve(self, held: _Held, result: tuple[str, Any]) -> None:
        self._held.pop(held.request.request_id, None)
        self.stats.held -= 1
        if not held.waiter.done():
            held.waiter.set_result(result)

    def _dispatch(self, request: ControlledRequest, replica: int, tier: str, now: float) -> None:
        request.replica = replica
        request.tier = tier
        request.dispatched_s = now
        self.upstreams[replica].in_flight[request.request_id] = request
        self.stats.in_flight += 1

    def _pump(self) -> None:
        """Ask the policy what to release now, and when to ask again."""
        now = self.now()
        for release in self.policy.release(now, self.upstreams):
            held = self._held.get(release.request.request_id)
            if held is None:  # its client hung up while it waited: it never reaches an upstream
                self.policy.on_finish(release.request, now, self.upstreams)
                continue
            self._dispatch(release.request, release.replica, release.request.tier, now)
            self._resolve(held, ("release", release.replica))
        self._arm_timer(now)

    def _arm_timer(self, now: float) -> None:
        wakeup = self.policy.next_wakeup(now)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if math.isfinite(wakeup) and self._held:
            self._timer = asyncio.get_running_loop().call_later(max(0.0, wakeup - now), self._pump)

    def _defer_held(self, reason: str) -> int:
        drained = self.policy.drain()
        drained_ids = {r.request_id for r in drained}
        # Whatever the policy did not return is deferred too: no request may stay unanswered.
        leftovers = [h.request for h in self._held.values() if h.request.request_id not in drained_ids]
        count = 0
        for request in [*drained, *leftovers]:
            held = self._held.get(request.request_id)
            if held is not None:
                self._resolve(held, ("defer", reason))
                count += 1
        return count

    def _finish(self, request: ControlledRequest, outcome: str, reason: str | None, client_id: str | None) -> None:
        now = self.now()
        if request.replica is not None and request.request_id in self.upstreams[request.replica].in_flight:
            upstream = self.upstreams[request.replica]
            del upstream.in_flight[request.request_id]
            upstream.served += 1
            self.stats.in_flight -= 1
            self.policy.on_finish(request, now, self.upstreams)
        setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
        if client_id is not None:
            self.decisions[client_id] = Decision(
                outcome, reason, request.tier, request.replica, request.arrival_s, request.dispatched_s
            )
        if self.on_event is not None:
            self._emit(
                "gateway_request",
                id=client_id,
                task=request.spec.task,
                outcome=outcome,
                reason=reason,
                tier=request.tier,
                replica=request.replica,
                queued_s=None if request.dispatched_s is None else request.dispatched_s - request.arrival_s,
                e2e_s=now - request.arrival_s,
                tokens_out=request.tokens_out,
            )
        self._pump()

    def _emit(self, name: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event(make_event(name, **fields))

    # ------------------------------------------------------------------ HTTP: completions

    async def _completion(self, http_request: web.Request) -> web.StreamResponse:
        self.stats.received += 1
        try:
            body = json.loads(await http_request.read())
            if not isinstance(body, dict):
                raise BadGatewayRequest("the body must be a JSON object")
            meta = read_request_meta(http_request.headers, body, self.profile)
        except (ValueError, BadGatewayRequest) as exc:
            self.stats.failed += 1
            return web.json_response(error_body(ERROR_INVALID, f"cannot read the request: {exc}", 400), status=400)
        now = self.now()
        spec = RequestSpec(self._next_id, meta.prompt_tokens, meta.max_tokens, arrival_s=now, task=meta.task)
        spec.slo = meta.slo
        self._next_id += 1
        request = ControlledRequest(spec, arrival_s=now)
        client_id = meta.client_request_id
        verdict = self.policy.on_arrival(request, now, self.upstreams)
        if verdict.action == "reject":
            reason = verdict.reason or "rejected by the scheduling mode"
            self._finish(request, "rejected", reason, client_id)
            return web.json_response(error_body(ERROR_REJECTED, reason, 429), status=429)
        if verdict.action == "release":
            assert verdict.replica is not None
            self._dispatch(request, verdict.replica, verdict.tier, now)
            self._pump()
        else:
            request.tier = verdict.tier
            waiter: asyncio.Future[tuple[str, Any]] = asyncio.get_running_loop().create_future()
            held = _Held(request, waiter, client_id)
            self._held[request.request_id] = held
            self.stats.held += 1
            if self.arrivals_ended:
                self._resolve(held, ("defer", "arrived after the run ended; never served"))
            else:
                self._pump()
            try:
                action, detail = await waiter
            except asyncio.CancelledError:
                if self._held.pop(request.request_id, None) is not None:
                    self.stats.held -= 1
                self._finish(request, "failed", "client disconnected while held", client_id)
                raise
            if action == "reject":
                self._finish(request, "rejected", detail, client_id)
                return web.json_response(error_body(ERROR_REJECTED, detail, 429), status=429)
            if action == "defer":
                self._finish(request, "deferred", detail, client_id)
                return web.json_response(error_body(ERROR_DEFERRED, detail, 503), status=503)
        return await self._forward(http_request, request, body, meta.stream, client_id)

    async def _forward(
        self,
        http_request: web.Request,
        request: ControlledRequest,
        body: dict[str, Any],
        stream: bool,
        client_id: str | None,
    ) -> web.StreamResponse:
        assert self._session is not None and request.replica is not None
        priority = self.policy.upstream_priority(request)
        if priority is not None:
            body = {**body, "priority": priority}
        url = self.upstreams[request.replica].url + http_request.path_qs
        headers = {k: v for k, v in http_request.headers.items() if k.lower() not in _DROP_HEADERS}
        headers["Content-Type"] = "application/json"
        outcome, reason = "failed", "client disconnected"
        response: web.StreamResponse | None = None
        try:
            upstream = await self._post_upstream(url, json.dumps(body).encode(), headers)
            try:
                if stream and upstream.status == 200:
                    response = web.StreamResponse(status=200, headers=_response_headers(upstream))
                    await response.prepare(http_request)
                    counter = SSETokenCounter()
                    async for chunk in upstream.content.iter_any():
                        counter.feed(chunk)
                        request.tokens_out = counter.tokens
                        await response.write(chunk)
                        if counter.finished and counter.error is None:
                            # Delivered: a client that hangs up after the last event lost nothing.
                            outcome, reason = "completed", None
                    if counter.error is not None:
                        outcome, reason = "failed", f"upstream error in stream: {counter.error}"
                    elif not counter.finished:
                        outcome, reason = "failed", "upstream stream ended before [DONE] or a finish_reason"
                    await response.write_eof()
                    return response
                data = await upstream.read()
            finally:
                upstream.release()
            if upstream.status < 400:
                request.tokens_out = completion_tokens(data)
                outcome, reason = "completed", None
            else:
                outcome, reason = "failed", f"upstream answered HTTP {upstream.status}"
            return web.Response(status=upstream.status, body=data, headers=_response_headers(upstream))
        except (aiohttp.ClientError, TimeoutError) as exc:
            outcome, reason = "failed", f"upstream {self.upstreams[request.replica].url}: {type(exc).__name__}: {exc}"
            if response is not None:  # the stream broke after it began: the client sees it end early
                return response
            return web.json_response(error_body(ERROR_UPSTREAM, reason, 502), status=502)
        except (ConnectionResetError, asyncio.CancelledError):
            if outcome != "completed":
                outcome, reason = "failed", "client disconnected during the response"
            raise
        finally:
            self._finish(request, outcome, reason, client_id)

    async def _post_upstream(self, url: str, data: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """POST and wait for the status line. A pooled keep-alive connection that the server closed just as it
        was reused fails before the server read the request; that one case is retried once on a fresh
        connection (nothing was processed, so nothing runs twice)."""
        assert self._session is not None
        try:
            return await self._session.post(url, data=data, headers=headers)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if self._fresh is None:
                self._fresh = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0, force_close=True),
                    timeout=self._session.timeout,
                    auto_decompress=False,
                )
            return await self._fresh.post(url, data=data, headers=headers)

    # ------------------------------------------------------------------ HTTP: control and proxy

    async def _stats_endpoint(self, _: web.Request) -> web.Response:
        return web.json_response(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        return {
            "mode": self.policy.name,
            **self.stats.as_dict(),
            "accounted": self.stats.accounted(),
            "upstreams": [{"url": u.url, "load": u.load, "served": u.served} for u in self.upstreams],
        }

    async def _policy_get(self, _: web.Request) -> web.Response:
        return web.json_response(self.policy.describe())

    async def _policy_post(self, http_request: web.Request) -> web.Response:
        try:
            body = await http_request.json()
            name = body["mode"]
            if not isinstance(name, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return web.json_response(
                error_body(ERROR_INVALID, 'post {"mode": "NAME"} to change the scheduling mode', 400), status=400
            )
        try:
            policy = self.swap_mode(name)
        except ProfileError as exc:
            return web.json_response(error_body(ERROR_INVALID, str(exc), 400), status=400)
        return web.json_response(policy.describe())

    async def _proxy(self, http_request: web.Request) -> web.StreamResponse:
        """Any other path goes to the first upstream as it is (models, health, metrics, tokenize, ...)."""
        assert self._session is not None
        url = self.upstreams[0].url + http_request.path_qs
        headers = {k: v for k, v in http_request.headers.items() if k.lower() not in _DROP_HEADERS}
        data = await http_request.read()
        try:
            async with self._session.request(http_request.method, url, data=data or None, headers=headers) as upstream:
                payload = await upstream.read()
                return web.Response(status=upstream.status, body=payload, headers=_response_headers(upstream))
        except (aiohttp.ClientError, TimeoutError) as exc:
            message = f"upstream {self.upstreams[0].url}: {type(exc).__name__}: {exc}"
            return web.json_response(error_body(ERROR_UPSTREAM, message, 502), status=502)


def _response_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE_HEADERS}


async def probe_upstreams(urls: Sequence[str], timeout_s: float = 5.0) -> list[str]:
    """One line per upstream that does not answer GET /v1/models with 200 (empty: all reachable)."""
    problems: list[str] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        for url in urls:
            try:
                async with session.get(url.rstrip("/") + "/v1/models") as response:
                    if response.status != 200:
                        problems.append(f"{url}: GET /v1/models answered HTTP {response.status}")
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                problems.append(f"{url}: {type(exc).__name__}: {exc or 'no answer'}")
    return problems


def policy_factory_for(profile: Profile, replicas: int) -> PolicyFactory:
    """Build modes by name from the registry (core/control/modes.py) for this profile and upstream count."""
    from core.control.modes import ModeContext, make_policy
    from core.profile import load_calibration

    context = ModeContext(profile=profile, calibration=load_calibration(profile), replicas=replicas, seed=profile.seed)
    return lambda name: make_policy(name, context)
