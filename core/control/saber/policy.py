"""SABER (paper 001): SLA-aware admission in front of a continuous-batching engine, online phase (sec. IV-C).

Read beside the paper's Algorithm 1:
- two-tier queue (sec. IV-C step 1): every arrival enters the high tier; its required speed is
  max tokens / time left to its deadline, which grows while it waits. Once it exceeds the fastest speed the
  engine can give one request, f(1), it can no longer meet its SLA and is demoted to the low tier;
- admission (Algorithm 1 lines 5-16): take the first `window_size` requests of the high tier in a random
  (seeded) order, admit the first whose required speed f(L+1) meets, provided f(L+1) also meets the
  required speed recorded for every request already running on that replica; record its required speed;
  repeat until no request in the window can be admitted;
- low tier (lines 17-21) only while the high tier is empty, best-effort (see `_release_low`).

The paper loops forever with a sleep delta between passes; here the controller calls `release` after every
event (arrival, finish, timer), and between events nothing changes except that required speeds grow, which
can only make a held request less admissible. So one call that admits until nothing more fits is the same
loop with delta -> 0, and the only timer needed is the next demotion.

Beyond the paper (single replica): with several replicas, a request goes to the least-loaded replica on
which both conditions hold. Two more departures are options, off by default (their measured effect is in
the README): `track_progress` (protect what a running request still needs, not the speed recorded at its
admission) and `feasibility="offered-load"` (demote above the speed the current load allows, not above f(1)).
A third, `drift_correction`, is for live engines: it scales f(L) in the admission checks by how fast
admitted requests actually ran against what f(L) predicted for them (core/control/saber/speed_drift.py); with
`drift_quantile` the scale is a low quantile of those ratios instead of their mean.
`protect_running: false` is an ablation, not a mode: it drops the second condition of line 10 (the speed
recorded for every running request), so the benchmark can measure what that condition costs or gains.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from core.control.saber.speed_drift import SpeedDrift
from core.control.saber.speed_model import SpeedModel
from core.controller_api import (
    TIER_HIGH,
    TIER_LOW,
    ControlledRequest,
    HeldQueue,
    Policy,
    Release,
    ReplicaView,
    Verdict,
)

REQUIRED_SPEED_KEY = "saber_required_tps"  # ControlledRequest.state: the speed recorded at admission
PREDICTED_SPEED_KEY = "saber_predicted_tps"  # ControlledRequest.state: f(L+1) as fitted, at admission


def required_speed(max_tokens: int, deadline_s: float, now: float) -> float:
    """Tokens per second a request needs from now on to finish its `max_tokens` by its deadline
    (sec. IV-C step 1); infinite once the deadline has passed."""
    remaining = deadline_s - now
    if remaining <= 0:
        return math.inf
    return max_tokens / remaining


class SaberPolicy(Policy):
    name = "saber"
    passthrough = False

    def __init__(
        self,
        speed_model: SpeedModel,
        *,
        window_size: int = 4,
        best_effort_max_load: int | None = None,
        track_progress: bool = False,
        feasibility: str = "fastest",
        max_load: int = 100,
        demand_window_s: float = 10.0,
        fit_r2: dict[str, float] | None = None,
        drift_correction: bool = False,
        drift_quantile: float | None = None,
        send_priority: bool = False,
        protect_running: bool = True,
        seed: int = 0,
    ) -> None:
        if window_size < 1:
            raise ValueError(f"window_size must be at least 1 (got {window_size})")
        self.model = speed_model
        # drift_quantile (live only): the correction is a low quantile of recent ratios, not their mean.
        self.drift = SpeedDrift(quantile=drift_quantile) if drift_correction else None
        self.send_priority = send_priority
        self.fit_r2 = dict(fit_r2 or {speed_model.kind: speed_model.r2})  # R² of every model fitted (sec. VII)
        if feasibility not in ("fastest", "offered-load"):
            raise ValueError(f"feasibility must be 'fastest' or 'offered-load' (got {feasibility!r})")
        self.fastest_tps = speed_model.fastest_tps
        self.feasibility = feasibility
        # Offered-load feasibility: the engine's predicted throughput L * f(L) for L = 1..max_load, and the
        # output tokens asked for by the arrivals of the last `demand_window_s` seconds.
        self._throughput = np.maximum.accumulate([load * speed_model(load) for load in range(1, max_load + 1)])
        self.demand_window_s = demand_window_s
        self._arrivals: deque[tuple[float, int]] = deque()
        self._demanded_tokens = 0
        self._first_arrival_s: float | None = None
        self._next_demotion_s = math.inf
        self.threshold_tps = self.fastest_tps
        self.window_size = window_size
        self.best_effort_max_load = best_effort_max_load
        self.track_progress = track_progress
        self.protect_running = protect_running
        self._progress_at: dict[int, tuple[float, int]] = {}  # replica -> (last update, load since then)
        self.rng = np.random.default_rng(seed)
        self.high = HeldQueue()
        self.low = HeldQueue()
        # (demotion time, request id, request): when a high-tier request's required speed passes f(1).
        self._demotions: list[tuple[float, int, ControlledRequest]] = []
        self.demoted = 0
        self.admitted_high = 0
        self.released_low = 0
        # Why window requests were passed over (line 10), one count per request and replica evaluated: its own
        # required speed above f(L+1), or (its own met) a running request's recorded speed above f(L+1).
        self.refused_own = 0
        self.refused_running = 0

    # ------------------------------------------------------------ queue placement (sec. IV-C step 1)

    def _max_tokens(self, req: ControlledRequest) -> int:
        return req.spec.output_tokens

    def _required(self, req: ControlledRequest, now: float) -> float:
        return required_speed(self._max_tokens(req), req.deadline_s(), now)

    def _demotion_time(self, req: ControlledRequest) -> float:
        """When the required speed reaches f(1): deadline - max_tokens / f(1)."""
        return req.deadline_s() - self._max_tokens(req) / self.fastest_tps

    def _feasible_speed(self, now: float, replicas: int) -> float:
        """The speed above which a queued request counts as infeasible and is demoted.

        "fastest" (the paper, sec. IV-C step 1): f(1), what the engine gives one request alone.
        "offered-load" (our extension): f(L*), where L* is the smallest concurrency at which the replicas'
        predicted throughput L * f(L) carries the output tokens the arrivals have asked for over the last
        `demand_window_s` seconds. At light load L* = 1 and this is the paper's rule; under heavy load a
        request that could only meet its SLA by keeping the engine below the concurrency the load needs is
        treated as infeasible, so it no longer holds back the requests behind it (on an engine whose speed
        falls slowly with L, f(1) is barely above what long requests need, and the literal rule lets one
        such request pin the load near 1 for its whole run)."""
        if self.feasibility == "fastest" or self._first_arrival_s is None:
            return self.fastest_tps
        while self._arrivals and self._arrivals[0][0] < now - self.demand_window_s:
            self._demanded_tokens -= self._arrivals.popleft()[1]
        span = max(1.0, min(self.demand_window_s, now - self._first_arrival_s))
        demand_per_replica = self._demanded_tokens / span / max(1, replicas)
        load = int(np.searchsorted(self._throughput, demand_per_replica)) + 1  # smallest L with L f(L) >= demand
        return self.model(min(load, len(self._throughput)))

    def on_arrival(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> Verdict:
        if self._first_arrival_s is None:
            self._first_arrival_s = now
        self._arrivals.append((now, self._max_tokens(req)))
        self._demanded_tokens += self._max_tokens(req)
        self.threshold_tps = self._feasible_speed(now, len(replicas))
        if self._required(req, now) > self.threshold_tps:
            req.tier = TIER_LOW
            self.low.push(req)
            self.demoted += 1
            return Verdict.hold(TIER_LOW, reason="required speed above the fastest achievable f(1)")
        req.tier = TIER_HIGH
        self.high.push(req)
        demote_at = self._demotion_time(req)
        if math.isfinite(demote_at):
            heapq.heappush(self._demotions, (demote_at, req.request_id, req))
        return Verdict.hold(TIER_HIGH)

    def _demote_due(self, now: float, replicas: int) -> None:
        """Move high-tier requests whose required speed now exceeds the feasible speed to the low tier."""
        if self.feasibility == "offered-load":
            threshold = self.threshold_tps = self._feasible_speed(now, replicas)
            self._next_demotion_s = math.inf
            for req in list(self.high):
                demote_at = req.deadline_s() - self._max_tokens(req) / threshold
                if demote_at < now:
                    self.high.remove(req)
                    req.tier = TIER_LOW
                    self.low.push(req)
                    self.demoted += 1
                elif demote_at < self._next_demotion_s:
                    self._next_demotion_s = demote_at
            return
        heap = self._demotions
        while heap and heap[0][0] < now:
            _, _, req = heapq.heappop(heap)
            if req.tier == TIER_HIGH and REQUIRED_SPEED_KEY not in req.state:
                self.high.remove(req)
                req.tier = TIER_LOW
                self.low.push(req)
                self.demoted += 1

    def next_wakeup(self, now: float) -> float:
        if self.feasibility == "offered-load":
            return math.nextafter(self._next_demotion_s, math.inf) if len(self.high) else math.inf
        heap = self._demotions
        while heap and (heap[0][2].tier != TIER_HIGH or REQUIRED_SPEED_KEY in heap[0][2].state):
            heapq.heappop(heap)  # admitted or already demoted
        # Just after the instant its required speed passes f(1) (`_demote_due` demotes strictly after it).
        return math.nextafter(heap[0][0], math.inf) if heap else math.inf

    # ------------------------------------------------------------ admission control (Algorithm 1)

    def release(self, now: float, replicas: Sequence[ReplicaView]) -> list[Release]:
        self._demote_due(now, len(replicas))
        # Load and the highest required speed of a running request per replica, kept current as this call
        # admits.
        loads = {r.index: r.load for r in replicas}
        if not self.protect_running:
            floor = {r.index: 0.0 for r in replicas}  # ablation: line 10's second condition dropped
        elif self.track_progress:
            floor = {r.index: self._refreshed_floor(r, now) for r in replicas}
        else:
            floor = {r.index: _max_recorded(r) for r in replicas}
        releases: list[Release] = []
        while True:
            if len(self.high):  # line 5
                admitted = self._admit_one(now, replicas, loads, floor)  # lines 6-16
                if admitted is None:
                    break  # nothing in the window fits now; the next event may change that
                releases.append(admitted)
            elif len(self.low):  # lines 18-20
                released = self._release_low(replicas, loads, floor)
                if released is None:
                    break
                releases.append(released)
            else:
                break
        if self.track_progress:
            self._progress_at = {index: (now, load) for index, load in loads.items()}
        return releases

    def _refreshed_floor(self, replica: ReplicaView, now: float) -> float:
        """The speed the running requests on `replica` still need, from the recorded speed and timestamp.

        The paper records each admitted request's required speed with the time of admission (sec. IV-C
        step 2) and checks new admissions against it. Read literally, a request admitted just in time keeps
        blocking admissions until it finishes, even once it is ahead of schedule. With `track_progress` the
        policy estimates the tokens each running request has produced since admission by integrating its
        own model, f(load) over the time at each load, and protects what is left: (max tokens - estimated
        tokens) / time left. A running request that even f(1) can no longer bring in by its deadline is past
        saving (the analogue of demotion for a queued request) and is no longer protected. This is our
        reading, beyond the paper's text; the paper-literal check is `track_progress: false`."""
        last_t, load = self._progress_at.get(replica.index, (now, replica.load))
        gained = self._speed(load) * max(0.0, now - last_t) if load else 0.0
        floor = 0.0
        for req in replica.in_flight.values():
            if REQUIRED_SPEED_KEY not in req.state:
                continue  # best-effort (low tier): promised nothing
            done = req.state.get("saber_tokens_est", 0.0) + gained
            req.state["saber_tokens_est"] = done
            needed = required_speed(max(0, self._max_tokens(req) - int(done)), req.deadline_s(), now)
            if needed <= self.fastest_tps and needed > floor:
                floor = needed
        return floor

    def _admit_one(
        self, now: float, replicas: Sequence[ReplicaView], loads: dict[int, int], floor: dict[int, float]
    ) -> Release | None:
        window = self._window(now, idle=min(loads.values(), default=1) == 0)
        order = self.rng.permutation(len(window)) if len(window) > 1 else range(len(window))  # line 6
        for i in order:  # line 7
            req = window[int(i)]
            needed = self._required(req, now)  # line 9
            for index in sorted(loads, key=lambda k: (loads[k], k)):
                # line 8; an idle replica is judged by f as profiled: the drift is learnt from completions,
                # and an engine that admits nothing while it is idle would never learn that it sped up again.
                predicted = self._speed(loads[index] + 1) if loads[index] else self.model(1)
                if predicted < needed:  # line 10, first condition
                    self.refused_own += 1
                    continue
                if predicted < floor[index]:  # line 10, second condition
                    self.refused_running += 1
                    continue
                self.high.remove(req)  # line 13
                req.state[PREDICTED_SPEED_KEY] = self.model(loads[index] + 1)
                req.state["saber_admitted_s"] = now
                loads[index] += 1
                if self.drift is not None and needed > self._speed(1):
                    # A probe of an idle engine the drift says is too slow for it: it promises nothing to
                    # protect (the engine as it runs now cannot keep it), it measures the engine.
                    req.state[REQUIRED_SPEED_KEY] = 0.0
                else:
                    req.state[REQUIRED_SPEED_KEY] = needed  # the paper records it with the timestamp
                    if self.protect_running:
                        floor[index] = max(floor[index], needed)
                self.admitted_high += 1
                return Release(req, index)
        return None

    def _window(self, now: float, *, idle: bool = False) -> list[ControlledRequest]:
        """The requests Algorithm 1 samples (line 6): the first `window_size` of the high tier.

        With drift correction, the first `window_size` that the engine as it runs now could still serve in
        time (required speed within the corrected f(1)): the others stay in the high tier (the engine may
        speed up again, and demotion still follows the paper's f(1)) but do not fill the window, where they
        would block every admission behind them until the profiled f(1) demotes them. While a replica is
        idle, the paper's window: the drift is learnt from completions, so an idle engine must still admit."""
        if self.drift is None or idle:
            return self.high.head(self.window_size)
        fastest_now = self._speed(1)
        reachable = (req for req in self.high if self._required(req, now) <= fastest_now)
        return list(itertools.islice(reachable, self.window_size))

    def _release_low(
        self, replicas: Sequence[ReplicaView], loads: dict[int, int], floor: dict[int, float]
    ) -> Release | None:
        """Best-effort service of the low tier (lines 18-20), oldest first.

        The paper dequeues one low-tier request per pass of its loop while the high tier is empty, without
        a speed estimate. With no sleep between passes that would pour the whole low tier into the engine
        at once, and the requests admitted next (which can still meet their SLAs) would then face a load at
        which f(L+1) meets nobody. So "best-effort" here means: a low-tier request runs only where it takes
        no speed an admitted request was promised, i.e. f(L+1) still meets every required speed recorded on
        that replica (the second condition of line 10), and the replica's load stays below
        `best_effort_max_load` (None: no cap beyond that condition and the engine's own max_num_seqs)."""
        cap = self.best_effort_max_load
        for index in sorted(loads, key=lambda k: (loads[k], k)):
            if cap is not None and loads[index] >= cap:
                continue
            if self._speed(loads[index] + 1) < floor[index]:
                continue
            req = self.low.pop_left()
            loads[index] += 1
            self.released_low += 1
            return Release(req, index)
        return None

    def upstream_priority(self, req: ControlledRequest) -> int | None:
        """Live, with vLLM's `--scheduling-policy priority`: the low tier as vLLM's lower priority. The paper's
        engine serves a best-effort request only while no admitted one needs the capacity (sec. IV-C); vLLM
        queues what exceeds its batch first come, first served, so a best-effort request released into an
        idle moment would otherwise hold a batch slot ahead of the admitted requests that arrive next."""
        if not self.send_priority:
            return None
        return 1 if req.tier == TIER_LOW else 0

    def _speed(self, load: float) -> float:
        """f(load) as fitted, scaled by the measured drift when `drift_correction` is on."""
        speed = self.model(load)
        return speed if self.drift is None else speed * self.drift.ratio

    def on_finish(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> None:
        # Drift: what an admitted request got (its tokens over its time since admission) against f(L+1).
        predicted = req.state.get(PREDICTED_SPEED_KEY)
        if self.drift is not None and predicted is not None and req.dispatched_s is not None:
            self.drift.observe(predicted, req.tokens_out, now - req.dispatched_s)

    def drain(self) -> list[ControlledRequest]:
        self._demotions.clear()
        return self.high.take_all() + self.low.take_all()

    def describe(self) -> dict[str, Any]:
        return {
            "mode": self.name,
            "speed_model": self.model.describe(),
            "fit_r2": {kind: round(r2, 4) for kind, r2 in self.fit_r2.items()},
            "fastest_tps": round(self.fastest_tps, 3),
            "window_size": self.window_size,
            "best_effort_max_load": self.best_effort_max_load,
            "track_progress": self.track_progress,
            "feasibility": self.feasibility,
            "drift": None if self.drift is None else self.drift.describe(),
            "protect_running": self.protect_running,
            "admitted_high": self.admitted_high,
            "released_low": self.released_low,
            "demoted": self.demoted,
            "refused_own": self.refused_own,
            "refused_running": self.refused_running,
        }


def _max_recorded(replica: ReplicaView) -> float:
    """The highest required speed recorded at admission among the requests running on `replica`
    (best-effort requests carry none)."""
    return max((r.state.get(REQUIRED_SPEED_KEY, 0.0) for r in replica.in_flight.values()), default=0.0)
