"""The simulated clients of a load plan: open-loop arrivals (with an optional in-flight cap) or closed-loop
clients with think time. They decide *when* requests leave the client, by the sending rules the live load
run follows too (core/workload/sending.py); what happens next is the controller's and the engine replicas'
business (engine.py).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator

from core.backend_api import LoadPlan
from core.records import RequestSpec
from core.workload.sending import is_warmup, may_take, next_send_s, within_duration

# (spec, time it leaves the client, time latency is measured from)
SendCallback = Callable[[RequestSpec, float, float], None]
# an open-loop request still queued for an in-flight slot when the run's window closed
NotSentCallback = Callable[[RequestSpec], None]


class ClientDriver:
    """Releases a plan's requests in virtual time through `send(spec, sent_s, scheduled_s)`."""

    def __init__(self, plan: LoadPlan, send: SendCallback, not_sent: NotSentCallback) -> None:
        self.plan = plan
        self._send_cb = send
        self._not_sent_cb = not_sent
        self._specs: Iterator[RequestSpec] = plan.requests
        self._lookahead: RequestSpec | None = None
        self.taken = 0  # requests taken from the plan: sent, or queued for an in-flight slot
        self.in_flight = 0
        # Open loop: the most requests in flight at once, and whether the cap ever held one back. A run whose cap
        # held nobody is the same run under any cap of at least peak_in_flight, or none (core/sim/reach.py).
        self.peak_in_flight = 0
        self.cap_held = False
        self.blocked: deque[RequestSpec] = deque()  # open loop, waiting for the in-flight cap
        self._client_sends: list[tuple[float, int, int]] = []  # closed loop: (time, client, order)
        self._send_order = 0
        self._exhausted = False
        self._closed = plan.mode == "closed"
        if self._closed:
            for client in range(plan.concurrency or 1):
                heapq.heappush(self._client_sends, (0.0, client, client))
            self._send_order = plan.concurrency or 1
        else:
            self._lookahead = self._pull_spec()

    def _pull_spec(self) -> RequestSpec | None:
        if self._exhausted:
            return None
        if not may_take(self.plan, self.taken):
            self._exhausted = True
            return None
        spec = next(self._specs, None)
        if spec is None:
            self._exhausted = True
        return spec

    def _take(self, spec: RequestSpec, scheduled: float) -> None:
        """`spec` is taken from the plan, to be sent at (open loop: from) `scheduled`."""
        spec.arrival_s = scheduled
        spec.warmup = is_warmup(self.plan, spec, self.taken)
        self.taken += 1

    def _send(self, spec: RequestSpec, t: float) -> None:
        self.in_flight += 1
        if self.in_flight > self.peak_in_flight:
            self.peak_in_flight = self.in_flight
        self._send_cb(spec, t, spec.arrival_s)

    def release(self, now: float) -> None:
        """Send every request whose time has come by `now` (open-loop schedule or closed-loop client)."""
        lookahead = self._lookahead
        if lookahead is not None and lookahead.arrival_s > now and not self.blocked:
            return  # open loop, nothing due (the simulation asks before every engine step)
        if self._closed:
            sends = self._client_sends
            while sends and sends[0][0] <= now:
                t, client, _ = heapq.heappop(sends)
                if not within_duration(t, self.plan.duration_s):
                    continue
                spec = self._pull_spec()
                if spec is None:
                    continue
                spec.client_id = client
                self._take(spec, t)
                self._send(spec, t)
            return
        cap = self.plan.concurrency
        while self.blocked and (cap is None or self.in_flight < cap):
            spec = self.blocked.popleft()
            if within_duration(now, self.plan.duration_s):
                self._send(spec, now)
            else:
                self._not_sent_cb(spec)
        while self._lookahead is not None and self._lookahead.arrival_s <= now:
            spec = self._lookahead
            if not within_duration(spec.arrival_s, self.plan.duration_s):
                self._lookahead = None
                self._exhausted = True
                break
            self._take(spec, spec.arrival_s)
            self._lookahead = self._pull_spec()
            if cap is not None and (self.in_flight >= cap or self.blocked):
                self.cap_held = True
                self.blocked.append(spec)
            else:
                self._send(spec, spec.arrival_s)

    def next_send_time(self) -> float:
        if self._closed:
            return self._client_sends[0][0] if self._client_sends else math.inf
        if self._lookahead is not None:
            return self._lookahead.arrival_s
        return math.inf

    def on_done(self, spec: RequestSpec, t: float) -> None:
        """A request this client sent has ended at `t` (served, failed or refused)."""
        self.in_flight -= 1
        if self._closed and spec.client_id is not None:
            heapq.heappush(self._client_sends, (next_send_s(self.plan, t), spec.client_id, self._send_order))
            self._send_order += 1

    def idle(self) -> bool:
        """Nobody waits for an in-flight slot and nothing is in flight (whatever is still to be sent)."""
        return not self.blocked and self.in_flight == 0

    def done(self) -> bool:
        """Nothing left to send and nothing in flight."""
        return self.next_send_time() == math.inf and self.idle()
