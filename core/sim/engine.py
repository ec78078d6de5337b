"""The simulation: clients -> controller (a scheduling mode) -> engine replicas, on one virtual clock.

- clients.py decides when requests leave the client (open loop with an optional in-flight cap, or closed
  loop with think time);
- the controller hands each request to the run's `Policy` (core/controller_api.py): released to a replica,
  held in one of its tiers, or rejected; after every arrival and every completion it asks the policy which
  held requests to release now;
- replica.py models each engine (continuous batching, chunked prefill, KV cache, speculation, roofline step
  time); a mode that plans batches itself gives the replica a step planner (stepwise.py).

fcfs (vLLM's default, `Policy.passthrough`) skips the controller's bookkeeping: a request goes straight to the
replica, so the single-replica fast path does exactly what the engine did before the controller existed.

Time. Each replica's `clock` is when its next step starts. The simulation always steps the busy replica with
the earliest clock, after releasing every arrival up to that time. With one replica this is the classic
loop (arrivals join the queue at the next step boundary). With several, an arrival is routed at the next
step boundary of the earliest busy replica (at most one engine step after it arrived) and an idle replica
that receives it starts at the arrival time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from core.backend_api import EngineSample, LoadPlan
from core.controller_api import ControlledRequest, Policy
from core.profile import Calibration, KnobsSpec
from core.records import RequestRecord, RequestSpec, Status
from core.sim.clients import ClientDriver
from core.sim.reach import RunReach, run_reach
from core.sim.replica import EngineReplica
from core.sim.replica_base import ReplicaBase, SimReplicaView
from core.sim.sim_request import SimRequest

TIER_FAST_PATH = "high"  # fcfs serves everything from one tier
STALLED = (
    "simulator stalled: a waiting request can never be admitted "
    "(its prompt needs more KV cache than the calibration holds)"
)


def _replica_rng(seed: int, index: int) -> np.random.Generator:
    # Replica 0 keeps the run's own stream, so a one-replica run is the same as before replicas existed.
    return np.random.default_rng(seed if index == 0 else [seed, index])


class SimEngine:
    """Runs a `LoadPlan` through a scheduling mode and `replicas` engine replicas in virtual time.

    Use `advance_until(t)` to process everything up to virtual time t (the console paces this against the
    wall clock), or `run()` to go to the end. Finished requests go to `on_record` as they complete.
    """

    def __init__(
        self,
        calibration: Calibration,
        knobs: KnobsSpec,
        plan: LoadPlan,
        *,
        seed: int = 0,
        policy: Policy | None = None,
        replicas: int = 1,
        on_record: Callable[[RequestRecord], None] | None = None,
        on_sample: Callable[[EngineSample], None] | None = None,
        sample_interval_s: float = 0.5,
        reference: bool = False,
    ) -> None:
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1 (got {replicas})")
        self.calibration = calibration
        self.knobs = knobs
        self.plan = plan
        self.policy = policy or Policy()
        self.on_record = on_record
        self.on_sample = on_sample
        self.sample_interval_s = sample_interval_s
        self._next_sample_s = 0.0
        self._last_sample = (0.0, 0.0)  # (clock, busy seconds) at the previous sample
        self.max_model_len = calibration.max_model_len
        power = calibration.power
        # PowerModel.power_w's line, its two numbers read once (sample() applies it: the same float operations).
        self._has_power = power is not None
        self._power_idle_w = 0.0 if power is None else float(power.idle_w)
        self._power_slope_w = 0.0 if power is None else float(power.slope_w())

        self.replicas = [self._make_replica(i, calibration, knobs, _replica_rng(seed, i)) for i in range(replicas)]
        self.views = [SimReplicaView(r) for r in self.replicas]
        self._passthrough = self.policy.passthrough and replicas == 1
        if self._passthrough:
            self.replicas[0].on_complete = self._on_served
        # fcfs on one plain replica (not a planner's) takes the hot loop (_advance_passthrough) and runs
        # stretches of decode-only steps in one call (decode_runs.run_decode_steps); `reference=True` steps every
        # iteration through step_once instead (the tests compare the two).
        self._plain_passthrough = self._passthrough and type(self.replicas[0]) is EngineReplica
        # A planner's replica runs stretches of plain decode steps the same way where its planner can promise
        # them (stepwise.StepwiseReplica.run_decode_steps; one replica: the stretch must not pass another's step).
        self._decode_runs = not reference and (
            self._plain_passthrough or (replicas == 1 and type(self.replicas[0]) is not EngineReplica)
        )
        # In an open loop a completion moves no client send unless a request waits for an in-flight slot
        # (ClientDriver.on_done only counts it; release would send the waiting one now), so a decode run may go
        # on past it (run_decode_steps' through_completions). A closed loop's client sends again after it.
        self.clients: ClientDriver
        self._runs_through_completions = (lambda: not self.clients.blocked) if plan.mode == "open" else None
        self._held = 0  # requests the policy holds
        self._policy_dirty = False  # something changed since the policy was last asked to release

        self.clock = 0.0
        self.records: list[RequestRecord] = []
        self.finished = False
        self.clients = ClientDriver(plan, self._on_send, self._on_not_sent)

    def _make_replica(
        self, index: int, calibration: Calibration, knobs: KnobsSpec, rng: np.random.Generator
    ) -> ReplicaBase[Any]:
        planner = self.policy.step_planner(index)
        if planner is None:
            return EngineReplica(index, calibration, knobs, rng, self._on_complete)
        from core.sim.stepwise import StepwiseReplica

        return StepwiseReplica(index, calibration, knobs, rng, self._on_complete, planner)

    # ------------------------------------------------------------ totals over replicas

    @property
    def busy_s(self) -> float:
        return sum(r.busy_s for r in self.replicas)

    @property
    def step(self) -> int:
        return sum(r.step for r in self.replicas)

    @property
    def preemptions(self) -> int:
        return sum(r.preemptions for r in self.replicas)

    @property
    def generated_tokens(self) -> float:
        return sum(r.generated_tokens for r in self.replicas)

    def reach(self) -> RunReach | None:
        """The knob values that would have made this same run (core/sim/reach.py), so far; None where other
        code than fcfs on one plain replica reads max_num_seqs (a mode's planner, a router)."""
        if not self._plain_passthrough:
            return None
        clients = self.clients
        return run_reach(
            self.plan.concurrency,
            self.knobs.max_num_seqs,
            seqs_probe=self.replicas[0].seqs_probe,
            open_loop=self.plan.mode == "open",
            peak_in_flight=clients.peak_in_flight,
            cap_held=clients.cap_held,
        )

    # ------------------------------------------------------------ controller

    def _on_send(self, spec: RequestSpec, t: float, scheduled: float) -> None:
        """A request left its client at `t`; latency is measured from `scheduled`."""
        if spec.output_tokens + spec.prompt_tokens > self.max_model_len:
            # vLLM refuses such a request with HTTP 400; so does the model.
            self._emit_unserved(
                spec,
                t,
                Status.ERROR,
                f"prompt+output {spec.prompt_tokens + spec.output_tokens} tokens "
                f"exceeds max_model_len {self.max_model_len}",
            )
            return
        if self._passthrough:  # _enqueue's work, without its keywords (once per request)
            self.replicas[0].enqueue(SimRequest.arrived(spec, scheduled, t, t, None, TIER_FAST_PATH), t)
            return
        controlled = ControlledRequest(spec=spec, arrival_s=scheduled)
        controlled.state["sent_s"] = t
        verdict = self.policy.on_arrival(controlled, t, self.views)
        controlled.tier = verdict.tier
        if verdict.action == "release":
            assert verdict.replica is not None
            self._dispatch(controlled, verdict.replica, t)
        elif verdict.action == "hold":
            self._held += 1
        else:
            self._emit_unserved(
                spec, t, Status.REJECTED, verdict.reason or "rejected by the scheduling mode", controlled
            )
        self._policy_dirty = True

    def _dispatch(self, controlled: ControlledRequest, replica: int, now: float) -> None:
        controlled.replica = replica
        controlled.dispatched_s = now
        self.views[replica].in_flight[controlled.request_id] = controlled
        self._enqueue(
            controlled.spec,
            replica,
            now,
            latency_from_s=controlled.arrival_s,
            sent_s=controlled.state.get("sent_s", now),
            tier=controlled.tier,
            controlled=controlled,
        )

    def _enqueue(
        self,
        spec: RequestSpec,
        replica: int,
        now: float,
        *,
        latency_from_s: float,
        sent_s: float,
        tier: str | None,
        controlled: ControlledRequest | None = None,
    ) -> None:
        """Hand `spec` to replica `replica` at `now` (the fast path's send, or the controller's release)."""
        self.replicas[replica].enqueue(SimRequest.arrived(spec, latency_from_s, sent_s, now, controlled, tier), now)

    def _ask_policy(self, now: float) -> None:
        """Release what the policy lets go now."""
        self._policy_dirty = False
        for release in self.policy.release(now, self.views):
            self._held -= 1
            self._dispatch(release.request, release.replica, now)

    def _on_complete(self, req: SimRequest, end: float, times: np.ndarray, sizes: np.ndarray | None) -> None:
        replica = self.replicas[0] if req.controlled is None else self.replicas[req.controlled.replica]
        self._emit(req, end, times, sizes, replica.index)
        controlled = req.controlled
        if controlled is not None:
            self.views[controlled.replica].in_flight.pop(controlled.request_id, None)
            controlled.tokens_out = req.spec.output_tokens
            self.policy.on_finish(controlled, end, self.views)
            self._policy_dirty = True

    # ------------------------------------------------------------ records

    def _emit(self, req: SimRequest, end: float, times: np.ndarray, sizes: np.ndarray | None, replica: int) -> None:
        spec = req.spec
        record = RequestRecord.served(
            spec,
            req.latency_from_s,
            req.sent_s,
            end,
            times,
            sizes,
            req.preemptions,
            req.tier,
            replica,
            req.dispatched_s,
        )
        self._publish(record, spec, end)

    def _on_served(self, req: SimRequest, end: float, times: np.ndarray, sizes: np.ndarray | None) -> None:
        """_on_complete on the fcfs fast path (nothing controlled, one replica): _emit, _publish and _keep in
        one call, once per request."""
        spec = req.spec
        record = RequestRecord.served(
            spec, req.latency_from_s, req.sent_s, end, times, sizes, req.preemptions, req.tier, 0, req.dispatched_s
        )
        self.clients.on_done(spec, end)
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)

    def _emit_unserved(
        self,
        spec: RequestSpec,
        t: float,
        status: Status,
        reason: str,
        controlled: ControlledRequest | None = None,
    ) -> None:
        """A request that no engine served: failed at send, rejected, or still held at the end (deferred)."""
        record = RequestRecord.from_spec(
            spec,
            arrival_s=None if controlled is None else controlled.arrival_s,
            sent_s=t if controlled is None else controlled.state.get("sent_s", t),
            status=status,
            end_s=None if status is Status.DEFERRED else t,
            error=reason,
            tier=None if controlled is None else controlled.tier,
        )
        self._publish(record, spec, t)

    def _on_not_sent(self, spec: RequestSpec) -> None:
        """Still queued client-side for an in-flight slot when the run's window closed: never sent."""
        record = RequestRecord.from_spec(
            spec, status=Status.NOT_SENT, error="still queued client-side when the run's duration ended"
        )
        self._keep(record)

    def _publish(self, record: RequestRecord, spec: RequestSpec, end: float) -> None:
        self.clients.on_done(spec, end)
        self._keep(record)

    def _keep(self, record: RequestRecord) -> None:
        self.records.append(record)
        if self.on_record is not None:
            self.on_record(record)

    # ------------------------------------------------------------ driving

    def _maybe_sample(self) -> None:
        if self.on_sample is None or self.clock < self._next_sample_s:
            return
        self._next_sample_s = self.clock + self.sample_interval_s
        self.on_sample(self.sample())

    def sample(self) -> EngineSample:
        """A snapshot. `busy_s` is the cumulative busy time (modelled energy integrates it, so an
        idle gap between samples adds nothing); power is the calibration's power model (PowerModel.power_w) at
        the busy share of the replicas' time since the previous sample."""
        replicas = self.replicas
        if len(replicas) == 1:
            # The sums below over one replica, without the generators (47k samples in a 100k run): 0 + x is x.
            only = replicas[0]
            running, busy_s, waiting = only.running, only.busy_s, len(only.waiting)
            kv_usage, preemptions, generated = only.kv_usage, only.preemptions, only.generated_tokens
        else:
            running = sum(r.running for r in replicas)
            busy_s = self.busy_s
            waiting = sum(len(r.waiting) for r in replicas)
            kv_usage = sum(r.kv_usage for r in replicas) / len(replicas)
            preemptions, generated = self.preemptions, self.generated_tokens
        clock = self.clock
        last_time_s, last_busy_s = self._last_sample
        self._last_sample = (clock, busy_s)
        span_s = (clock - last_time_s) * len(replicas)
        utilisation = min(1.0, (busy_s - last_busy_s) / span_s) if span_s > 0 else (1.0 if running else 0.0)
        # Positionally, in EngineSample's field order (time_s, running, waiting, kv_usage, preemptions_total,
        # generated_tokens_total, spec_draft_tokens_total, spec_accepted_tokens_total, power_w, busy_s): half the
        # cost of the keywords, 47k samples in a 100k bench-chat run (tests/test_sim_requests.py holds it).
        return EngineSample(
            clock,
            running,
            waiting + len(self.clients.blocked) + self._held,
            kv_usage,
            preemptions,
            int(generated),
            None,
            None,
            self._power_idle_w + self._power_slope_w * utilisation if self._has_power else None,
            float(busy_s),
        )

    def _next_replica(self) -> ReplicaBase[Any] | None:
        """The busy replica whose next step starts first."""
        if len(self.replicas) == 1:
            only = self.replicas[0]
            return only if only.has_work() else None
        busy = [r for r in self.replicas if r.has_work()]
        return min(busy, key=lambda r: (r.clock, r.index)) if busy else None

    def _finish(self) -> None:
        """Nothing more can happen: whatever the policy still holds was never served (deferred)."""
        for controlled in self.policy.drain():
            self._held -= 1
            self._emit_unserved(
                controlled.spec,
                self.clock,
                Status.DEFERRED,
                f"still in the {controlled.tier} tier when the run ended",
                controlled,
            )
        if self._held:
            raise RuntimeError(f"scheduling mode {self.policy.name!r} lost {self._held} held request(s) at drain()")
        if self.clients.done():
            self.finished = True

    def advance_until(self, until_s: float) -> bool:
        """Process events up to virtual time `until_s`. Returns True when the whole plan is done."""
        if self._plain_passthrough:
            return self._advance_passthrough(until_s)
        clients = self.clients
        policy = self.policy
        while not self.finished:
            clients.release(self.clock)
            if not self._passthrough and (self._policy_dirty or policy.next_wakeup(self.clock) <= self.clock):
                self._ask_policy(self.clock)
            replica = self._next_replica()
            if replica is None:
                wakeup = math.inf if self._passthrough else policy.next_wakeup(self.clock)
                next_event = min(clients.next_send_time(), wakeup)
                if next_event == math.inf and self._held:
                    # Idle with requests held: the policy's last chance to serve them, else deferred.
                    self._ask_policy(self.clock)
                    if self._next_replica() is not None:
                        continue
                    self._finish()
                    continue
                if not self._idle_to(next_event, until_s):
                    break
                continue
            if replica.clock >= until_s:
                break
            if len(self.replicas) > 1 and replica.clock > self.clock:
                # Route the arrivals due before this replica's step first (other replicas may be idle).
                self.clock = replica.clock
                continue
            if self._decode_runs and replica.run_decode_steps(
                self.clock,
                min(clients.next_send_time(), policy.next_wakeup(self.clock)),
                until_s,
                self._next_sample_s if self.on_sample else math.inf,
            ):
                self.clock = max(self.clock, replica.clock)
                self._maybe_sample()
                continue
            if not replica.step_once():
                # Nothing schedulable (should not happen with a non-empty queue); avoid spinning.
                raise RuntimeError(STALLED)
            self.clock = max(self.clock, replica.clock) if len(self.replicas) == 1 else self.clock
            self._maybe_sample()
        return self.finished

    def _idle_to(self, next_event: float, until_s: float) -> bool:
        """No replica is busy and nothing is held: idle virtual time passes to `next_event`, or to `until_s` if
        that comes first. False when advance_until stops: at `until_s`, or with no event left (then the run
        is finished unless a request is still in flight or waits for a slot)."""
        if next_event == math.inf:
            self.finished = self.clients.idle()
            return False
        if next_event > until_s:
            self.clock = max(self.clock, until_s)
            return False
        self.clock = max(self.clock, next_event)
        return True

    def _advance_passthrough(self, until_s: float) -> bool:
        """advance_until for fcfs on one plain replica, the simulator's hot loop (one pass per arrival, completion,
        engine sample or eventful step: 250k for 100k bench-chat requests): the same steps in the same order,
        without what cannot happen here (no policy to ask, nothing held, one replica to choose) and with the
        replica's and the sampler's tests inlined."""
        clients = self.clients
        replica = self.replicas[0]
        assert isinstance(replica, EngineReplica)  # (_plain_passthrough's test; narrows the type)
        # run_decode_steps' entry test is made here, the stall clock's part once (decode_runs.decode_run).
        decode_runs = self._decode_runs and replica._stalls is None
        through_completions = self._runs_through_completions
        sampling = self.on_sample is not None
        while not self.finished:
            clients.release(self.clock)
            if not (replica.running_order or replica.waiting):  # idle: jump to the next send
                if not self._idle_to(clients.next_send_time(), until_s):
                    break
                continue
            if replica.clock >= until_s:
                break
            if (
                not (
                    decode_runs
                    and replica.decoding
                    and not replica.prefilling
                    # A waiting request the next step admits (after each arrival): run_decode_steps would return 0.
                    and not (replica.waiting and replica.admits_head())
                    and replica.decode_run(
                        self.clock,
                        clients.next_send_time(),
                        until_s,
                        self._next_sample_s if sampling else math.inf,
                        through_completions,
                    )
                )
                and not replica.step_once()
            ):
                raise RuntimeError(STALLED)
            if replica.clock > self.clock:
                self.clock = replica.clock
            if sampling and self.clock >= self._next_sample_s:
                self._maybe_sample()
        return self.finished

    def run(self) -> list[RequestRecord]:
        self.advance_until(math.inf)
        return self.records


def simulate(calibration: Calibration, knobs: KnobsSpec, plan: LoadPlan, seed: int = 0) -> list[RequestRecord]:
    """Run `plan` to its end on one fcfs replica: the engine SABER's offline phase profiles (core/modes.py)."""
    return SimEngine(calibration, knobs, plan, seed=seed).run()
