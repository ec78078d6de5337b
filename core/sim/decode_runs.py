"""The decode runs: an fcfs replica's stretches of identical decode-only steps, each run in one tight loop.

Between two events (an arrival, a completion, a KV overflow, a prefill chunk) an fcfs replica repeats one
decode-only batch, and `run_decode_steps` runs such a stretch in one tight loop with the same arithmetic and
noise draws as `step_once` (the engine's `reference=True` turns it off; tests/test_sim_fast_path.py holds the
two equal). Two thirds of a 100k bench-chat run's steps are run here.

A mixin that EngineReplica (replica.py) inherits, so that its state stays on the replica itself: the loop reads
and writes the replica's own attributes, with no object between them. Its own module because it is the
replica's largest part and the one tuned for speed; replica.py keeps the batch formation it must match.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from core.sim.blocks import NOISE_CHUNK, STEP_BLOCK
from core.sim.compile_hints import mypyc_attr
from core.sim.replica_base import ReplicaBase
from core.sim.sim_request import SimRequest

if TYPE_CHECKING:
    from core.step_time import DecodeStepCosts


# The earliest finish step with nobody decoding: an int beyond any step, not math.inf, so that first_finish and
# the stretch's last step stay native ints (an int-or-float compared with the step counter each step went through
# the generic comparison: 1.2M calls, ~100M instructions in a 100k bench-chat run).
NO_FINISH: Final = 1 << 60


@mypyc_attr(allow_interpreted_subclasses=True)
class DecodeRuns(ReplicaBase[SimRequest]):
    """run_decode_steps and decode_run, over the fields and methods of EngineReplica (the shared ones are
    ReplicaBase's; the fast replica's own are declared here for readers and type checkers, and replica.py sets
    and defines them)."""

    decode_heap: list[tuple[int, int, SimRequest]]
    decoding: int
    decode_rate: float
    _decode_terms: dict[int, DecodeStepCosts]

    # Real (abstract) methods, not TYPE_CHECKING-only declarations: mypyc compiles no conditional class body.
    def _complete(self, req: SimRequest, step: int) -> None:
        raise NotImplementedError

    def admits_head(self) -> bool:
        raise NotImplementedError

    def run_decode_steps(
        self,
        clock_floor: float,
        send_s: float,
        until_s: float,
        sample_s: float,
        *,
        through_completions: Callable[[], bool] | None = None,
    ) -> int:
        """Run, one after another, the engine steps that only decode and change nothing else; returns how many.

        Between two events (an arrival, a completion, a KV overflow, a prefill chunk) every step of this
        replica is the same batch: all decoding requests, nothing admitted. Only the context grows (by the
        maintained decode rate), so each step is priced and timed here with exactly the arithmetic of
        step_once, in the same order and with the same noise draw, minus the per-step batch formation.

        A step runs only if it starts before `send_s` (the next client send: it would join the queue),
        its replica clock is before `until_s` (advance_until stops there), leaves the KV cache within
        capacity, and no waiting request could be admitted (that test is monotone here: the cache only
        grows). A batch's run ends with the step at the decode heap's earliest finish step: that step is the
        same batch too, and its completions are handled here as step_once's tail does. A completion changes
        the batch, so the call returns there, unless `through_completions` says, asked after the completions,
        that they moved no client send (an open loop with nobody waiting for an in-flight slot): then the next
        batch runs on in this call if it passes every test the caller's next call would make (the sample,
        send and until tests, decoding requests left, no admission now that the cache has room). The steps
        also stop after the first one whose end reaches `sample_s`, so the caller samples the engine exactly
        where step_once would."""
        if self.prefilling or not self.decoding or self._stalls is not None or self.admits_head():
            return 0
        return self.decode_run(clock_floor, send_s, until_s, sample_s, through_completions)

    def decode_run(
        self,
        clock_floor: float,
        send_s: float,
        until_s: float,
        sample_s: float,
        through_completions: Callable[[], bool] | None,
    ) -> int:
        """run_decode_steps past its entry test (nothing prefilling, requests decoding, no stalls, no admission
        due), which the caller has made: fcfs's hot loop (engine._advance_passthrough) tests the admission
        itself first (98k of its 183k calls would return at once), so the test is not made twice."""
        # The steps run in stretches that need neither a new noise block nor a new step block (both are made
        # only when a step is about to use them, as step_once makes them: a noise block draws from the shared
        # rng). Within a stretch each step is priced, timed and stored with step_once's arithmetic, its end
        # written through the block's memoryview (half numpy's item assignment: 666k steps in a 100k bench-chat
        # run). The clock, the noise and the step blocks stay in locals from one batch to the next (154k
        # batches in 92k calls); each batch reads what its completions changed (the cache, the decode rate).
        heap = self.decode_heap
        capacity = self.kv_capacity
        clock = self.clock
        busy = self.busy_s
        generated = self.generated_tokens
        step = self.step
        noise = self._noise
        i = self._noise_i
        times = self._step_view
        base = self._block_base
        # The block sizes in locals: compiled, a module global is a dict lookup per read (four a stretch, 154k
        # stretches at 100k requests); read here, per call, tests that set them (test_sim_step_blocks) still hold.
        noise_block = NOISE_CHUNK  # (the length of the noise list the steps read)
        step_block = STEP_BLOCK
        # The caller's tests on max(clock, clock_floor), split (for floats, max(c, f) < x is c < x and f < x):
        # the floor's half is fixed for the run, so a step starts while clock < start_limit, and the run stops
        # after a step whose clock reaches sample_limit. After a step that completes nothing, both tests come
        # one after the other with nothing between them, so the stretch tests clock < stop_limit once.
        start_limit = (until_s if until_s < send_s else send_s) if clock_floor < send_s else -math.inf
        sample_limit = sample_s if clock_floor < sample_s else -math.inf
        stop_limit = start_limit if start_limit < sample_limit else sample_limit
        ran = 0
        while True:
            # One batch: its steps up to the decode heap's earliest finish step.
            first_finish = heap[0][0] if heap else NO_FINISH
            costs = self._decode_terms.get(self.decoding)
            if costs is None:
                costs = self._decode_terms[self.decoding] = self.model.decode_step_costs(self.decoding, self.width)
            floor_s, varying, single = costs
            if single is not None:
                single_fixed, single_k_ctx, single_tail = single
            rate = self.decode_rate
            kv = self.kv_used
            completing = False
            # kv_next is kv + rate, the cache after the next step, made once a step (the stop test reads it,
            # and the step stores it as the cache).
            while step <= first_finish and clock < start_limit and (kv_next := kv + rate) <= capacity:
                if i >= noise_block:
                    self._noise = noise = self._noise_block()
                    i = 0
                if step - base >= step_block:
                    self._next_step_block()
                    times = self._step_view
                    base = self._block_base
                # The stretch ends at the completing step, the block's last step or the noise block's last draw.
                last = first_finish
                if base + (step_block - 1) < last:
                    last = base + (step_block - 1)
                if step + (noise_block - 1 - i) < last:
                    last = step + (noise_block - 1 - i)
                j = step - base
                last_j = last - base
                i_first = i
                stopped = False
                if single is not None:
                    while True:
                        value = single_fixed + single_k_ctx * kv + single_tail
                        dt = (value if value > floor_s else floor_s) * noise[i]
                        i += 1
                        clock += dt
                        busy += dt
                        times[j] = clock
                        kv = kv_next
                        generated += rate
                        if j == last_j:
                            break
                        j += 1
                        kv_next = kv + rate
                        if not (clock < stop_limit and kv_next <= capacity):
                            stopped = True
                            break
                else:
                    while True:
                        best = floor_s
                        for fixed, k_ctx, spec_part, seq_part in varying:
                            value = fixed + k_ctx * kv + spec_part + seq_part
                            if value > best:
                                best = value
                        dt = best * noise[i]
                        i += 1
                        clock += dt
                        busy += dt
                        times[j] = clock
                        kv = kv_next
                        generated += rate
                        if j == last_j:
                            break
                        j += 1
                        kv_next = kv + rate
                        if not (clock < stop_limit and kv_next <= capacity):
                            stopped = True
                            break
                ran += i - i_first
                step = base + j
                if stopped:
                    break
                if step == first_finish:
                    completing = True
                    break
                step += 1
                if clock >= sample_limit:
                    break
            self.kv_used = kv
            self.clock = clock
            self.busy_s = busy
            self.generated_tokens = generated
            self.step = step
            self._noise_i = i
            if not completing:
                return ran
            # The step that completes requests: step_once's tail (its KV check cannot fire: kv + rate fit).
            while heap and heap[0][0] <= step:
                _, _, req = heapq.heappop(heap)
                if req.alive:
                    self._complete(req, step)
            step += 1
            self.step = step
            if through_completions is None or not through_completions():
                return ran
            # What the caller's loop would test before its next call (the sample first: it samples there).
            now = clock if clock > clock_floor else clock_floor
            if now >= sample_s or now >= send_s or clock >= until_s or not self.decoding or self.admits_head():
                return ran
