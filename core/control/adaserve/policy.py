"""AdaServe as a scheduling mode: a `Policy` whose engine replicas plan each step with token trees.

The controller side is vLLM's (release on arrival to the least-loaded replica): AdaServe decides nothing
before a request reaches an engine. Its decisions are per engine step (paper 002, sec. 5.1): the planner
gives every decoding request a token tree sized to its TPOT SLO (scheduler.TreeScheduler), prefills like
vLLM with the token budget the verification leaves, and tells the replica how many tokens each request
emits, drawn from the token-level model's true acceptance (speculation.py).

Speculation that cannot pay costs nothing (issue 21; `adaserve.must_pay`): a step drafts only when some
request's TPOT or end-to-end SLO is at stake or queued requests wait for the room decodes hold, and a step
carrying a prompt chunk verifies only the draft tokens that are free beside it (TreeScheduler.budget).
Otherwise the step is vLLM's, so on prefill-heavy or SLO-slack traffic AdaServe degrades to fcfs.

`StaticSpeculationPolicy` is the paper's vLLM-Spec(k) baseline on the same token-level model and path, so
a comparison differs only in how the verification tokens are chosen.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from core.control.adaserve.scheduler import (
    NO_PREFILL,
    AcceptanceRun,
    DecodeBatch,
    PrefillLoad,
    StaticScheduler,
    TreeScheduler,
    draw_run,
    float_array,
)
from core.control.adaserve.step_lengths import StepLengths
from core.control.adaserve.stretch import SelectionStretch, Throughput, advance, build_stretch, stretch_steps
from core.controller_api import ControlledRequest, Policy
from core.pickling import reduce_by_fields
from core.profile import AdaServeSpec, Calibration, KnobsSpec
from core.step_planner_api import BatchPlan, StepReplicaView, StepRequest, plan_fcfs_prefill
from core.step_time import StepTimeModel

Scheduler = TreeScheduler | StaticScheduler
NO_TPOT_PRIORITY = 1_000_000  # vLLM priority of a request without a TPOT SLO: after every one that has one


@dataclass(slots=True)
class _Tracked:
    """What the planner keeps of one decoding request (on its StepRequest.planned): its SLOs and its randomness
    ahead."""

    deadline: float  # TreePlanner._deadline
    tpot_s: float  # inf: no TPOT SLO
    first_token_s: float
    output_tokens: int  # the request's output length (its spec's, fixed)
    run: AcceptanceRun  # NOTHING_DRAWN until its first speculating step

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


# A run with no step left: a request's randomness is drawn at its first speculating step, not before.
NOTHING_DRAWN = AcceptanceRun(np.empty(0), np.empty(0), np.empty(0), 0)


class TreePlanner:
    """A `StepPlanner` (core/step_planner_api.py) around a per-step decode scheduler."""

    wants_acceptance = True

    def __init__(self, scheduler: Scheduler, spec: AdaServeSpec, *, shortcut: bool = True) -> None:
        self.scheduler = scheduler
        self.spec = spec
        # Serve steps whose budget holds every candidate without the selection (same outcome, faster).
        self.shortcut = shortcut
        self._last_plan = BatchPlan()
        self._steps = StepLengths()  # the replica's step lengths, for _slo_at_stake
        self._last_plan_s = 0.0  # when the planner last planned a step
        self._stake_start = 0  # _slo_at_stake's first position to check: where it last found a request at stake
        self._no_prefill: PrefillLoad | None = None  # _prefill_load's answer with nothing queued or prefilling
        self._at_stake = False  # whether _slo_at_stake found a request at stake in the last step planned
        # The throughput phase asked directly (TreeScheduler.throughput_step; the static baseline has none) and
        # whether Algorithm 2 runs its SLO phase for requests behind (the spec is frozen: read once).
        self._throughput = scheduler.throughput_step if isinstance(scheduler, TreeScheduler) else None
        self._slo_selection = scheduler.spec.slo_selection
        # Throughput selection steps computed several at once while the batch and B stay (stretch.py); tests
        # turn it off for the step-by-step reference.
        self.stretches = True
        self._stretch: SelectionStretch | None = None

    def plan(self, replica: StepReplicaView, now: float) -> BatchPlan:
        decoding = replica.decoding
        batch = BatchPlan()
        verified = 0
        prefill = NO_PREFILL
        if self.scheduler.must_pay:
            last_step_s, self._last_plan_s = now - self._last_plan_s, now
            if decoding:
                # Decoding requests were in the last step, so it ran back to back with this one: no idle gap.
                self._steps.add(last_step_s)
                at_stake = self._at_stake = self._slo_at_stake(replica, now)
                if at_stake or replica.waiting:
                    prefill = self._prefill_load(replica)
                if not at_stake and not prefill.held_back:
                    return self._plain_decode(replica, batch)
        if decoding:
            n = len(decoding)
            budget, spec_steps, full = self.scheduler.layout(n, replica.kv_used, prefill)
            if full is not None and self.shortcut:
                self._stretch = None  # (the runs advance outside the stretch)
                verified = self._plan_full_trees(decoding, full, batch)
            elif budget <= n:
                self._stretch = None
                return self._roots_only(replica, batch)
            else:
                stretch = self._stretch
                taken = None
                if stretch is not None and full is None:
                    # (A stretch is TreeScheduler's: the cast only tells mypy, which mypyc needs.)
                    taken = stretch.take(decoding, budget, cast(TreeScheduler, self.scheduler).shape(n, budget))
                steps = 0  # of a stretch built at this step (asked before the columns, which it makes needless)
                if taken is None:
                    self._stretch = None  # (a step that advances the runs on its own ends the lockstep)
                    if self.stretches and full is None and self._throughput is not None:
                        steps = stretch_steps(decoding, self._slo_selection, self._drawn_run)
                    if steps <= 1:
                        columns, needs = self._step_columns(replica, now, prefill, budget, spec_steps)
                if (
                    steps > 1
                    or taken is not None
                    or (full is None and self._throughput is not None and (needs is None or not self._slo_selection))
                ):
                    # Nobody behind (every bench-chat selection step): the throughput phase, on the columns or
                    # from the stretch of such steps computed at once (stretch.py). Each way here has a TreeScheduler
                    # and its throughput phase (a stretch, or steps > 1, came from it): the casts tell mypy so.
                    tree = cast(TreeScheduler, self.scheduler)
                    throughput = cast(Throughput, self._throughput)
                    if taken is not None:
                        counts, emitted = taken
                        tree.selection_steps += 1
                    elif steps > 1:
                        advance(decoding)  # (this step's entries, as the columns would take them)
                        dims = tree.shape(n, budget)
                        stretch = self._stretch = build_stretch(decoding, dims, budget, steps, throughput)
                        counts, emitted = stretch.verified[0], stretch.emitted[0]
                        tree.selection_steps += 1
                    else:
                        counted, drawn = throughput(columns[: 2 * n], columns[2 * n :], budget)
                        counts = counted.tolist()
                        emitted = drawn.tolist()
                    verified = budget  # (the phase marks exactly B - n candidates beside the n roots; B > n)
                    batch.spec_steps = spec_steps  # (layout's d for this B and n, as scheduler.step answers)
                else:
                    decision = self.scheduler.step(self._decode_batch(columns, needs, budget))
                    counts = decision.verified.tolist()
                    emitted = decision.emitted.tolist()
                    verified = sum(counts)
                    # A step that drafts nothing runs no draft passes.
                    batch.spec_steps = decision.spec_steps if verified > n else 0
                batch.decode = list(zip(decoding, counts, strict=True))
                batch.emitted = emitted
                self.scheduler.record(n, verified, sum(emitted))
        if replica.prefilling or replica.waiting:  # (nothing to prefill otherwise)
            plan_fcfs_prefill(replica, batch, replica.token_budget - verified)
        self._last_plan = batch
        return batch

    def plain_decode_check(self, replica: StepReplicaView) -> Callable[[float], bool] | None:
        """The replica's stretch hook (PlainDecodePlanner, core/step_planner_api.py). With speculation that must
        pay (issue 21), nothing prefilling and nothing queued, `plan` gives vLLM's plain decode step exactly
        when no decoding request's SLO is at stake (`_slo_at_stake`), and that answer depends only on the
        clock, the KV in use, the tokens each request has left and the replica's step lengths. `fits` asks it
        as `plan` would for the step about to start (the replica's clock; `kv_used`; every request's tokens
        less the steps this stretch has run so far) and, where it answers True (the step then runs), keeps
        what `plan` keeps of a plain step: its length among the last ones, when it planned, the scheduler's
        counts. A False changes nothing, so `plan` then asks the same question afresh."""
        if self._at_stake or not self.scheduler.must_pay or replica.waiting or replica.prefilling:
            # (At stake last step, a request usually still is: `plan` then asks, and nothing is asked twice.)
            return None
        decoding = replica.decoding
        n = len(decoding)
        step_time = replica.model.step_time
        token_budget = replica.token_budget
        lengths = self._steps
        sums = lengths.sums
        record = self.scheduler.record
        ran = 0  # steps this stretch has run (the requests' out_left is brought up to date after it)

        def fits(kv_used: float) -> bool:
            nonlocal ran
            now = replica.clock  # the step's start, where step_once plans it
            last_step_s = now - self._last_plan_s
            seen = len(sums)  # the steps kept once this one is added (StepLengths.add)
            if seen + 1 > 2 * StepLengths.KEEP:
                return False  # (the add would drop the oldest half; `plan` does it)
            busy = sums[-1] + last_step_s  # the running sum after the add, as StepLengths.add computes it
            spike_s = step_time(token_budget, kv_used, 0, n + 1)
            # _slo_at_stake's test; sums[-1 - k] after the add is sums[-k] now (k >= 1).
            for item in decoding:
                track: _Tracked | None = item.planned  # (typed: native field reads, not generic ones)
                deadline = (track if track is not None else self._track(item)).deadline
                left = item.out_left - ran
                k = left if left < seen else seen
                if now + (left - 1) * (busy - sums[-k]) / k + spike_s > deadline:
                    return False
            lengths.add(last_step_s)
            self._last_plan_s = now
            record(n, n, n)
            ran += 1
            return True

        return fits

    def _plain_decode(self, replica: StepReplicaView, batch: BatchPlan) -> BatchPlan:
        """vLLM's step without speculation: one token per decoding request, no draft pass, prefill after."""
        decoding = replica.decoding
        batch.decode = [(item, 1) for item in decoding]
        batch.emitted = [1] * len(decoding)
        self.scheduler.record(len(decoding), len(decoding), len(decoding))
        if replica.prefilling or replica.waiting:  # (nothing to prefill otherwise)
            plan_fcfs_prefill(replica, batch, replica.token_budget - len(decoding))
        self._last_plan = batch
        return batch

    def _roots_only(self, replica: StepReplicaView, batch: BatchPlan) -> BatchPlan:
        """A step whose budget holds no draft token beside the roots: what `scheduler.step` answers for it
        (every request verifies and emits its root alone, no draft pass), without building the batch's arrays.
        Each request still takes this step's entry of its randomness, as the general path does."""
        for item in replica.decoding:
            self._next_run(item)
        self.scheduler.roots_only()
        return self._plain_decode(replica, batch)

    def _slo_at_stake(self, replica: StepReplicaView, now: float) -> bool:
        """Whether speculation can pay this step (issue 21): some decoding request would miss its TPOT or
        end-to-end SLO if it emitted one token per step from here on, one of its `left` steps a full prompt
        chunk (chunked prefill may schedule one in any step, and a request cruising just inside its SLO would
        have no slack left to absorb it) and the others as long on average as the replica's last
        `left` steps were (prefill-heavy ones included: a request that shares steps with long prompts is at
        stake sooner).

        Draft passes lengthen the step for every request in it and for those arriving during it (their first
        token waits for it), and the tokens they add buy nothing that counts when every request meets its SLOs
        without them; then the step runs as vLLM's would. TPOT is (end - first token) / (tokens after the
        first), as core/metrics scores it; a TTFT SLO is settled before decoding starts."""
        decoding = replica.decoding
        spike_s = replica.model.step_time(replica.token_budget, replica.kv_used, 0, len(decoding) + 1)
        sums = self._steps.sums
        seen = len(sums) - 1
        busy = sums[-1]
        # The answer is whether any request is at stake, so the order of the checks does not change it: start
        # at the position of the request found at stake last step (it usually still is, and the scan ends there).
        start = self._stake_start
        if start >= len(decoding):
            start = 0
        for position, item in enumerate(decoding[start:] + decoding[:start] if start else decoding, start):
            track: _Tracked | None = item.planned  # (typed: native field reads, not generic ones)
            deadline = (track if track is not None else self._track(item)).deadline
            left = item.out_left
            k = left if left < seen else seen  # StepLengths.mean_of_last(left), inline (once per request per step)
            if now + (left - 1) * (busy - sums[-1 - k]) / k + spike_s > deadline:
                self._stake_start = position % len(decoding)
                return True
        return False

    @staticmethod
    def _deadline(item: StepRequest) -> float:
        """When its last token must come for the request to meet its SLOs that decoding can still change:
        TPOT, (end - first token) / (tokens after the first) as core/metrics scores it, and end to end (a TTFT
        SLO is settled before decoding starts); inf without either."""
        slo = item.req.spec.slo
        deadline = math.inf
        if slo.tpot_s is not None:
            deadline = item.chunk_times[0] + slo.tpot_s * (item.spec.output_tokens - 1)
        if slo.e2e_s is not None:
            deadline = min(deadline, item.req.latency_from_s + slo.e2e_s)
        return deadline

    def accepted(self, request: StepRequest, verified: int, rng: np.random.Generator) -> int:
        """What the last plan drew for `request` (1 + accepted draft tokens, never above `verified`); the
        replica reads the same from the plan itself (BatchPlan.emitted)."""
        plan = self._last_plan
        for (item, _), tokens in zip(plan.decode, plan.emitted or (), strict=False):
            if item is request:
                return tokens
        return 1

    def _plan_full_trees(self, decoding: list[StepRequest], shape: tuple[int, int], batch: BatchPlan) -> int:
        """Every request verifies its whole (d, w) candidate tree; returns the positions verified."""
        depth, width = shape
        size = depth * width
        emitted: list[int] = []
        total = 0
        for item in decoding:
            track: _Tracked | None = item.planned  # (typed: native field reads, not generic ones)
            if track is None or track.run.next >= track.run.length:
                run = self._next_run(item)
            else:  # (the common case of _next_run, inline)
                run = track.run
                run.next += 1
            known = run.full.get(shape)
            if known is None or len(known) < run.next:
                known = run.full_tree_accepted(depth, width, run.next - 1)
            tokens = 1 + known[run.next - 1]
            emitted.append(tokens)
            total += tokens
        batch.emitted = emitted
        verify = size + 1
        batch.decode = [(item, verify) for item in decoding]
        batch.spec_steps = depth
        self.scheduler.record(len(decoding), len(decoding) * (size + 1), total)
        return len(decoding) * (size + 1)

    def _next_run(self, item: StepRequest) -> AcceptanceRun:
        """The request's randomness, advanced to this step (entry `next - 1` is this step's)."""
        run = self._drawn_run(item)
        run.next += 1
        return run

    def _drawn_run(self, item: StepRequest) -> AcceptanceRun:
        """The request's randomness with this step's entry drawn (entry `next`), not advanced."""
        track: _Tracked | None = item.planned  # (typed: native field reads, not generic ones)
        if track is None:
            track = self._track(item)
        run = track.run
        if run.next >= run.length:
            run = track.run = draw_run(self.scheduler.rng, item.acceptance, item.out_left + 1, self.spec)
        return run

    def _step_columns(
        self, replica: StepReplicaView, now: float, prefill: PrefillLoad, budget: int, spec_steps: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """This step's randomness for every decoding request, as one array: the draft's estimates, then the true
        rates (the step prices both in one pass), then the uniforms; and the needs A(r) - 1 (`budget` and
        `spec_steps`: scheduler.layout's), None when no request is behind (need > 0), the only way select()
        reads them."""
        decoding = replica.decoding
        step_s = -1.0  # t_spec of A(r) (_spec_step_s), asked at the first request with a TPOT SLO
        # Columns as Python lists, turned into one array (faster than an array of row tuples).
        estimates: list[float] = []
        truths: list[float] = []
        uniforms: list[float] = []
        add_estimate, add_truth, add_uniform = estimates.append, truths.append, uniforms.append
        needs: list[float] | None = None  # made at the first request with a TPOT SLO (0.0 for those before it)
        behind = False
        inf = math.inf
        for item in decoding:
            track: _Tracked | None = item.planned  # (typed: native field reads, not generic ones)
            if track is not None and (run := track.run).next < run.length:  # (the common case of _next_run)
                step = run.next
                run.next = step + 1
            else:
                run = self._next_run(item)
                track = cast(_Tracked, item.planned)  # (_next_run tracks it)
                step = run.next - 1
            if step >= run.listed:  # (the run's lists are filled as steps reach them)
                run.list_through(step + 1)
            if track.tpot_s < inf:
                if step_s < 0.0:
                    step_s = self._spec_step_s(replica, prefill, budget, spec_steps)
                # A(r) - 1 = (l + t_spec) / TPOT - o - 1 with l from the first token and o the tokens after it
                # (o = item.generated, from the output length the track keeps).
                need = (now - track.first_token_s + step_s) / track.tpot_s - (track.output_tokens - item.out_left)
                if need > 0.0:
                    behind = True
                if needs is None:
                    needs = [0.0] * len(truths)
                needs.append(need)
            elif needs is not None:  # no TPOT SLO: x / inf - o is never above 0, and select() reads need > 0 only
                needs.append(0.0)
            add_truth(run.truth_list[step])
            add_estimate(run.estimate_list[step])
            add_uniform(run.uniform_list[step])
        estimates += truths
        estimates += uniforms
        return float_array(estimates), np.array(needs) if behind else None

    @staticmethod
    def _decode_batch(columns: np.ndarray, needs: np.ndarray | None, budget: int) -> DecodeBatch:
        """`scheduler.step`'s batch on `_step_columns`' answer: its columns views of the one array."""
        n = len(columns) // 3
        paired = columns[: 2 * n]
        return DecodeBatch(budget, needs, paired[n:], paired[:n], columns[2 * n :], paired, behind=needs is not None)

    def _spec_step_s(self, replica: StepReplicaView, prefill: PrefillLoad, budget: int, spec_steps: int) -> float:
        """t_spec of A(r): this step's time (before noise) at the planned verification tokens plus the prefill
        that will share the step."""
        if self.scheduler.must_pay:
            prompt, prompts = prefill.tokens, prefill.sequences
        else:  # what is pending, within what the verification leaves of the budget
            prompt = self._prefill_tokens(replica, max(replica.token_budget - budget, 0))
            prompts = int(prompt > 0)
        return replica.model.step_time(budget + prompt, replica.kv_used, spec_steps, len(replica.decoding) + prompts)

    def _track(self, item: StepRequest) -> _Tracked:
        """Start keeping a decoding request (its first token has come); its randomness waits for its first
        speculating step. Kept on the request itself, so it goes when the request does."""
        tpot = item.req.spec.slo.tpot_s
        track = _Tracked(
            self._deadline(item),
            math.inf if tpot is None else tpot,
            item.chunk_times[0],
            item.spec.output_tokens,
            NOTHING_DRAWN,
        )
        item.planned = track
        return track

    def _prefill_load(self, replica: StepReplicaView) -> PrefillLoad:
        """The prefill vLLM would put beside this step's decodes at one token each (plan_fcfs_prefill), less the
        queued requests the KV cache cannot hold yet (the replica admits in order and stops at the first that
        does not fit: core/sim/stepwise.py)."""
        if not replica.waiting and not replica.prefilling:  # nothing to prefill (most steps): kept, not rebuilt
            empty = self._no_prefill
            if empty is None or empty.token_budget != replica.token_budget:
                empty = self._no_prefill = PrefillLoad(0, 0, replica.token_budget, False)
            return empty
        scratch = BatchPlan()
        plan_fcfs_prefill(replica, scratch, replica.token_budget - len(replica.decoding))
        tokens = sequences = admitted = 0
        kv_used = replica.kv_used
        block = replica.block
        out_of_kv = False
        for item, chunk in scratch.prefill:
            if item.admitted_order < 0:  # still queued: admitted only if its prompt's KV fits
                need = -(-(item.context + item.prompt_left + 1) // block) * block - item.context
                if kv_used + need > replica.kv_capacity:
                    out_of_kv = True
                    break
                kv_used += need
                admitted += 1
            tokens += chunk
            sequences += 1
        left_out = len(replica.waiting) > admitted and (out_of_kv or replica.running + admitted >= replica.max_seqs)
        return PrefillLoad(tokens, sequences, replica.token_budget, left_out)

    @staticmethod
    def _prefill_tokens(replica: StepReplicaView, room: int) -> int:
        """Prompt tokens pending in the replica, up to `room` (what a step could prefill)."""
        pending = 0
        for queue in (replica.prefilling, replica.waiting):
            for r in queue:
                pending += r.prompt_left
                if pending >= room:
                    return room
        return pending


class AdaServePolicy(Policy):
    """`mode: adaserve`: SLO-customized speculative decoding in every replica (settings: `adaserve:`)."""

    name = "adaserve"

    def __init__(
        self,
        spec: AdaServeSpec,
        calibration: Calibration,
        seed: int = 0,
        *,
        shortcut: bool = True,
        send_priority: bool = False,
    ) -> None:
        self.spec = spec
        self.calibration = calibration
        self.seed = seed
        # Live: send urgency as vLLM's priority, only when the server schedules by priority (the profile's
        # knobs.scheduling_policy): under FCFS the field does nothing, and older vLLM releases refuse it.
        self.send_priority = send_priority
        self.shortcut = shortcut  # TreePlanner.shortcut (tests turn it off to check it changes nothing)
        self.planners: list[TreePlanner] = []

    def step_planner(self, replica_index: int) -> TreePlanner:
        rng = np.random.default_rng([self.seed, replica_index, 2])
        scheduler = TreeScheduler(self.spec, StepTimeModel.from_calibration(self.calibration), rng)
        planner = TreePlanner(scheduler, self.spec, shortcut=self.shortcut)
        self.planners.append(planner)
        return planner

    def upstream_priority(self, req: ControlledRequest) -> int | None:
        """Live approximation (a vLLM verifies one speculation setting for the whole batch, so per-request
        trees cannot run there): urgency by TPOT SLO. vLLM's priority scheduling serves lower values first,
        so the value is the TPOT SLO in milliseconds; requests without one go last."""
        if not self.send_priority:
            return None
        tpot = req.spec.slo.tpot_s
        return NO_TPOT_PRIORITY if tpot is None else max(0, round(tpot * 1000))

    def speculation(self, knobs: KnobsSpec) -> str:
        return "token trees (draft)"

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"mode": self.name, **self.spec.model_dump()}
        for planner in self.planners:
            info.update(planner.scheduler.describe())  # type: ignore[union-attr]
        return info


class StaticSpeculationPolicy(Policy):
    """vLLM-Spec(k) on AdaServe's token-level model: every decoding request verifies a k-token chain."""

    def __init__(self, width: int, spec: AdaServeSpec, calibration: Calibration, seed: int = 0) -> None:
        self.name = f"static-spec-{width}"
        self.width = width
        self.spec = spec
        self.calibration = calibration
        self.seed = seed

    def step_planner(self, replica_index: int) -> TreePlanner:
        rng = np.random.default_rng([self.seed, replica_index, 3])
        return TreePlanner(StaticScheduler(self.width, self.spec, rng), self.spec)
