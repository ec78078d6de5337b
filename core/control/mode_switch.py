"""A scheduling mode that can be replaced while it serves, without dropping, failing or reordering a request.

The online tuner (core/tune/online.py) tries other modes and other settings of a mode on live traffic.
`ModeSwitch` is the policy the controller (the gateway, or the simulator's engine) runs under online tuning: it
forwards to the mode in force, and `switch(new)` hands over:

- requests in flight stay where they run, and each one's completion is told to the mode that released it;
- the requests the old mode holds are handed to the new mode in arrival order, before any later arrival, with
  their arrival times (their deadlines stand); the new mode decides each as if it had just arrived: release,
  or hold in its own queues. One it would reject is released anyway, to the least-loaded replica: it was
  admitted before the switch, and a change of mode never drops an admitted request (`forced` counts them);
- while the new mode decides that backlog, the loads it sees count the requests it has just released and the
  controller has not yet dispatched, so a burst of hand-overs does not overfill a replica.

A request that arrives after the switch meets the new mode's own rules, rejection included. The new mode starts
without the old mode's running requests in its own books (SLOs-Serve's virtual engines, SABER's recorded
speeds); it sees them in the replicas' loads. (The gateway's plain `swap_policy`, an operator's change of mode,
offers the held requests to the new mode too, but lets it reject them.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.controller_api import ControlledRequest, Policy, Release, ReplicaView, Verdict, least_loaded


class ModeSwitch(Policy):
    """The mode in force (`current`), replaceable at any time by `switch`."""

    passthrough = False

    def __init__(self, policy: Policy) -> None:
        self.current = policy
        self.switches = 0
        self.forced = 0  # handed-over requests the new mode would have rejected, released anyway
        self._carry: list[ControlledRequest] = []  # the old mode's held requests, not yet handed to the new one
        self._ready: list[Release] = []  # released by the mode in force, not yet returned to the controller
        self._owner: dict[int, Policy] = {}  # request id -> the mode that released it (for on_finish)

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.current.name

    def switch(self, policy: Policy, now: float) -> None:
        """Put `policy` in force from `now`; what the old mode holds is handed over at the next decision."""
        held = self._carry + self.current.drain() + [r.request for r in self._ready]
        self._carry = sorted(held, key=lambda r: (r.arrival_s, r.request_id))
        self._ready = []
        self.current = policy
        self.switches += 1

    def _hand_over(self, now: float, replicas: Sequence[ReplicaView]) -> None:
        carry, self._carry = self._carry, []
        for req in carry:
            views = _Counted.views(replicas, self._ready)
            verdict = self.current.on_arrival(req, now, views)
            if verdict.action == "hold":
                req.tier = verdict.tier
                continue
            if verdict.action == "release":
                assert verdict.replica is not None
                req.tier, replica = verdict.tier, verdict.replica
            else:
                self.forced += 1
                replica = least_loaded(views)
            self._ready.append(Release(req, replica))
            self._owner[req.request_id] = self.current

    # ------------------------------------------------------------------ Policy

    def on_arrival(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> Verdict:
        if self._carry:
            self._hand_over(now, replicas)
        if not self._ready:
            verdict = self.current.on_arrival(req, now, replicas)
            if verdict.action == "release":
                self._owner[req.request_id] = self.current
            return verdict
        # Behind the handed-over requests the mode in force released: it waits for them to go out first.
        verdict = self.current.on_arrival(req, now, _Counted.views(replicas, self._ready))
        if verdict.action != "release":
            return verdict
        assert verdict.replica is not None
        req.tier = verdict.tier
        self._ready.append(Release(req, verdict.replica))
        self._owner[req.request_id] = self.current
        return Verdict.hold(verdict.tier)

    def release(self, now: float, replicas: Sequence[ReplicaView]) -> list[Release]:
        if self._carry:
            self._hand_over(now, replicas)
        if self._ready:
            # One source per call: the controller counts these in flight only once this returns, so the mode in
            # force is asked next time (at once: next_wakeup), with loads that count them.
            ready, self._ready = self._ready, []
            return ready
        released = self.current.release(now, replicas)
        for r in released:
            self._owner[r.request.request_id] = self.current
        return released

    def on_finish(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> None:
        self._owner.pop(req.request_id, self.current).on_finish(req, now, replicas)

    def next_wakeup(self, now: float) -> float:
        if self._carry or self._ready:
            return now
        return self.current.next_wakeup(now)

    def drain(self) -> list[ControlledRequest]:
        drained = self._carry + [r.request for r in self._ready] + self.current.drain()
        self._carry, self._ready = [], []
        return drained

    def step_planner(self, replica_index: int) -> Any | None:
        return self.current.step_planner(replica_index)

    def upstream_priority(self, req: ControlledRequest) -> int | None:
        return self._owner.get(req.request_id, self.current).upstream_priority(req)

    def describe(self) -> dict[str, Any]:
        return {**self.current.describe(), "switches": self.switches, "forced": self.forced}


@dataclass(slots=True)
class _Counted:
    """A replica as the mode in force sees it during a handover: the requests it released there that wait to go
    out are counted in its load (the controller counts them only once they are dispatched)."""

    index: int
    in_flight: dict[int, ControlledRequest]
    engine_waiting: int
    kv_usage: float

    @property
    def load(self) -> int:
        return len(self.in_flight)

    @staticmethod
    def views(replicas: Sequence[ReplicaView], ready: list[Release]) -> list[_Counted]:
        return [
            _Counted(
                r.index,
                {**r.in_flight, **{w.request.request_id: w.request for w in ready if w.replica == r.index}},
                r.engine_waiting,
                r.kv_usage,
            )
            for r in replicas
        ]
