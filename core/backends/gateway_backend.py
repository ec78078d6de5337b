"""`GatewayBackend`: a live backend with the admission gateway in front (`--backend vllm|url --mode NAME`).

It puts a `core.gateway.server.Gateway` (127.0.0.1, a free port) in front of the served server (a vLLM
that `VllmBackend` launches, or the `--url` server) and points the load client at the gateway, with each
request's task, SLO and id in the gateway's body field. The client measures latency end to end, so time
spent held at the gateway counts. The gateway's account then completes the client's records: a 429 becomes
`rejected` and a 503 `deferred` (with the mode's reason), and every record gets the tier and upstream that
served it and when the gateway released it. When the plan's `duration_s` has passed, the gateway defers
what it still holds, as the simulator does at the end of a run.

The server and the gateway live across runs; `swap_mode` changes the policy without restarting vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from core.backend_api import LoadPlan, RunObserver, RunOutcome
from core.backends.live import UrlBackend
from core.controller_api import Policy
from core.events import EventSink
from core.gateway.server import Gateway, policy_factory_for
from core.profile import Profile
from core.records import RequestRecord, RequestSpec, Status

# How long a run's account waits for the gateway to end what the client is already done with (streams whose
# upstream body has yet to end, handlers of hung-up clients yet to be cancelled): milliseconds normally.
SETTLE_TIMEOUT_S = 10.0


class GatewayBackend:
    """Serve through the gateway running mode `mode` in front of `inner` (a VllmBackend or a UrlBackend)."""

    name = "gateway"

    def __init__(
        self,
        inner: Any,
        profile: Profile,
        mode: str,
        *,
        policy: Policy | None = None,
        on_event: EventSink | None = None,
        extra_upstreams: Sequence[str] = (),
        **client_options: Any,
    ) -> None:
        """`policy` overrides the registry's `mode` (tests, ad-hoc policies); `client_options` go to the
        load client (`UrlBackend`)."""
        self.inner = inner
        self.profile = profile
        self.mode = mode
        self.initial_policy = policy
        # More replicas behind the same gateway: running servers given by URL (the mode routes among all).
        self.extra_upstreams = list(extra_upstreams)
        self.on_event = on_event
        self.client_options = client_options
        self.gateway: Gateway | None = None
        self.client: UrlBackend | None = None

    # ------------------------------------------------------------ lifecycle

    async def stop(self) -> None:
        """Stop the managed server (the console's Stop button); the gateway follows it on the next start."""
        if hasattr(self.inner, "stop"):
            await self.inner.stop()

    async def _upstream(self) -> tuple[str, str | None]:
        """The served server's base URL and model, starting a managed vLLM if it is not running."""
        if hasattr(self.inner, "server"):  # VllmBackend
            if self.inner._needs_start():
                await self.inner.start()
            return self.inner.base_url, self.inner.server.served_model_name
        await self.inner.probe()
        return self.inner.base_url, self.inner.model

    @property
    def server(self) -> Any:
        """The managed vLLM (VllmServer) when there is one, for the console's process tab."""
        return getattr(self.inner, "server", None)

    @property
    def knobs(self) -> Any:
        return getattr(self.inner, "knobs", None)

    async def start(self, knobs: Any = None) -> Gateway:
        """Start the managed server (with `knobs` if given) and the gateway in front of it."""
        if knobs is not None and hasattr(self.inner, "server"):
            await self.inner.start(knobs)
        upstream, model = await self._upstream()
        if self.gateway is not None and self.gateway.upstreams[0].url != upstream.rstrip("/"):
            await self.gateway.stop()  # the managed server restarted on another port
            self.gateway = None
        if self.gateway is None:
            upstreams = [upstream, *self.extra_upstreams]
            factory = policy_factory_for(self.profile, replicas=len(upstreams))
            policy = self.initial_policy or factory(self.mode)
            self.gateway = Gateway(
                upstreams, policy, profile=self.profile, policy_factory=factory, on_event=self.on_event
            )
            await self.gateway.start()
            self.client = UrlBackend(self.gateway.base_url, model, slo_fields=True, **self.client_options)
        return self.gateway

    def swap_mode(self, name: str, done: Callable[[BaseException | None], None] | None = None) -> None:
        """Run mode `name` from now on; the upstream server keeps running.

        The swap runs on the gateway's own loop: at once when called there (or before the gateway started),
        else scheduled onto it (the console's UI loop calling while live load runs on a thread of its own).
        `done(None)` or `done(error)` follows (a ProfileError for a mode this profile cannot build); it runs
        on the gateway's loop. Without `done`, an error raises where the swap runs."""

        def swap() -> None:
            try:
                if self.gateway is not None:
                    self.gateway.swap_mode(name)
                self.mode = name
            except Exception as exc:
                if done is None:
                    raise
                done(exc)
                return
            if done is not None:
                done(None)

        loop = None if self.gateway is None else self.gateway.loop
        try:
            current = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if loop is not None and loop is not current and loop.is_running():
            loop.call_soon_threadsafe(swap)
        else:
            swap()

    async def restart(self, knobs: Any = None) -> None:
        """Restart the managed server with new knobs (the gateway follows it to its new port)."""
        await self.inner.restart(knobs)

    async def close(self) -> None:
        if self.gateway is not None:
            gateway, self.gateway = self.gateway, None
            await _on_loop(gateway.loop, gateway.stop())
        await self.inner.close()

    def describe(self) -> dict[str, Any]:
        facts = dict(self.inner.describe())
        facts["gateway"] = {"mode": self.mode, "url": None if self.gateway is None else self.gateway.base_url}
        return facts

    # ------------------------------------------------------------ running

    async def run(self, plan: LoadPlan, observer: RunObserver | None = None) -> RunOutcome:
        gateway = await self.start()
        assert self.client is not None
        gateway.decisions.clear()  # keyed by the client's request ids, which restart at 0 each run
        gateway.arrivals_ended = False
        before = gateway.stats.as_dict()
        first_send = asyncio.Event()
        watched = replace(plan, requests=_watch_first(plan.requests, first_send))
        ender = asyncio.create_task(self._end_arrivals_after(plan.duration_s, first_send))
        try:
            outcome = await self.client.run(watched, _Reconciling(self, observer))
        finally:
            ender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ender
        # The account is the gateway's once it has ended what this run sent (see `AdmissionController.settle`).
        await _on_loop(gateway.loop, gateway.settle(SETTLE_TIMEOUT_S))
        for record in outcome.records:
            self.reconcile(record)
        outcome.notes["gateway"] = _run_counters(gateway, before)
        outcome.notes["status_counts"] = _status_counts(outcome.records)
        if self.server is not None and self.server.process is not None:
            outcome.notes["vllm"] = {"argv": self.server.process.argv, "knobs": self.inner.knobs.model_dump()}
        return outcome

    async def _end_arrivals_after(self, duration_s: float | None, first_send: asyncio.Event) -> None:
        if duration_s is None:
            return  # no horizon: what is held is released as the load drains
        await first_send.wait()
        await asyncio.sleep(duration_s)
        if self.gateway is not None:
            self.gateway.end_arrivals()

    def reconcile(self, record: RequestRecord) -> None:
        """Complete a client record with the gateway's decision about it."""
        if self.gateway is None:
            return
        decision = self.gateway.decisions.get(str(record.request_id))
        if decision is None:
            return
        record.tier = decision.tier
        record.replica = decision.replica
        if decision.dispatched_s is not None and record.sent_s is not None:
            record.dispatched_s = record.sent_s + (decision.dispatched_s - decision.arrival_s)
        if decision.outcome == "rejected":
            record.status, record.error = Status.REJECTED, decision.reason
        elif decision.outcome == "deferred":
            record.status, record.error = Status.DEFERRED, decision.reason


class _Reconciling:
    """Passes records on to the caller's observer after the gateway's account has completed them."""

    def __init__(self, backend: GatewayBackend, observer: RunObserver | None) -> None:
        self.backend = backend
        self.observer = observer

    def on_record(self, record: RequestRecord) -> None:
        self.backend.reconcile(record)
        if self.observer is not None:
            self.observer.on_record(record)

    def on_engine_sample(self, sample: Any) -> None:
        if self.observer is not None:
            self.observer.on_engine_sample(sample)

    def on_measurement_start(self, time_s: float) -> None:
        # The energy window starts at the first measured send (issue 9 item 6), through the gateway as direct.
        forward = getattr(self.observer, "on_measurement_start", None)
        if forward is not None:
            forward(time_s)


async def _on_loop(loop: asyncio.AbstractEventLoop | None, coroutine: Any) -> Any:
    """Await `coroutine` on `loop` (the gateway's), from this loop or from another thread's."""
    try:
        current = asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - always called from a coroutine
        current = None
    if loop is None or loop is current or not loop.is_running():
        return await coroutine
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))


def _watch_first(requests: Iterator[RequestSpec], first_send: asyncio.Event) -> Iterator[RequestSpec]:
    """The same requests; sets `first_send` when the client takes the first (its run clock has started)."""
    for spec in requests:
        first_send.set()
        yield spec


def _run_counters(gateway: Gateway, before: dict[str, int]) -> dict[str, Any]:
    """The gateway's counters for this run alone (it lives across runs), its mode and whether all add up."""
    now = gateway.stats.as_dict()
    counters: dict[str, Any] = {"mode": gateway.policy.name}
    for name in ("received", "completed", "rejected", "deferred", "failed"):
        counters[name] = now[name] - before[name]
    for name in ("reading", "held", "in_flight"):
        counters[name] = now[name]
    ended = sum(counters[name] for name in ("completed", "rejected", "deferred", "failed"))
    still_open = counters["reading"] + counters["held"] + counters["in_flight"]
    counters["accounted"] = ended + still_open == counters["received"]
    return counters


def _status_counts(records: list[RequestRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        counts[str(record.status)] = counts.get(str(record.status), 0) + 1
    return counts
