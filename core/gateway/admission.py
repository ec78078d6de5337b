"""The gateway's admission controller: a scheduling mode's `Policy` run in wall time over live requests.

This is the half of the admission gateway (core/gateway/server.py) that knows no HTTP. Each request is a
`ControlledRequest`; the policy decides, as the simulator's controller does in virtual time:
- release: it goes to that upstream at once (`admit()` returns and the HTTP side forwards it);
- hold: it waits in the policy's queues; `release()` is asked again after every arrival and completion and at
  `next_wakeup()`; a request still held when the arrivals end (or the gateway stops) is `deferred`;
- reject: it ends `rejected` with the policy's reason.
What each upstream serves is tracked here (`Upstream.in_flight` / `load`, the policy's `ReplicaView`); the
engine's queue and KV use are not polled, so those are 0 in the view. Every request ends in exactly one
counter: completed, rejected, deferred or failed (`GatewayStats.accounted()`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from core.controller_api import ControlledRequest, Policy, Verdict
from core.events import EventSink, make_event
from core.profile import Profile, ProfileError
from core.records import RequestRecord, Status

PolicyFactory = Callable[[str], Policy]
RecordSink = Callable[[RequestRecord], None]

# A gateway outcome as a request record's status (what core.metrics scores).
OUTCOME_STATUS = {
    "completed": Status.OK,
    "rejected": Status.REJECTED,
    "deferred": Status.DEFERRED,
    "failed": Status.ERROR,
}

REJECTED_BY_MODE = "rejected by the scheduling mode"
HELD_AT_END = "held when the run ended; never served"
SETTLE_POLL_S = 0.005


@dataclass(slots=True)
class GatewayStats:
    """Counters since the gateway started. Every received request ends in exactly one of the four outcomes;
    until then it is `reading` (its body not yet read), `held` (in the policy's queues) or `in_flight` (at an
    upstream)."""

    received: int = 0
    reading: int = 0
    completed: int = 0
    rejected: int = 0
    deferred: int = 0
    failed: int = 0
    held: int = 0
    in_flight: int = 0
    policy_swaps: int = 0

    def accounted(self) -> bool:
        ended = self.completed + self.rejected + self.deferred + self.failed
        return ended + self.reading + self.held + self.in_flight == self.received

    def open(self) -> int:
        """Requests received and not yet ended."""
        return self.reading + self.held + self.in_flight

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
    # Retired (a replica swap): it gets nothing new; what it serves finishes there (`retire_upstream`).
    retired: bool = False

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
class HeldRequest:
    """A request waiting in the policy's queues; `waiter` gets ("release", replica), ("reject", reason) or
    ("defer", reason)."""

    request: ControlledRequest
    waiter: asyncio.Future[tuple[str, Any]]
    client_request_id: str | None


class AdmissionController:
    """Run `policy` over requests bound for `upstreams` (base URLs), in wall time on the running loop."""

    def __init__(
        self,
        upstreams: Sequence[str],
        policy: Policy,
        *,
        profile: Profile | None = None,
        policy_factory: PolicyFactory | None = None,
        on_event: EventSink | None = None,
        request_events: bool = True,
        keep_decisions: bool = True,
    ) -> None:
        self.upstreams = [Upstream(i, url.rstrip("/")) for i, url in enumerate(upstreams)]
        # What the policy routes among: the upstreams not retired (all of them unless a replica was swapped).
        # Indices stay those of `upstreams`, so a request's `replica` names its upstream for good.
        self.routable: list[Upstream] = list(self.upstreams)
        self.policy = policy
        self.profile = profile
        self.policy_factory = policy_factory
        self.on_event = on_event
        self.request_events = request_events  # one `gateway_request` event per request to `on_event`
        # Each ended request as a record on the gateway's clock (`now()`), for whoever scores the traffic
        # served (the online tuner, core/tune/online_gateway.py); None builds none.
        self.record_sink: RecordSink | None = None
        self.stats = GatewayStats()
        # By the caller's request id, when it sent one: what an embedded run reads into its records (and clears
        # each run). A standalone gateway has no reader, so it keeps none (`keep_decisions=False`): kept, one per
        # request for as long as the gateway serves, they were its only memory that grew with the load.
        self.decisions: dict[str, Decision] = {}
        self.keep_decisions = keep_decisions
        # After `end_arrivals()` (an embedded run's load has been sent) nothing is held any more: a hold
        # verdict is answered `deferred` at once, as the simulator defers what is still held at the end.
        self.arrivals_ended = False
        self._held: dict[int, HeldRequest] = {}
        # While paused (`pause()`: a drain-and-restart replica swap, no upstream to send to) arrivals wait here,
        # in arrival order, without the policy; `resume()` offers them to it in that order.
        self.paused = False
        self._paused: list[int] = []
        self._clock_zero = time.perf_counter()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf  # the policy's wakeup the timer is armed for

    def now(self) -> float:
        return time.perf_counter() - self._clock_zero

    # ------------------------------------------------------------------ one request

    async def admit(self, request: ControlledRequest, client_id: str | None) -> tuple[str, str | None]:
        """Ask the policy about a request that just arrived; wait while it is held. Returns ("release", None)
        once it is dispatched to `request.replica` (the caller forwards it, then calls `finish()`), or
        ("rejected", reason) / ("deferred", reason) / ("failed", reason), already counted and finished.
        `request.arrival_s` may lie before now (the client's send time, when it said): its deadline counts
        from there."""
        now = max(request.arrival_s, self.now())
        if self.paused:
            return await self._wait(HeldRequest(request, asyncio.get_running_loop().create_future(), client_id))
        verdict = self.policy.on_arrival(request, now, self.routable)
        if verdict.action == "reject":
            reason = verdict.reason or REJECTED_BY_MODE
            self.finish(request, "rejected", reason, client_id)
            return "rejected", reason
        if verdict.action == "release":
            assert verdict.replica is not None
            self._dispatch(request, verdict.replica, verdict.tier, now)
            self._pump()
            return "release", None
        request.tier = verdict.tier
        return await self._wait(HeldRequest(request, asyncio.get_running_loop().create_future(), client_id))

    async def _wait(self, held: HeldRequest) -> tuple[str, str | None]:
        """Hold a request (the policy's verdict, or a pause) until it is released, rejected or deferred."""
        request, client_id = held.request, held.client_request_id
        self._held[request.request_id] = held
        self.stats.held += 1
        if self.paused:
            self._paused.append(request.request_id)
        if self.arrivals_ended:
            self._resolve(held, ("defer", "arrived after the run ended; never served"))
        else:
            self._pump()
        try:
            action, detail = await held.waiter
        except asyncio.CancelledError:
            if self._held.pop(request.request_id, None) is not None:
                self.stats.held -= 1
            self.finish(request, "failed", "client disconnected while held", client_id)
            raise
        if action == "reject":
            self.finish(request, "rejected", detail, client_id)
            return "rejected", detail
        if action == "defer":
            self.finish(request, "deferred", detail, client_id)
            return "deferred", detail
        return "release", None

    def finish(self, request: ControlledRequest, outcome: str, reason: str | None, client_id: str | None) -> None:
        """Count a request's outcome, free its upstream slot and tell the policy."""
        now = self.now()
        if request.replica is not None and request.request_id in self.upstreams[request.replica].in_flight:
            upstream = self.upstreams[request.replica]
            del upstream.in_flight[request.request_id]
            upstream.served += 1
            self.stats.in_flight -= 1
            self.policy.on_finish(request, now, self.routable)
        setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
        if self.record_sink is not None:
            self.record_sink(self._record(request, outcome, reason, now))
        if client_id is not None and self.keep_decisions:
            self.decisions[client_id] = Decision(
                outcome, reason, request.tier, request.replica, request.arrival_s, request.dispatched_s
            )
        if self.request_events and self.on_event is not None:
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

    # ------------------------------------------------------------------ the mode

    def end_arrivals(self) -> int:
        """The load is over: answer every held request `deferred` (and any later hold too). Returns how many."""
        self.arrivals_ended = True
        return self._defer_held(HELD_AT_END)

    def swap_policy(self, policy: Policy) -> None:
        """Run `policy` from now on. Held requests are offered to it again with their original arrival
        times (their deadlines stand); requests already at an upstream finish there and stay in its load."""
        old = self.policy
        carried = [r for r in old.drain() if r.request_id in self._held]
        handed = len(carried)
        self.policy = policy
        self.stats.policy_swaps += 1
        now = self.now()
        if self.paused:  # no release during a pause: they wait (before the arrivals it held) for `resume()`
            self._paused = [r.request_id for r in carried] + self._paused
            carried = []
        for request in carried:
            self._apply(request, self.policy.on_arrival(request, now, self.routable), now)
        settings = policy.describe()
        self._emit("gateway_mode", mode=policy.name, previous=old.name, carried=handed, settings=settings)
        self._pump()

    def add_upstream(self, url: str) -> Upstream:
        """A new upstream (a replica swap's new server, already serving): routed to from now on."""
        upstream = Upstream(len(self.upstreams), url.rstrip("/"))
        self.upstreams.append(upstream)
        self.routable.append(upstream)
        self._emit("gateway_upstream", url=upstream.url, index=upstream.index, change="added")
        self._pump()
        return upstream

    def retire_upstream(self, index: int) -> None:
        """Route nothing new to upstream `index`; what it serves finishes there (a replica swap drains it). The
        policy no longer sees it: requests it already released there end through `finish` as ever."""
        upstream = self.upstreams[index]
        if len(self.routable) == 1 and self.routable[0] is upstream:
            raise ValueError("cannot retire the last routable upstream: add its replacement first")
        upstream.retired = True
        self.routable = [u for u in self.routable if u is not upstream]
        self._emit("gateway_upstream", url=upstream.url, index=index, change="retired", in_flight=upstream.load)

    def pause(self) -> None:
        """Release nothing from now on: arrivals wait at the gateway in arrival order and what the policy holds
        stays held; requests at an upstream finish there (a drain-and-restart swap: the old server drains, no
        server is up while the new one starts). Nothing is dropped: `resume()` goes on from where this stopped."""
        self.paused = True
        self.cancel_timer()

    def resume(self) -> int:
        """End a pause: the arrivals it held are offered to the policy in arrival order, with their arrival
        times (after what the policy held already, which came first), then the policy releases as ever.
        Returns how many arrivals the pause held."""
        self.paused = False
        waiting, self._paused = self._paused, []
        now = self.now()
        for request_id in waiting:
            held = self._held.get(request_id)
            if held is not None:  # else its client hung up while paused (counted failed then)
                self._apply(held.request, self.policy.on_arrival(held.request, now, self.routable), now)
        self._pump()
        return len(waiting)

    def policy_changed(self) -> None:
        """The policy's settings changed in place (the online tuner moved a knob): ask it at once what it
        releases now. Admitted requests are untouched; the change applies to what it decides from now on."""
        self._pump()

    def swap_mode(self, name: str) -> Policy:
        """Build mode `name` with the policy factory and swap to it. Raises ProfileError for an unknown mode."""
        if self.policy_factory is None:
            raise ProfileError("this gateway was started without a mode registry; it cannot change mode")
        policy = self.policy_factory(name)
        self.swap_policy(policy)
        return policy

    def snapshot(self) -> dict[str, Any]:
        return {
            "mode": self.policy.name,
            **self.stats.as_dict(),
            "accounted": self.stats.accounted(),
            "upstreams": [
                {"url": u.url, "load": u.load, "served": u.served, "retired": u.retired} for u in self.upstreams
            ],
        }

    async def settle(self, timeout_s: float) -> bool:
        """Wait until every request received has ended (at most `timeout_s`); True if they all have.

        A client may be done with a request before the gateway is: the gateway ends a stream when the
        upstream's body ends, a moment after the client read the last event, and it notices a client that hung
        up only when its handler is cancelled. An embedded run takes its account after this, so a request is
        counted in the run that sent it and never in the next one's."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.stats.open() and loop.time() < deadline:
            await asyncio.sleep(SETTLE_POLL_S)
        return self.stats.open() == 0

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------------------ internals

    def _apply(self, request: ControlledRequest, verdict: Verdict, now: float) -> None:
        """Carry out a verdict for a request that is already held (waiting on its future)."""
        held = self._held[request.request_id]
        if verdict.action == "release":
            assert verdict.replica is not None
            self._dispatch(request, verdict.replica, verdict.tier, now)
            self._resolve(held, ("release", verdict.replica))
        elif verdict.action == "reject":
            self._resolve(held, ("reject", verdict.reason or REJECTED_BY_MODE))
        else:
            request.tier = verdict.tier
            if self.arrivals_ended:
                self._resolve(held, ("defer", HELD_AT_END))

    def _record(self, request: ControlledRequest, outcome: str, reason: str | None, now: float) -> RequestRecord:
        status = OUTCOME_STATUS[outcome]
        return RequestRecord.from_spec(
            request.spec,
            arrival_s=request.arrival_s,
            warmup=False,
            status=status,
            end_s=None if status is Status.DEFERRED else now,
            output_tokens=request.tokens_out,
            error=reason,
            tier=request.tier,
            replica=request.replica,
            dispatched_s=request.dispatched_s,
        )

    def _resolve(self, held: HeldRequest, result: tuple[str, Any]) -> None:
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
        if self.paused:
            return
        if self.policy.passthrough and not self._held and self._timer is None:
            return  # fcfs-like: it releases on arrival and never holds, so there is nothing to ask
        now = self.now()
        for release in self.policy.release(now, self.routable):
            held = self._held.get(release.request.request_id)
            if held is None:  # its client hung up while it waited: it never reaches an upstream
                self.policy.on_finish(release.request, now, self.routable)
                continue
            self._dispatch(release.request, release.replica, release.request.tier, now)
            self._resolve(held, ("release", release.replica))
        self._arm_timer(now)

    def _arm_timer(self, now: float) -> None:
        wakeup = self.policy.next_wakeup(now)
        if not (math.isfinite(wakeup) and self._held):
            self.cancel_timer()
        elif self._timer is None or wakeup != self._timer_at:
            # Re-armed only when the moment changed: every arrival and completion pumps, and a new handle each
            # time cost a cancel and a heap push, the cancelled handles piling up in the loop until their time.
            self.cancel_timer()
            self._timer_at = wakeup
            self._timer = asyncio.get_running_loop().call_later(max(0.0, wakeup - now), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None  # it fired: the next pump arms a new one
        self._pump()

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

    def _emit(self, name: str, **fields: Any) -> None:
        if self.on_event is not None:
            self.on_event(make_event(name, **fields))
