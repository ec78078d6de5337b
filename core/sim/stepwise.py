"""The planner path of an engine replica: a scheduling mode forms every batch itself.

The fast replica (replica.py) hard-wires vLLM's batching: all decodes, then chunked prefills, then FCFS
admission, one speculation width for everyone. Modes that decide these per step plug in a `StepPlanner`:
- SLOs-Serve (paper 004, Algorithm 2 and sec. 3.2.3): prefill chunk sizes and decode tokens per step chosen
  against the tightest TPOT SLO in the batch, and a per-request speculation length;
- AdaServe (paper 002, Algorithm 2): a token tree per request each step, sized to its TPOT SLO.

Each step the replica asks the planner for a `BatchPlan`: which requests to admit from the queue and how many
prompt tokens each prefilling request processes, and, per decoding request, how many token positions it
verifies (1 = plain decoding; 1 + k = k drafted tokens checked by the target model). It prices the batch with
the same roofline step-time model and noise as the fast path, then asks the planner how many of the verified
tokens each request actually emits (the acceptance process is the planner's: AdaServe's real acceptance
differs from its draft's estimate). Cost is per request per step, so this path is slower than the fast one;
only the modes that need it take it.

KV cache, preemption (recompute, newest admitted first) and token timelines follow replica.py exactly, so a
planner that batches like vLLM reproduces the fast path's timelines (tests/test_stepwise.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import attrgetter, itemgetter
from struct import pack_into
from typing import Any, cast

import numpy as np

from core.profile import Calibration, KnobsSpec
from core.sim.compile_hints import mypyc_attr
from core.sim.replica_base import ReplicaBase
from core.sim.sim_request import CompletionCallback, SimRequest
from core.step_planner_api import (
    BatchPlan,
    PlannedReplica,
    StepPlanner,
    StepRequest,
    draw_accepted,
    plan_fcfs_prefill,
)

_second = itemgetter(1)  # (request, tokens) -> tokens
_admitted_order = attrgetter("admitted_order")


# Tests subclass it (a planner that draws its emitted tokens with the plan).
@mypyc_attr(allow_interpreted_subclasses=True)
class FcfsStepPlanner:
    """vLLM's batching as a planner: every decode (verifying `width` + 1 positions), then chunked prefills,
    then FCFS admission within `max_num_seqs` and the token budget. The reference the other planners are
    measured against, and the proof that the planner path models the engine as the fast path does."""

    wants_acceptance = False

    def __init__(self, width: int = 0) -> None:
        self.width = width

    def plan(self, replica: StepwiseReplica, now: float) -> BatchPlan:
        verify = self.width + 1
        batch = BatchPlan(
            decode=[(r, verify) for r in replica.decoding], spec_steps=self.width if replica.decoding else 0
        )
        plan_fcfs_prefill(replica, batch, replica.token_budget - verify * len(replica.decoding))
        return batch

    def accepted(self, request: StepRequest, verified: int, rng: np.random.Generator) -> int:
        return draw_accepted(rng, request.acceptance, verified - 1)


def _fewest_left(decoding: list[StepRequest]) -> int:
    """min(item.out_left + item.owed_from for item in decoding) of a non-empty list: the same int, in a native
    loop (a list of boxed ints and `min`'s generic comparisons cost ~200 instructions a request a segment)."""
    fewest = decoding[0].out_left + decoding[0].owed_from
    for item in decoding:
        left = item.out_left + item.owed_from
        if left < fewest:
            fewest = left
    return fewest


class StepwiseReplica(ReplicaBase[StepRequest], PlannedReplica):
    """An engine replica whose batches a `StepPlanner` forms (same clock, noise, KV and preemption model as the
    fast replica, from their shared base: replica_base.py, which says why the two are siblings). PlannedReplica
    (core/step_planner_api.py) is the planners' native view of it: it adds no state."""

    def __init__(
        self,
        index: int,
        calibration: Calibration,
        knobs: KnobsSpec,
        rng: np.random.Generator,
        on_complete: CompletionCallback,
        planner: StepPlanner,
    ) -> None:
        super().__init__(index, calibration, knobs, rng, on_complete)
        self.planner = planner
        # The decoding requests, in the order they started decoding (the fast replica keeps a count instead).
        self.decoding: list[StepRequest] = []
        self.admitted: list[StepRequest] = []  # admission order, for LIFO preemption
        # Lazy timelines (a planner's `lazy_timelines`): the ends of the stretch steps whose token each decoding
        # request is still owed from its `owed_from` on. A stretch segment appends its steps here instead of
        # extending ~20 timelines; `plan` (step_once), a completion or a preemption settles them first.
        self.stretch_log: list[float] = []
        self._lazy = bool(getattr(planner, "lazy_timelines", False))

    def enqueue(self, req: SimRequest, now: float) -> None:
        self._wake_at(now)
        spec = req.spec
        item = StepRequest(req=req, prompt_left=spec.prompt_tokens, out_left=spec.output_tokens)
        if self.width > 0 or self.planner.wants_acceptance:
            item.acceptance = self._draw_acceptance(spec)
        self.waiting.append(item)

    def has_work(self) -> bool:
        return bool(self.admitted or self.waiting)

    @property
    def running(self) -> int:
        return len(self.admitted)

    def step_once(self) -> bool:
        if self.stretch_log:
            self._settle_all()  # the planner and the loop below read every decoding request's true state
        batch = self.planner.plan(self, self.clock)
        for victim in batch.preempt:  # the planner frees memory or a slot for a request it ranks higher
            self._preempt(victim)
        # Admissions first (they take KV now), so the step is priced with the cache it really holds.
        prefill: list[tuple[StepRequest, int]] = []
        for item, chunk in batch.prefill:
            if item.admitted_order < 0:
                need = self._blocks(item.context + item.prompt_left + 1) - item.context
                if self.kv_used + need > self.kv_capacity:
                    break  # no room: admit nothing after it either (vLLM admits in order)
                self.waiting.remove(item)
                item.admitted_order = self._admit_seq
                self._admit_seq += 1
                self.admitted.append(item)
                self.kv_used += need
                item.context += need
                self.prefilling.append(item)
            if chunk > 0:
                prefill.append((item, min(chunk, item.prompt_left)))
        drawn = batch.emitted
        if drawn is None:
            decode = [(item, verified) for item, verified in batch.decode if verified > 0]
        else:  # every entry verifies at least one position (BatchPlan.emitted's contract): nothing to drop
            decode = batch.decode
        tokens = sum(map(_second, decode))
        if prefill:
            tokens += sum(map(_second, prefill))
        if tokens == 0:
            return False
        sequences = len(prefill) + len(decode)
        dt = self._noisy(self.model.step_time(tokens, self.kv_used, batch.spec_steps, sequences))
        step = self._record_step_end(dt)
        now = float(self.clock)

        completed: list[StepRequest] = []
        accepted = self.planner.accepted
        rng = self.rng
        grown = 0
        if not drawn:
            drawn = [accepted(item, verified, rng) for item, verified in decode]
        for (item, _), tokens in zip(decode, drawn, strict=True):
            # _emit_tokens, inline (the per-request hot loop of every planner-driven step)
            left = item.out_left
            emitted = tokens if tokens < left else left  # min(left, tokens)
            item.out_left = left - emitted
            item.run_tokens += emitted
            grown += emitted
            item.chunk_times.append(now)
            item.chunk_tokens.append(emitted)
            if emitted == left:  # (out_left is now 0)
                completed.append(item)
        self.kv_used += grown
        self.generated_tokens += grown
        started: list[StepRequest] = []
        for item, chunk in prefill:
            item.prompt_left -= chunk
            if item.prompt_left == 0:
                started.append(item)
        for item in started:
            # Prefill finished: its first output token appears at the end of this step.
            self._emit_tokens(item, now, 1, grows_kv=False)
            if item.out_left == 0:
                self._complete_item(item, now)
            else:
                self.prefilling.remove(item)
                item.decoding = True
                self.decoding.append(item)
        for item in sorted(completed, key=lambda r: r.admitted_order):
            self._complete_item(item, now)
        if self.kv_used > self.kv_capacity and self.decoding:
            self._preempt_items()
        self.step = step + 1
        return True

    def run_decode_steps(
        self,
        clock_floor: float,
        send_s: float,
        until_s: float,
        sample_s: float,
        *,
        through_completions: Callable[[], bool] | None = None,
    ) -> int:
        """Run, one after another, the steps the planner promises without a plan (PlainDecodePlanner in
        core/step_planner_api.py: every decoding request verifying one position, and with requests prefilling,
        their chunks in the planner's order, nothing admitted or preempted); returns how many. The engine's
        contract is EngineReplica.run_decode_steps': a step runs only if it starts before `send_s` (the next
        send or policy wakeup) and `until_s`, and the steps stop after the first whose end reaches `sample_s`.
        Each step is priced and timed as step_once does it (the same calls: noise, stalls, the step's end
        time), but without asking the planner for a plan or touching each decoding request: their token
        timelines are brought up to date once a segment. A segment ends with the step that completes a
        prefill or a request (handled as step_once's tail does: they change the batch; the stretch goes on
        into a new segment after a prefill, and stops after a completion, which the engine's policy hears
        of), before a step that would overflow the KV cache (step_once runs that one and its preemptions),
        and before a step where the planner's check says its plan would be another batch. (The fast replica's
        `through_completions` is not taken: a completion always ends the stretch.)"""
        if clock_floor >= send_s:
            return 0
        # A step starts only before `stop`, and the one that ends at or after `sample_at` is the last: the
        # contract's max(clock, clock_floor) tests, with the floor's share worked out once.
        stop = min(send_s, until_s)
        sample_at = sample_s if clock_floor < sample_s else -math.inf
        total = 0
        while True:
            if self.prefilling or (self.waiting and self.max_seqs > self.running):
                ran, more = self._prefill_segment(stop, sample_at)
            else:
                ran, more = self._decode_segment(stop, sample_at)
            total += ran
            if not more:
                return total

    def _decode_segment(self, stop: float, sample_at: float) -> tuple[int, bool]:
        """Plain decode steps with nothing prefilling (the planner's `plain_decode_check`); (steps, False)."""
        check = getattr(self.planner, "plain_decode_check", None)
        decoding = self.decoding
        if check is None or not decoding:
            return 0, False
        fits = check(self)  # asked before the min over the batch: a refusal then costs nothing
        if fits is None:
            return 0, False
        # The last of them completes a request: the fewest tokens left, less what the stretch log owes them.
        most = _fewest_left(decoding) - len(self.stretch_log)
        n = len(decoding)
        # The model's method called on it (compiled: a native call; a bound method kept in a local is called through
        # the interpreter's API, its floats boxed and parsed, ~350 instructions a step).
        model = self.model
        capacity = self.kv_capacity
        kv = self.kv_used
        ends: list[float] = []
        while len(ends) < most and self.clock < stop and kv + n <= capacity and fits(kv):
            self.step = self._record_step_end(self._noisy(model.step_time(n, kv, 0, n))) + 1  # step_once's calls
            clock = self.clock
            ends.append(clock)
            kv += n
            if clock >= sample_at:
                break
        self._decoded(ends, kv, most, [])
        return len(ends), False

    def _prefill_segment(self, stop: float, sample_at: float) -> tuple[int, bool]:
        """Steps of every decode's token beside the prefill chunks the planner's `plain_prefill_check` gives,
        up to the one that admits a queued request or completes a prefill or a request; (steps, whether the
        stretch may go on). A step whose admissions and decode tokens would overflow the KV cache is left to
        step_once (it would preempt after it)."""
        check = getattr(self.planner, "plain_prefill_check", None)
        if check is None:
            return 0, False
        prefill_chunks = check(self)
        if prefill_chunks is None:
            return 0, False
        decoding = self.decoding
        most = (_fewest_left(decoding) if decoding else math.inf) - len(self.stretch_log)
        n = len(decoding)
        model = self.model  # (its method called on it: native, as in _decode_segment)
        capacity = self.kv_capacity
        kv = self.kv_used
        ends: list[float] = []
        started: list[StepRequest] = []
        admitted = False
        while len(ends) < most and self.clock < stop and kv + n <= capacity:
            # Typed: the planner's answer holds StepRequests (the loops below read and write their fields natively).
            chunks: list[tuple[StepRequest, int]] | None = prefill_chunks(kv, self.clock)
            if chunks is None:
                break
            tokens = n
            needs = 0
            for item, chunk in chunks:
                tokens += chunk
                if item.admitted_order < 0:
                    needs += self._blocks(item.context + item.prompt_left + 1) - item.context
            if tokens == 0 or kv + needs + n > capacity:
                break
            for item, chunk in chunks:
                if item.admitted_order < 0:  # step_once's admission, in the plan's order
                    need = self._blocks(item.context + item.prompt_left + 1) - item.context
                    self.waiting.remove(item)
                    item.admitted_order = self._admit_seq
                    self._admit_seq += 1
                    self.admitted.append(item)
                    kv += need
                    item.context += need
                    self.prefilling.append(item)
                    admitted = True
                item.prompt_left -= chunk
                if item.prompt_left == 0:
                    started.append(item)
            # Priced as step_once prices it: the KV after the admissions, the decodes and every chunk.
            self.step = self._record_step_end(self._noisy(model.step_time(tokens, kv, 0, n + len(chunks)))) + 1
            clock = self.clock
            ends.append(clock)
            kv += n
            if started or admitted or clock >= sample_at:
                break
        ran = len(ends)
        if not ran:
            return 0, False
        completed = self._decoded(ends, kv, most, started)
        return ran, bool(started or admitted) and not completed and self.clock < sample_at

    def _decoded(self, ends: list[float], kv: float, most: float, started: list[StepRequest]) -> bool:
        """A segment's end: every decoding request's token at each of `ends` (owed through `stretch_log`, and
        settled at once unless the planner takes lazy timelines), then step_once's tail for its last step (the
        prefills it completed start decoding with their first token, then the completions, in step_once's
        order; its KV check cannot fire: the segment stopped before any overflow). Whether a request
        completed."""
        ran = len(ends)
        if not ran:
            return False
        log = self.stretch_log
        log.extend(ends)
        size = len(log)
        decoding = self.decoding
        self.kv_used = kv
        self.generated_tokens += ran * len(decoding)
        done: list[StepRequest] = []
        if ran == most:  # the last step completed requests: those owed their last token (before `started` join)
            done = [item for item in decoding if item.out_left + item.owed_from == size]
            for item in done:
                self._settle(item)
        if not self._lazy:
            self._settle_all()
        now = ends[-1]
        self.step -= 1  # the last step's index while its tail is handled, as in step_once
        completed = False
        for item in started:
            self._emit_tokens(item, now, 1, grows_kv=False)
            if item.out_left == 0:
                self._complete_item(item, now)
                completed = True
            else:
                self.prefilling.remove(item)
                item.decoding = True
                item.owed_from = len(log)  # owed nothing of the steps before its first token
                decoding.append(item)
        if done:
            done.sort(key=_admitted_order)
            for item in done:
                self._complete_item(item, now)
            completed = True
        self.step += 1
        return completed

    def _settle(self, item: StepRequest) -> None:
        """Write the stretch steps `item` is owed into its token count and timeline (one token at each)."""
        log = self.stretch_log
        start = item.owed_from
        owed = len(log) - start
        if owed:
            item.out_left -= owed
            item.run_tokens += owed
            item.chunk_times.extend(log[start:] if start else log)
            item.chunk_tokens.extend([1] * owed)
            item.owed_from = len(log)

    def _settle_all(self) -> None:
        """Every decoding request's owed steps written in; the log starts again empty."""
        log = self.stretch_log
        size = len(log)
        if size:
            ones = [1] * size
            for item in self.decoding:
                start = item.owed_from
                if start == 0:  # owed the whole log (the usual case: one list for all)
                    item.out_left -= size
                    item.run_tokens += size
                    item.chunk_times.extend(log)
                    item.chunk_tokens.extend(ones)
                else:
                    owed = size - start
                    if owed:
                        item.out_left -= owed
                        item.run_tokens += owed
                        item.chunk_times.extend(log[start:])
                        item.chunk_tokens.extend(ones[:owed])
                item.owed_from = 0
            log.clear()

    def _emit_tokens(self, item: StepRequest, now: float, emitted: int, *, grows_kv: bool = True) -> None:
        item.out_left -= emitted
        if grows_kv:  # the first token of a run sits in the slot its admission reserved (prompt + 1)
            self.kv_used += emitted
            item.run_tokens += emitted
        self.generated_tokens += emitted
        item.chunk_times.append(now)
        item.chunk_tokens.append(emitted)

    def _release_kv(self, item: StepRequest) -> None:
        self.admitted.remove(item)
        if item.decoding:
            self.decoding.remove(item)
        else:
            self.prefilling.remove(item)
        self.kv_used -= item.context + item.run_tokens

    def _complete_item(self, item: StepRequest, now: float) -> None:
        self._release_kv(item)
        chunk_times = item.chunk_times
        # np.asarray(chunk_times, dtype=float) to the byte (each float's double, in order), written by struct into a
        # fresh array: numpy's list conversion inspects every element for its type and shape first (~66k
        # instructions for a 220-token request against ~27k; one array per completed request).
        count = len(chunk_times)
        times = np.empty(count)
        pack_into(f"{count}d", cast(Any, times), 0, *chunk_times)  # (typeshed: an ndarray is no Buffer)
        tokens = item.chunk_tokens
        one_each = tokens.count(1) == len(tokens)  # (a list's own count: np.all's wrapper costs more)
        # item.req is the SimRequest enqueue wrapped (the planner API names it by a protocol, not the simulator's type).
        req = cast(SimRequest, item.req)
        # (fromiter with the count: the same values as asarray, without its per-element type discovery)
        counts = None if one_each else np.fromiter(tokens, np.int64, len(tokens))
        self.on_complete(req, now, times, counts)

    def _preempt_items(self) -> None:
        """Recompute preemption of the newest admitted requests until the KV cache fits (as replica.py)."""
        while self.kv_used > self.kv_capacity and len(self.admitted) > 1:
            self._preempt(self.admitted[-1])

    def _preempt(self, victim: StepRequest) -> None:
        """Recompute preemption of one admitted request: it goes back to the head of the queue."""
        self._release_kv(victim)
        self.preemptions += 1
        victim.req.preemptions += 1
        # Re-prefill the prompt and everything streamed so far; streamed tokens stay delivered.
        victim.prompt_left = victim.spec.prompt_tokens + victim.generated
        victim.context = 0
        victim.run_tokens = 0
        victim.admitted_order = -1
        victim.decoding = False
        self.waiting.appendleft(victim)
