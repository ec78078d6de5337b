"""A concurrency cap in front of the engines: the simplest admission policy that holds and rejects.

At most `cap` requests run on each replica; later ones wait in arrival order (first come, first served)
and are released to the least-loaded replica as slots free up; with `max_queue` set, an arrival that finds
the queue full is rejected. It is what a static `max_num_seqs` does inside vLLM, moved into the controller,
and it is the gateway's plain hold/reject policy in tests. It is not one of the paper modes in `MODES`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from core.controller_api import ControlledRequest, HeldQueue, Policy, Release, ReplicaView, Verdict, least_loaded


class ConcurrencyCapPolicy(Policy):
    name = "concurrency-cap"
    passthrough = False

    def __init__(self, cap: int, max_queue: int | None = None) -> None:
        if cap < 1:
            raise ValueError(f"cap must be at least 1 (got {cap})")
        self.cap = cap
        self.max_queue = max_queue
        self.queue = HeldQueue()
        self._recheck = False  # the cap changed: ask to be asked at once (a raised cap frees slots now)

    def set_cap(self, cap: int) -> None:
        """Change the cap for what is released from now on (the online tuner's knob). Nothing admitted is touched:
        requests in flight above a lowered cap finish where they run, and the queue keeps its order."""
        if cap < 1:
            raise ValueError(f"cap must be at least 1 (got {cap})")
        self.cap = cap
        self._recheck = True

    def _free_replica(self, replicas: Sequence[ReplicaView]) -> int | None:
        index = least_loaded(replicas)
        replica = next(r for r in replicas if r.index == index)
        return index if replica.load < self.cap else None

    def on_arrival(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> Verdict:
        if not len(self.queue):
            free = self._free_replica(replicas)
            if free is not None:
                return Verdict.release(free)
        if self.max_queue is not None and len(self.queue) >= self.max_queue:
            return Verdict.reject(f"queue full: {len(self.queue)} requests wait for {self.cap} slots per replica")
        self.queue.push(req)
        return Verdict.hold()

    def next_wakeup(self, now: float) -> float:
        return now if self._recheck else math.inf

    def release(self, now: float, replicas: Sequence[ReplicaView]) -> list[Release]:
        self._recheck = False
        # The caller marks each release in flight only after this returns, so count our own releases.
        loads = {r.index: r.load for r in replicas}
        released: list[Release] = []
        while len(self.queue):
            index = min(loads, key=lambda i: (loads[i], i))
            if loads[index] >= self.cap:
                break
            released.append(Release(self.queue.pop_left(), index))
            loads[index] += 1
        return released

    def drain(self) -> list[ControlledRequest]:
        return self.queue.take_all()

    def describe(self) -> dict[str, object]:
        return {"mode": self.name, "cap": self.cap, "max_queue": self.max_queue}
