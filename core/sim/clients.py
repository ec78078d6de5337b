"""The simulated clients of a load plan: open-loop arrivals (with an optional in-flight cap) or closed-loop
clients with think time. They decide *when* requests leave the client; what happens next is the
controller's and the engine replicas' business (engine.py).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator

from core.backend_api import LoadPlan
from core.records import RequestSpec

# (spec, time it leaves the client, time latency is measured from)
SendCallback = Callable[[RequestSpec, float, float], None]


class ClientDriver:
    """Releases a plan's requests in virtual time through `send(spec, sent_s, scheduled_s)`."""

    def __init__(self, plan: LoadPlan, send: SendCallback) -> None:
        self.plan = plan
        self._send_cb = send
        self._specs: Iterator[RequestSpec] = plan.requests
        self._lookahead: RequestSpec | None = None
        self.sent = 0
        self.in_flight = 0
        self.blocked: deque[RequestSpec] = deque()  # open loop, waiting for the in-flight cap
        self._client_sends: list[tuple[float, int, int]] = []  # closed loop: (time, client, order)
        self._send_order = 0
        self._exhausted = False
        if plan.mode == "closed":
            for client in range(plan.concurrency or 1):
                heapq.heappush(self._client_sends, (0.0, client, client))
            self._send_order = plan.concurrency or 1
        else:
            self._lookahead = self._pull_spec()

    def _pull_spec(self) -> RequestSpec | None:
        if self._exhausted:
            return None
        if self.plan.max_requests is not None and self.sent >= self.plan.max_requests:
            self._exhausted = True
            return None
        spec = next(self._specs, None)
        if spec is None:
            self._exhausted = True
        return spec

    def _send_window_open(self, t: float) -> bool:
        return self.plan.duration_s is None or t <= self.plan.duration_s

    def _send(self, spec: RequestSpec, t: float, scheduled: float) -> None:
        plan = self.plan
        self.sent += 1
        self.in_flight += 1
        spec.warmup = spec.warmup or t < plan.warmup_s or self.sent <= plan.warmup_requests
        spec.arrival_s = scheduled
        self._send_cb(spec, t, scheduled)

    def release(self, now: float) -> None:
        """Send every request whose time has come by `now` (open-loop schedule or closed-loop client)."""
        if self.plan.mode == "closed":
            sends = self._client_sends
            while sends and sends[0][0] <= now:
                t, client, _ = heapq.heappop(sends)
                if not self._send_window_open(t):
                    continue
                spec = self._pull_spec()
                if spec is None:
                    continue
                spec.client_id = client
                self._send(spec, t, t)
            return
        cap = self.plan.concurrency
        while self.blocked and (cap is None or self.in_flight < cap):
            spec = self.blocked.popleft()
            self._send(spec, now, spec.arrival_s)
        while self._lookahead is not None and self._lookahead.arrival_s <= now:
            spec = self._lookahead
            self._lookahead = self._pull_spec()
            if not self._send_window_open(spec.arrival_s):
                self._lookahead = None
                self._exhausted = True
                break
            if cap is not None and (self.in_flight >= cap or self.blocked):
                self.blocked.append(spec)
            else:
                self._send(spec, spec.arrival_s, spec.arrival_s)

    def next_send_time(self) -> float:
        if self.plan.mode == "closed":
            return self._client_sends[0][0] if self._client_sends else math.inf
        if self._lookahead is not None:
            return self._lookahead.arrival_s
        return math.inf

    def on_done(self, spec: RequestSpec, t: float) -> None:
        """A request this client sent has ended at `t` (served, failed or refused)."""
        self.in_flight -= 1
        if self.plan.mode == "closed" and spec.client_id is not None:
            heapq.heappush(self._client_sends, (t + self.plan.think_time_s, spec.client_id, self._send_order))
            self._send_order += 1

    def done(self) -> bool:
        """Nothing left to send and nothing in flight."""
        return self.next_send_time() == math.inf and not self.blocked and self.in_flight == 0
