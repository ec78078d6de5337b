"""The controller seam: what every scheduling mode decides, in the simulator and in front of live servers.

A scheduling mode is a `Policy`. The controller in front of the engine replicas (core/sim/engine.py in
virtual time, core/gateway/server.py in wall time) hands it each arriving request and asks it, after every
event (arrival, completion, timer), which held requests to release to which replica. The policy sees the
replicas only through `ReplicaView`: what the controller itself knows (the requests it released there and
has not seen finish) plus what the engine reports (queue, KV use). It never touches engine internals, so
the same policy object runs against the simulator and against real vLLM servers.

Engine-level decisions (how a replica forms each batch, per-request speculation) are a second seam, the
replica's `StepPlanner` (core/step_planner_api.py); a mode that needs one (SLOs-Serve's batch formation,
AdaServe's token trees) provides it through `Policy.step_planner`.

Decisions and their accounting (every request ends as exactly one record):
- released to a replica: it is served and ends `ok` or failed there; `tier` says from which tier;
- rejected (`Verdict.reject`): a record with status `rejected` and the reason (HTTP 429 in the gateway);
- held (`Verdict.hold`): in the policy's queue (a high tier or a best-effort tier) until `release` lets it go;
  a request still held when the run ends becomes a `deferred` record.

Why this module sits in the bottom layer and not in core/control: the simulator's engine (core/sim/engine.py)
drives a `Policy` and runs plain `Policy()` (fcfs) when no mode is given, while the modes in core/control
implement it. With the seam here the simulator never imports core/control and core/control never imports
core/sim; both import only this module, core/step_planner_api.py and core/step_time.py below them. The shared
building blocks of modes (`least_loaded`, `HeldQueue`) stay with the types they work on.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from core.profile import KnobsSpec
from core.records import RequestSpec

TIER_HIGH = "high"
TIER_LOW = "low"  # SABER's low-priority queue (sec. IV-C): infeasible requests, served when the high tier is empty
TIER_BEST_EFFORT = "best-effort"  # SLOs-Serve's burst-resilient tier (sec. 4.1)


@dataclass(slots=True)
class ControlledRequest:
    """A request as the controller tracks it, from arrival to finish."""

    spec: RequestSpec
    arrival_s: float  # when the controller received it (the run's clock)
    tier: str = TIER_HIGH
    replica: int | None = None  # where it was released
    dispatched_s: float | None = None
    # Output tokens streamed so far, where the controller can see them (gateway: counted from the stream;
    # simulator: updated when the request finishes). Policies must not rely on it being current.
    tokens_out: int = 0
    # Free slot for the policy's own bookkeeping (e.g. SABER's recorded required speed at admission).
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def request_id(self) -> int:
        return self.spec.request_id

    def deadline_s(self) -> float:
        """The completion deadline its SLO implies (SABER's SLA, paper 001 sec. IV-C step 1): arrival + e2e
        SLO, and, when the SLO sets TTFT and TPOT, arrival + TTFT + TPOT x (max tokens - 1), the latest end at
        which both can still hold (the earlier of the two when all three are set); inf when neither applies
        (a TPOT-only SLO bounds a speed, not an end)."""
        slo = self.spec.slo
        deadline = math.inf
        if slo.e2e_s is not None:
            deadline = slo.e2e_s
        if slo.ttft_s is not None and slo.tpot_s is not None:
            deadline = min(deadline, slo.ttft_s + slo.tpot_s * max(0, self.spec.output_tokens - 1))
        return self.arrival_s + deadline


@dataclass(frozen=True, slots=True)
class Verdict:
    """A policy's answer to an arrival: release now to a replica, hold in a tier, or reject."""

    action: Literal["release", "hold", "reject"]
    replica: int | None = None
    tier: str = TIER_HIGH
    reason: str | None = None

    @staticmethod
    def release(replica: int, tier: str = TIER_HIGH) -> Verdict:
        return Verdict("release", replica=replica, tier=tier)

    @staticmethod
    def hold(tier: str = TIER_HIGH, reason: str | None = None) -> Verdict:
        return Verdict("hold", tier=tier, reason=reason)

    @staticmethod
    def reject(reason: str) -> Verdict:
        return Verdict("reject", reason=reason)


class ReplicaView(Protocol):
    """What a policy may know about one engine replica."""

    index: int

    @property
    def in_flight(self) -> dict[int, ControlledRequest]:
        """Requests released here by the controller and not yet finished (by request id)."""
        ...

    @property
    def load(self) -> int:
        """len(in_flight): the concurrency L this replica serves (SABER's load)."""
        ...

    @property
    def engine_waiting(self) -> int:
        """Requests queued inside the engine (not yet running); 0 where the engine does not say."""
        ...

    @property
    def kv_usage(self) -> float:
        """0..1; 0.0 where the engine does not say."""
        ...


@dataclass(slots=True)
class Release:
    """A held request the policy lets go now, to `replica`."""

    request: ControlledRequest
    replica: int


class Policy:
    """Base class of scheduling modes; on its own it is vLLM's default (`fcfs`): release every request on
    arrival to the least-loaded replica (ties to the lowest index), hold nothing, reject nothing.

    Subclasses override `on_arrival`, `release` and, if they hold requests with deadlines, `next_wakeup`.
    The controller calls, in virtual or wall time:
      on_arrival(req, now, replicas) -> Verdict          once per request
      release(now, replicas) -> list[Release]            after every event; may return nothing
      on_finish(req, now, replicas)                      when a released request ends (any status)
      next_wakeup(now) -> float                          the next time release() should be asked anyway
      drain() -> list[ControlledRequest]                 at the end: whatever is still held (-> deferred)
    """

    name = "fcfs"
    #: True when `on_arrival` always releases at once and `release` never returns anything: the simulator
    #: then skips the controller bookkeeping on its hot path (fcfs must stay at tens of thousands of req/s).
    passthrough = True

    def on_arrival(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> Verdict:
        return Verdict.release(least_loaded(replicas))

    def release(self, now: float, replicas: Sequence[ReplicaView]) -> list[Release]:
        return []

    def on_finish(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> None:
        return None

    def next_wakeup(self, now: float) -> float:
        return math.inf

    def drain(self) -> list[ControlledRequest]:
        return []

    def speculation(self, knobs: KnobsSpec) -> str:
        """How this mode speculates, for tables that put modes side by side: a mode that drafts tokens where
        the knobs turn speculation off (AdaServe's trees) must not pass for the same engine as fcfs."""
        width = knobs.effective_spec_width
        return "off" if width == 0 else f"chain of {width}"

    def step_planner(self, replica_index: int) -> Any | None:
        """The replica-level batch planner this mode needs (core/step_planner_api.StepPlanner), or None for the
        engine's own FCFS batching (the fast path)."""
        return None

    def upstream_priority(self, req: ControlledRequest) -> int | None:
        """The `priority` the live gateway sends with this request to vLLM (which, started with
        `--scheduling-policy priority`, schedules lower values first and preempts higher ones); None sends
        none. The simulator does not use it."""
        return None

    def describe(self) -> dict[str, Any]:
        """Settings worth printing in a summary or factsheet."""
        return {"mode": self.name}


def least_loaded(replicas: Sequence[ReplicaView]) -> int:
    """Index of the replica with the fewest requests in flight (lowest index on ties)."""
    if len(replicas) == 1:
        return replicas[0].index
    best = min(replicas, key=lambda r: (r.load, r.index))
    return best.index


class HeldQueue:
    """A FIFO of held requests with removal from the middle (SABER samples a window at the head)."""

    def __init__(self) -> None:
        self._items: deque[ControlledRequest] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._items)

    def push(self, req: ControlledRequest) -> None:
        self._items.append(req)

    def head(self, n: int) -> list[ControlledRequest]:
        return [self._items[i] for i in range(min(n, len(self._items)))]

    def remove(self, req: ControlledRequest) -> None:
        self._items.remove(req)

    def pop_left(self) -> ControlledRequest:
        return self._items.popleft()

    def take_all(self) -> list[ControlledRequest]:
        items = list(self._items)
        self._items.clear()
        return items

    def move_where(self, predicate: Callable[[ControlledRequest], bool], into: HeldQueue) -> int:
        """Move every request matching `predicate` (in order) to `into`; returns how many moved."""
        keep: deque[ControlledRequest] = deque()
        moved = 0
        for req in self._items:
            if predicate(req):
                into.push(req)
                moved += 1
            else:
                keep.append(req)
        self._items = keep
        return moved
