"""SLOs-Serve as a scheduling mode (`mode: slos-serve`): the controller side of paper 004.

- Soft admission control (sec. 3.1, Algorithm 1): arrivals wait in the controller until the scheduler
  runs (every `schedule_window_s`, or at once when `schedule_batch` arrivals wait); then the admission DP
  (admission.py) decides, per replica, which of them can be served within their SLOs on top of the
  requests that replica already holds.
- Per-replica virtual schedulers (sec. 4.2): each replica's state is the plan's own (virtual.py), advanced
  with the performance model; the simulator's step planner reports real progress into it.
- SLO-driven sequential routing (sec. 4.2): a batch of arrivals goes first to the next replica in
  round-robin order; whatever that replica's DP declines is offered to the next replica, up to
  `routing_limit` replicas.
- Best-effort tier (sec. 4.1): a request no replica can attain is held in TIER_BEST_EFFORT and retried
  (with a fresh TTFT window, so it is served only where that costs no admitted request its SLOs) when a
  request finishes and every `best_effort_retry_s`; one still held at the end of the run becomes a
  `deferred` record. It counts in attainment as what it is: served late, or not served.
  The tier reserves nothing where our step planner runs the engine (stepping.py gives it only the tokens SLO
  requests leave and preempts it for an SLO request's memory or slot): there the admission DP for SLO
  arrivals leaves the best-effort requests out. Issue 21's cause: priced in the DP as if they held SLOs,
  they made every burst shrink the next one's admissions, and under bursty arrivals (inter-arrival CV 3-13)
  the default configuration attained less than `best_effort: false` (tests/test_slos_serve_policy.py pins
  it; docs/slos-serve.md has the figures). In front of vLLM's own batching (live, or `batch_formation:
  false`) nothing keeps the tier to leftovers, so there the DP still counts it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from core.control.slos_serve.admission import AdmissionPlanner, PlannerSettings, PlanRequest
from core.control.slos_serve.budget import BudgetModel
from core.control.slos_serve.stepping import SlosServeStepPlanner
from core.control.slos_serve.virtual import Tracked, VirtualReplica
from core.controller_api import (
    TIER_BEST_EFFORT,
    TIER_HIGH,
    ControlledRequest,
    HeldQueue,
    Policy,
    Release,
    ReplicaView,
    Verdict,
)
from core.profile import Calibration, KnobsSpec, SlosServeSpec
from core.step_time import StepTimeModel

PLAN_MARGIN = 0.9  # share of the TTFT SLO the plan promises the first token in
WINDOW_SHARE_OF_TTFT = 0.02  # an arrival waits for the scheduler at most this share of its TTFT SLO


class SlosServePolicy(Policy):
    name = "slos-serve"
    passthrough = False

    def __init__(
        self,
        calibration: Calibration,
        knobs: KnobsSpec,
        settings: SlosServeSpec | None = None,
        *,
        replicas: int = 1,
    ) -> None:
        self.settings = settings or SlosServeSpec()
        s = self.settings
        max_spec = s.max_spec_len if s.max_spec_len is not None else knobs.effective_spec_width
        self.planner_settings = PlannerSettings(
            max_batch_tokens=s.max_batch_tokens or knobs.max_num_batched_tokens,
            kv_capacity_tokens=calibration.kv_capacity_tokens,
            max_spec_len=max_spec,
            acceptance=calibration.default_acceptance,
            knee_efficiency=s.knee_efficiency,
            max_seqs=knobs.max_num_seqs,
        )
        self.model = StepTimeModel.from_calibration(calibration)
        idle = BudgetModel(self.model, [1.0], max_batch_tokens=self.planner_settings.max_batch_tokens)
        self._idle_prefill_tps = idle.plan(0).supply_tps
        planner = AdmissionPlanner(self.model, self.planner_settings)
        self.virtual = [VirtualReplica(i, planner) for i in range(replicas)]
        self.step_planners: dict[int, SlosServeStepPlanner] = {}
        self.routing_limit = min(replicas, s.routing_limit or replicas)
        self.pending = HeldQueue()  # arrived, waiting for the next scheduler invocation
        self.best_effort = HeldQueue()
        self._next_replica = 0  # the one-shot round-robin dispatcher's pointer
        self._best_effort_due = math.inf
        self._last_retry_s = -math.inf
        self._pending_due = math.inf  # when the scheduler must run for the arrivals waiting
        self.invocations = 0
        self.admitted = 0
        self.offloaded = 0

    # ------------------------------------------------------------ request SLOs

    def ttft_s(self, req: ControlledRequest) -> float:
        slo = req.spec.slo.ttft_s
        return slo if slo is not None else self.settings.default_ttft_s

    def tpot_s(self, req: ControlledRequest) -> float:
        slo = req.spec.slo.tpot_s
        return slo if slo is not None else self.settings.default_tpot_s

    def plan_request(self, req: ControlledRequest, deadline_s: float) -> PlanRequest:
        spec = req.spec
        return PlanRequest(
            spec.request_id,
            deadline_s,
            spec.prompt_tokens,
            max(0, spec.output_tokens - 1),
            self.tpot_s(req),
            spec.prompt_tokens + spec.output_tokens,
        )

    # ------------------------------------------------------------ the Policy interface

    def on_arrival(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> Verdict:
        # The plan aims a little inside the SLO (step times are noisy; the first token comes at a step's end).
        req.state["prefill_deadline_s"] = req.arrival_s + PLAN_MARGIN * self.ttft_s(req)
        if self.settings.schedule_window_s > 0.0 and self.settings.best_effort:
            if not self.pending:
                self._pending_due = math.inf
            self.pending.push(req)
            self._pending_due = min(self._pending_due, req.arrival_s + self._wait_limit(req))
            return Verdict.hold(TIER_HIGH)
        # Decide this arrival on its own, now.
        releases, declined = self._route(now, [req], _prefill_deadline, TIER_HIGH)
        if releases:
            self.admitted += 1
            return Verdict.release(releases[0].replica)
        if not self.settings.best_effort:
            return Verdict.reject("SLOs-Serve: no replica can attain its SLOs")
        self._offload(declined, now)
        return Verdict.hold(TIER_BEST_EFFORT)

    def release(self, now: float, replicas: Sequence[ReplicaView]) -> list[Release]:
        releases: list[Release] = []
        if self.pending and self._scheduler_due(now):
            self._pending_due = math.inf
            releases += self._schedule(now, self.pending.take_all())
        if self.best_effort and now >= self._best_effort_due:
            releases += self._retry_best_effort(now)
        return releases

    def on_finish(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> None:
        if req.replica is not None and req.replica < len(self.virtual):
            self.virtual[req.replica].remove(req.spec.request_id)
        if self.best_effort:
            # Capacity freed: try the best-effort tier soon (completions can come many per step; one retry
            # per fifth of the retry period is enough).
            soon = self._last_retry_s + self.settings.best_effort_retry_s / 5.0
            self._best_effort_due = min(self._best_effort_due, max(now, soon))

    def next_wakeup(self, now: float) -> float:
        wake = self._best_effort_due if self.best_effort else math.inf
        if self.pending:
            wake = min(wake, self._pending_due)
        return wake

    def step_planner(self, replica_index: int) -> SlosServeStepPlanner | None:
        """Algorithm 2's batch formation and adaptive speculation inside the simulated replica (stepping.py);
        None with `batch_formation: false` (admission control in front of vLLM's own batching)."""
        if not self.settings.batch_formation:
            return None
        planner = SlosServeStepPlanner(self.model, self.planner_settings, self._slos)
        self.step_planners[replica_index] = planner
        return planner

    def _slos(self, req: ControlledRequest) -> tuple[float, float]:
        return self.ttft_s(req), self.tpot_s(req)

    def drain(self) -> list[ControlledRequest]:
        return self.pending.take_all() + self.best_effort.take_all()

    def describe(self) -> dict[str, Any]:
        s = self.settings
        return {
            "mode": self.name,
            "replicas": len(self.virtual),
            "routing_limit": self.routing_limit,
            "schedule_window_s": s.schedule_window_s,
            "best_effort": s.best_effort,
            "batch_formation": s.batch_formation,
            "max_spec_len": self.planner_settings.max_spec_len,
            "max_batch_tokens": self.planner_settings.max_batch_tokens,
            "invocations": self.invocations,
            "admitted": self.admitted,
            "offloaded_to_best_effort": self.offloaded,
        }

    # ------------------------------------------------------------ scheduling

    def _wait_limit(self, req: ControlledRequest) -> float:
        """How long an arrival may wait for the scheduler: the window, but never more than a fiftieth of its
        TTFT SLO (a 15 ms TTFT cannot spend 10 ms waiting to be planned)."""
        return min(self.settings.schedule_window_s, WINDOW_SHARE_OF_TTFT * self.ttft_s(req))

    def _scheduler_due(self, now: float) -> bool:
        if len(self.pending) >= self.settings.schedule_batch:
            return True
        return now >= self._pending_due - 1e-12

    def _route(
        self,
        now: float,
        waiting: list[ControlledRequest],
        deadline: Callable[[ControlledRequest], float],
        tier: str,
    ) -> tuple[list[Release], list[ControlledRequest]]:
        """Sequential routing (sec. 4.2): offer `waiting` to replicas in turn from the round-robin pointer;
        each admits what its DP can attain; returns the releases and what no replica took. `deadline` gives a
        request's prefill deadline, asked only where a DP runs (a full replica declines without one)."""
        releases: list[Release] = []
        start = self._next_replica
        self._next_replica = (start + 1) % len(self.virtual)
        for hop in range(self.routing_limit):
            if not waiting:
                break
            replica = self.virtual[(start + hop) % len(self.virtual)]
            engine = self.step_planners.get(replica.index)
            if engine is not None:
                engine.sync(replica)
            self.invocations += 1
            # The tier reserves nothing only where our step planner gives it leftovers and preempts it for SLO
            # requests; in front of vLLM's own batching (live, or batch_formation off) it competes as an equal.
            with_best_effort = tier == TIER_BEST_EFFORT or engine is None
            held = replica.room(now, best_effort=with_best_effort)
            if held is None:
                # Every slot is held: the DP would decline all of `waiting` (overloaded runs: most retries).
                continue
            # `r.spec.request_id`, not the `request_id` property: ControlledRequest is not compiled, so the property
            # runs as an interpreted getter (~600 instructions; four reads a request a hop); the spec's field is native.
            by_id = {r.spec.request_id: r for r in waiting}
            deadline_of = {r.spec.request_id: deadline(r) for r in waiting}
            plans = [self.plan_request(r, deadline_of[r.spec.request_id]) for r in waiting]
            admission = replica.try_admit(now, plans, best_effort=with_best_effort, held=held)
            for rid in admission.admitted:
                req = by_id.pop(rid)
                req.tier = tier
                req.state["routing_hops"] = hop + 1
                req.state["plan_deadline_s"] = deadline_of[rid]
                replica.add(self._tracked(req, deadline_of[rid], tier == TIER_BEST_EFFORT), now)
                releases.append(Release(req, replica.index))
            waiting = [r for r in waiting if r.spec.request_id in by_id]
        return releases, waiting

    def _schedule(self, now: float, arrivals: list[ControlledRequest]) -> list[Release]:
        releases, declined = self._route(now, arrivals, _prefill_deadline, TIER_HIGH)
        self.admitted += len(releases)
        self._offload(declined, now)
        return releases

    def _offload(self, declined: list[ControlledRequest], now: float) -> None:
        for req in declined:
            req.tier = TIER_BEST_EFFORT
            self.best_effort.push(req)
            self.offloaded += 1
        if self.best_effort and math.isinf(self._best_effort_due):
            self._best_effort_due = now + self.settings.best_effort_retry_s

    def _retry_best_effort(self, now: float) -> list[Release]:
        """Serve best-effort requests where a fresh TTFT window fits without costing admitted requests
        their SLOs, oldest first; at most one scheduler batch per retry."""
        self._last_retry_s = now
        waiting = self.best_effort.head(self.settings.schedule_batch)

        def fresh(r: ControlledRequest) -> float:
            # A fresh window: the TTFT SLO, or twice the prompt's prefill time on an idle replica where that is
            # longer (a prompt the SLO is too tight for even alone would otherwise wait forever).
            return now + max(self.ttft_s(r), 2.0 * r.spec.prompt_tokens / self._idle_prefill_tps)

        releases, declined = self._route(now, waiting, fresh, TIER_BEST_EFFORT)
        idle = [v for v in self.virtual if not v.requests]
        if declined and idle:  # an idle replica serves the oldest one whatever the plan says
            req = declined[0]
            idle[0].add(self._tracked(req, fresh(req), True), now)
            releases.append(Release(req, idle[0].index))
        for release in releases:
            self.best_effort.remove(release.request)
        self._best_effort_due = now + self.settings.best_effort_retry_s if self.best_effort else math.inf
        return releases

    def _tracked(self, req: ControlledRequest, deadline_s: float, best_effort: bool) -> Tracked:
        spec = req.spec
        decode = max(0, spec.output_tokens - 1)
        return Tracked(
            request_id=spec.request_id,
            prompt_tokens=spec.prompt_tokens,
            prefill_deadline_s=deadline_s,
            prefill_left=float(spec.prompt_tokens),
            decode_left=float(decode),
            decode_total=decode,
            tpot_s=self.tpot_s(req),
            kv_tokens=spec.prompt_tokens + spec.output_tokens,
            best_effort=best_effort,
        )


def _prefill_deadline(req: ControlledRequest) -> float:
    """An arrival's prefill deadline, set by `on_arrival` (what its admission plans for)."""
    deadline: float = req.state["prefill_deadline_s"]  # as stored (no conversion: the same object)
    return deadline
