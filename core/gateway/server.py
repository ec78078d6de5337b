"""The live admission gateway: an OpenAI-compatible HTTP front that runs a scheduling mode in wall time.

Clients post /v1/completions or /v1/chat/completions here instead of to vLLM. Each request becomes a
`ControlledRequest` (task and SLO from the request, see core/gateway/protocol.py) and the mode's
`Policy` decides what happens to it (core/gateway/admission.py):
- release: forwarded at once to that upstream; the answer streams back chunk by chunk;
- hold: the request waits in the policy's queues; a request still held when the gateway stops (or an
  embedded run ends) is answered 503 `deferred`;
- reject: answered 429 with the reason.
Every request ends in exactly one counter: completed, rejected, deferred or failed; GET /gateway/stats shows
them, POST /gateway/policy swaps the mode without touching the upstream servers, GET /gateway/tune shows the
online tuner's steps (with --tune), POST /gateway/swap replaces the server with one started with other flags
(with --launch), and every other path (/v1/models, /health, /metrics, ...) is proxied to the first upstream.

HTTP is aiohttp's (server and client); nothing here parses HTTP by hand.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from core.backend_api import BackendUnavailable
from core.controller_api import ControlledRequest, Policy
from core.events import Event, EventSink
from core.gateway.admission import AdmissionController, PolicyFactory
from core.gateway.protocol import (
    ERROR_DEFERRED,
    ERROR_INVALID,
    ERROR_REJECTED,
    ERROR_UPSTREAM,
    SLO_BODY_FIELD,
    BadGatewayRequest,
    SSETokenCounter,
    completion_tokens,
    error_body,
    read_request_meta,
    sent_before_s,
)
from core.gateway.upstream import UpstreamClient, drop_tracebacks, request_headers, response_headers
from core.profile import Profile, ProfileError
from core.records import RequestSpec

COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")


class GatewayError(RuntimeError):
    """The gateway cannot start (address in use, no upstream). The message is one line naming the fix."""


class SwapRefused(RuntimeError):
    """A replica swap cannot run now (another is under way). The message is one line."""


# Set by what sits above the gateway (core/tune/online_gateway.py, core/backends/launched_replicas.py):
TuneFeed = Callable[[int], Event]  # GET /gateway/tune?since=N: the online tuner's core.events.online_tune_feed
# POST /gateway/swap: start a server with these knobs changed, route to it, drain and stop the old one; returns
# the knobs in force. Raises ProfileError (bad knobs), SwapRefused, or BackendUnavailable (it did not start).
ReplicaSwap = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class Gateway(AdmissionController):
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
        request_events: bool = True,
        request_timeout_s: float = 600.0,
        keep_decisions: bool = True,
    ) -> None:
        if not upstreams:
            raise GatewayError("the gateway needs at least one upstream URL (--upstream http://HOST:PORT)")
        super().__init__(
            upstreams,
            policy,
            profile=profile,
            policy_factory=policy_factory,
            on_event=on_event,
            request_events=request_events,
            keep_decisions=keep_decisions,
        )
        self.host = host
        self.port = port
        self.request_timeout_s = request_timeout_s
        self._next_id = 0
        self._runner: web.AppRunner | None = None
        self._client: UpstreamClient | None = None
        self.loop: asyncio.AbstractEventLoop | None = None  # the loop it serves on (set by start)
        self.tune_feed: TuneFeed | None = None  # set while an online tuner runs (--tune)
        self.replica_swap: ReplicaSwap | None = None  # set when the gateway launched its servers (--launch)

    # ------------------------------------------------------------------ lifecycle

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        """Bind and serve; returns the base URL. Raises GatewayError (one line) when the port is taken."""
        self.loop = asyncio.get_running_loop()
        self._client = UpstreamClient(self.request_timeout_s)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/gateway/stats", self._stats_endpoint)
        app.router.add_get("/gateway/policy", self._policy_get)
        app.router.add_post("/gateway/policy", self._policy_post)
        app.router.add_get("/gateway/tune", self._tune_get)
        app.router.add_post("/gateway/swap", self._swap_post)
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
            await self._client.close()
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
        self.cancel_timer()
        if self._runner is not None:
            await self._runner.cleanup()  # cancels handlers still running (they count as failed)
            self._runner = None
        if self._client is not None:
            await self._client.close()
            self._client = None
        self._emit("gateway_stopped", mode=self.policy.name, **self.stats.as_dict())

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ HTTP: completions

    async def _completion(self, http_request: web.Request) -> web.StreamResponse:
        self.stats.received += 1
        self.stats.reading += 1
        try:
            raw = await http_request.read()
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise BadGatewayRequest("the body must be a JSON object")
            # Sent on as the client wrote it unless the gateway changes it (drops its own field, adds priority).
            unchanged = SLO_BODY_FIELD not in body
            meta = read_request_meta(http_request.headers, body, self.profile)
        except (ValueError, BadGatewayRequest) as exc:
            self.stats.failed += 1
            return web.json_response(error_body(ERROR_INVALID, f"cannot read the request: {exc}", 400), status=400)
        except BaseException:
            # The client hung up (or the gateway stopped) before its body was read: its handler is cancelled
            # here, and the request, never identified, ends failed.
            self.stats.failed += 1
            raise
        finally:
            self.stats.reading -= 1
        # Its SLO counts from when the client sent it, where the client says (x-slo-sent-at).
        now = self.now() - sent_before_s(meta, time.time())
        spec = RequestSpec(self._next_id, meta.prompt_tokens, meta.max_tokens, arrival_s=now, task=meta.task)
        spec.slo = meta.slo
        self._next_id += 1
        request = ControlledRequest(spec, arrival_s=now)
        client_id = meta.client_request_id
        outcome, reason = await self.admit(request, client_id)
        if outcome == "rejected":
            return web.json_response(error_body(ERROR_REJECTED, reason or "", 429), status=429)
        if outcome == "deferred":
            return web.json_response(error_body(ERROR_DEFERRED, reason or "", 503), status=503)
        return await self._forward(http_request, request, body, raw if unchanged else None, meta.stream, client_id)

    async def _forward(
        self,
        http_request: web.Request,
        request: ControlledRequest,
        body: dict[str, Any],
        raw: bytes | None,
        stream: bool,
        client_id: str | None,
    ) -> web.StreamResponse:
        """Send the request to its upstream (`raw`: the client's own bytes, when the body is unchanged) and
        relay the answer, a stream chunk by chunk as it arrives."""
        assert self._client is not None and request.replica is not None
        priority = self.policy.upstream_priority(request)
        if priority is not None:
            raw = json.dumps({**body, "priority": priority}).encode()
        elif raw is None:
            raw = json.dumps(body).encode()
        url = self.upstreams[request.replica].url + http_request.path_qs
        headers = request_headers(http_request.headers)
        headers["Content-Type"] = "application/json"
        outcome, reason = "failed", "client disconnected"
        response: web.StreamResponse | None = None
        try:
            upstream = await self._client.post(url, raw, headers)
            try:
                if stream and upstream.status == 200:
                    response = web.StreamResponse(status=200, headers=response_headers(upstream))
                    await response.prepare(http_request)
                    counter = SSETokenCounter()
                    ended = False
                    async for chunk in upstream.content.iter_any():
                        if ended:
                            continue  # nothing follows [DONE] in an OpenAI stream; read to the end all the same
                        counter.feed(chunk)
                        request.tokens_out = counter.tokens
                        if counter.done and counter.at_event_boundary:
                            # The last event: it goes out with the end of the response in one write, so the
                            # client is done without waiting for the upstream's own end of the body.
                            await response.write_eof(chunk)
                            ended = True
                        else:
                            await response.write(chunk)
                        if counter.finished and counter.error is None:
                            # Delivered: a client that hangs up after the last event lost nothing.
                            outcome, reason = "completed", None
                    if counter.error is not None:
                        outcome, reason = "failed", f"upstream error in stream: {counter.error}"
                    elif not counter.finished:
                        outcome, reason = "failed", "upstream stream ended before [DONE] or a finish_reason"
                    await response.write_eof()  # no-op when [DONE] already ended it
                    return response
                data = await upstream.read()
            finally:
                upstream.release()
            if upstream.status < 400:
                request.tokens_out = completion_tokens(data)
                outcome, reason = "completed", None
            else:
                outcome, reason = "failed", f"upstream answered HTTP {upstream.status}"
            return web.Response(status=upstream.status, body=data, headers=response_headers(upstream))
        except (aiohttp.ClientError, TimeoutError) as exc:
            # A timeout says nothing of itself: the cause is the deadline it hit.
            detail = exc if str(exc) else f"no complete answer within {self.request_timeout_s:g} s"
            url = self.upstreams[request.replica].url
            outcome, reason = "failed", f"upstream {url}: {type(exc).__name__}: {detail}"
            drop_tracebacks(exc)  # frees what it holds now, not at the next garbage collection
            if response is not None:  # the stream broke after it began: the client sees it end early
                return response
            return web.json_response(error_body(ERROR_UPSTREAM, reason, 502), status=502)
        except (ConnectionResetError, asyncio.CancelledError):
            if outcome != "completed":
                outcome, reason = "failed", "client disconnected during the response"
            raise
        finally:
            self.finish(request, outcome, reason, client_id)

    # ------------------------------------------------------------------ HTTP: control and proxy

    async def _stats_endpoint(self, _: web.Request) -> web.Response:
        # What a client may ask of this gateway besides: its online tuner's steps, a replica swap.
        can = {"online_tune": self.tune_feed is not None, "replica_swap": self.replica_swap is not None}
        return web.json_response({**self.snapshot(), **can})

    async def _tune_get(self, http_request: web.Request) -> web.Response:
        if self.tune_feed is None:
            message = "this gateway is not tuning online; start it with --tune"
            return web.json_response(error_body(ERROR_INVALID, message, 404), status=404)
        try:
            since = int(http_request.query.get("since", "0"))
        except ValueError:
            message = "since must be a step index (0, 1, ...)"
            return web.json_response(error_body(ERROR_INVALID, message, 400), status=400)
        return web.json_response(self.tune_feed(since))

    async def _swap_post(self, http_request: web.Request) -> web.Response:
        if self.replica_swap is None:
            message = "this gateway did not launch its server (--launch), so it cannot swap it; restart it yourself"
            return web.json_response(error_body(ERROR_INVALID, message, 409), status=409)
        try:
            body = await http_request.json()
            if not isinstance(body, dict) or not body:
                raise TypeError
        except (ValueError, TypeError):
            message = 'post the knobs to change, e.g. {"max_num_seqs": 8}'
            return web.json_response(error_body(ERROR_INVALID, message, 400), status=400)
        try:
            knobs = await self.replica_swap(body)
        except ProfileError as exc:
            return web.json_response(error_body(ERROR_INVALID, str(exc), 400), status=400)
        except SwapRefused as exc:
            return web.json_response(error_body(ERROR_INVALID, str(exc), 409), status=409)
        except BackendUnavailable as exc:  # the new server did not start: the old one still serves
            return web.json_response(error_body(ERROR_UPSTREAM, f"swap failed: {exc}", 502), status=502)
        return web.json_response({"knobs": knobs})

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
        """Any other path goes to the first routable upstream as it is (models, health, metrics, tokenize, ...)."""
        assert self._client is not None
        first = self.routable[0]
        url = first.url + http_request.path_qs
        headers = request_headers(http_request.headers)
        data = await http_request.read()
        try:
            session = self._client.session
            async with session.request(http_request.method, url, data=data or None, headers=headers) as upstream:
                payload = await upstream.read()
                return web.Response(status=upstream.status, body=payload, headers=response_headers(upstream))
        except (aiohttp.ClientError, TimeoutError) as exc:
            message = f"upstream {first.url}: {type(exc).__name__}: {exc}"
            return web.json_response(error_body(ERROR_UPSTREAM, message, 502), status=502)


def policy_factory_for(profile: Profile, replicas: int) -> PolicyFactory:
    """Build modes by name from the registry (core/modes.py) for this profile and upstream count."""
    from core.modes import ModeContext, make_policy
    from core.profile import load_calibration

    context = ModeContext(profile=profile, calibration=load_calibration(profile), replicas=replicas, seed=profile.seed)
    return lambda name: make_policy(name, context)
