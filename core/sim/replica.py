"""One engine replica: an iteration-level model of a vLLM-like engine, in virtual time.

What it models (vLLM V1's scheduler, simplified):
- continuous batching: every engine step first schedules all running decodes, then continues chunked
  prefills, then admits waiting requests FCFS while `max_num_seqs`, the token budget
  (`max_num_batched_tokens`) and KV-cache capacity allow;
- chunked prefill: a prompt longer than the remaining budget is split across steps; its first output
  token appears at the end of the step that finishes its prefill (without chunked prefill a prompt is
  admitted only whole);
- KV cache in tokens, rounded up to blocks per request; when decodes would overflow it, the most recently
  admitted request is preempted (recompute mode: it returns to the head of the queue and later re-prefills
  its prompt plus the tokens it had generated; tokens already streamed stay delivered);
- speculative decoding: each decoding request verifies `width` drafted tokens per step and emits
  E = (1 - a^(k+1)) / (1 - a) tokens on average; the draft's sequential passes cost `spec_steps` in the
  step-time model and the verifier processes k+1 positions per request;
- step time from the roofline model (core/step_time.py) times lognormal noise.

Why it is fast: the cost per engine step is O(1) in the batch size. A decoding request's finish step is
known when it starts decoding (it emits a fixed number of tokens per step), so completions come off a heap
keyed by step index; the KV total grows by a maintained sum each step; every step's end time is stored
once in shared arrays (blocks of STEP_BLOCK steps), and a request's token timeline is a view of one (chunk i
of a request is the step it decoded in; a copy for the few that span two blocks). No per-token or
per-request work happens inside a step.
Between two events an fcfs replica repeats one decode-only batch; decode_runs.py runs such stretches
(EngineReplica inherits it).

The replica knows nothing of clients or scheduling modes: the simulation (engine.py) enqueues the requests
its controller releases, and hears of each completion through `on_complete`. Modes that decide batch
formation or per-request speculation step by step use the planner path (stepwise.py) instead.
The clock, step pricing and noise, step end times and KV accounting both share are replica_base.py's.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from core.profile import Calibration, KnobsSpec
from core.sim.blocks import NOISE_CHUNK, STEP_BLOCK
from core.sim.compile_hints import mypyc_attr
from core.sim.decode_runs import DecodeRuns
from core.sim.sim_request import CompletionCallback, SimRequest
from core.step_time import DecodeStepCosts, expected_accepted_tokens

# 0.0, 1.0, 2.0, ...: step counts for _run_chunks' emitted-token arithmetic, made once (a request's run is
# usually shorter; a longer one makes its own).
_STEP_COUNTS = np.arange(4096, dtype=np.float64)


@mypyc_attr(allow_interpreted_subclasses=True)
class EngineReplica(DecodeRuns):
    """One vLLM-like engine on the simulation's virtual clock. `clock` is when its next step can start.

    Its decode runs (run_decode_steps, decode_run) are inherited from DecodeRuns (decode_runs.py)."""

    def __init__(
        self,
        index: int,
        calibration: Calibration,
        knobs: KnobsSpec,
        rng: np.random.Generator,
        on_complete: CompletionCallback,
    ) -> None:
        super().__init__(index, calibration, knobs, rng, on_complete)
        # The running requests by admitted_order, in admission order (a dict keeps insertion order): LIFO
        # preemption pops the newest, and a completion deletes its own by key, where a list's remove compared
        # it with each request before it (100k completions in a 100k bench-chat run, ~27 running).
        self.running_order: dict[int, SimRequest] = {}
        self.decode_heap: list[tuple[int, int, SimRequest]] = []
        self.decoding = 0  # how many requests decode (the planner path keeps a list here: its own attribute)
        self.decode_rate = 0.0  # sum of tokens_per_step over decoding requests
        # run_decode_steps' per-term constants by the number of decoding requests (they depend on nothing else).
        self._decode_terms: dict[int, DecodeStepCosts] = {}

    # ------------------------------------------------------------ requests in

    def enqueue(self, req: SimRequest, now: float) -> None:
        """Accept a request released at `now`; an idle replica's next step starts no earlier than that."""
        if self.clock < now and not (self.running_order or self.waiting):  # _wake_at, once per request
            self.clock = now
        if self.width > 0:
            req.tokens_per_step = expected_accepted_tokens(self._draw_acceptance(req.spec), self.width)
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.running_order or self.waiting)

    @property
    def running(self) -> int:
        return len(self.running_order)

    # ------------------------------------------------------------ engine step

    def admits_head(self) -> bool:
        """Whether a step starting now would admit the first waiting request (step_once's admission test)."""
        if not self.waiting:
            return False
        running = len(self.running_order)
        if running > self.seqs_probe:
            self.seqs_probe = running
        if running >= self.max_seqs:
            return False
        budget = self.token_budget - self.decoding * (self.width + 1)
        if budget <= 0:
            return False
        req = self.waiting[0]
        if req.prompt_left > budget and not self.chunked:
            return False
        need = self._blocks(req.context + req.prompt_left + 1) - req.context
        return self.kv_used + need <= self.kv_capacity

    def step_once(self) -> bool:
        """Form one batch and execute it. Returns False when there was nothing to run.

        The eventful step (100k of them in a 100k bench-chat run: every admission): `_blocks`, `_noisy` and
        `_record_step_end` are written out here with the same arithmetic (the planner path, stepwise.py, calls
        them), and the replica's fields are read into locals once."""
        budget = self.token_budget
        width = self.width
        decoding = self.decoding
        decode_tokens = decoding * (width + 1)
        budget -= decode_tokens
        prefill_tokens = 0
        prefill_seqs = 0
        finished_prefill: list[SimRequest] = []
        # Continue chunked prefills first (they are already running).
        prefilling = self.prefilling
        for req in prefilling:
            if budget <= 0:
                break
            chunk = req.prompt_left if req.prompt_left <= budget else budget
            req.prompt_left -= chunk
            budget -= chunk
            prefill_tokens += chunk
            prefill_seqs += 1
            if req.prompt_left == 0:
                finished_prefill.append(req)
        # Admit waiting requests while sequences, budget and KV allow.
        waiting = self.waiting
        kv_used = self.kv_used
        if waiting:
            running_order = self.running_order
            max_seqs = self.max_seqs
            block = self.block
            capacity = self.kv_capacity
            while waiting and budget > 0 and len(running_order) < max_seqs:
                req = waiting[0]
                prompt_left = req.prompt_left
                chunk = prompt_left if prompt_left <= budget else budget
                if chunk < prompt_left and not self.chunked:
                    break  # whole prompts only
                context = req.context
                need = -(-(context + prompt_left + 1) // block) * block - context  # _blocks(...) - context
                if kv_used + need > capacity:
                    break  # no room: wait for completions (vLLM admits nothing it cannot hold)
                waiting.popleft()
                req.admitted_order = order = self._admit_seq
                self._admit_seq = order + 1
                running_order[order] = req
                kv_used += need
                req.context = context + need
                prompt_left -= chunk
                req.prompt_left = prompt_left
                budget -= chunk
                prefill_tokens += chunk
                prefill_seqs += 1
                if prompt_left == 0:
                    finished_prefill.append(req)
                else:
                    prefilling.append(req)
            # seqs_probe: the loop's last test compared the running count now (it stopped on the count or on a
            # break, with someone waiting and budget left), else the count before the last admission.
            probed = len(running_order) if waiting and budget > 0 else len(running_order) - 1
            if probed > self.seqs_probe:
                self.seqs_probe = probed
        if decode_tokens == 0 and prefill_tokens == 0:
            self.kv_used = kv_used
            return False

        dt = self.model.step_time(
            decode_tokens + prefill_tokens, kv_used, width if decoding else 0, decoding + prefill_seqs
        )
        # _noisy
        i = self._noise_i
        if i >= NOISE_CHUNK:
            self._noise = self._noise_block()
            i = 0
        self._noise_i = i + 1
        dt *= self._noise[i]
        # _record_step_end
        if self._stalls is not None:
            dt += self._stalls.stall_within(dt)
        clock = self.clock + dt
        self.clock = clock
        self.busy_s += dt
        step = self.step
        if step - self._block_base >= STEP_BLOCK:
            self._next_step_block()
        self._step_view[step - self._block_base] = clock

        # Decodes grew the KV cache by their emitted tokens this step.
        if decoding:
            kv_used += self.decode_rate
            self.generated_tokens += self.decode_rate
        self.kv_used = kv_used

        if finished_prefill:
            if prefilling:
                self.prefilling = [r for r in prefilling if r.prompt_left > 0]
            for req in finished_prefill:
                self._start_decoding(req, step)

        heap = self.decode_heap
        while heap and heap[0][0] <= step:
            _, _, req = heapq.heappop(heap)
            if req.alive:
                self._complete(req, step)

        if self.kv_used > self.kv_capacity and self.decoding:
            self._preempt_until_fits(step)
        self.step = step + 1
        return True

    def _start_decoding(self, req: SimRequest, step: int) -> None:
        """Prefill finished at `step`: the first output token appears at its end."""
        req.prefill_end_step = step
        req.out_left -= 1
        self.generated_tokens += 1
        if req.out_left <= 0:
            self._complete(req, step)
            return
        steps_needed = math.ceil(req.out_left / req.tokens_per_step)
        req.finish_step = step + steps_needed
        self.decoding += 1
        self.decode_rate += req.tokens_per_step
        heapq.heappush(self.decode_heap, (req.finish_step, req.admitted_order, req))

    def _run_chunks(self, req: SimRequest, last_step: int, total_tokens: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Chunk times and sizes of one run of a request: its prefill step, then one chunk per decode step."""
        first = req.prefill_end_step
        times = self._step_span(first, last_step)
        if req.tokens_per_step == 1.0:
            return times, None
        n = last_step - first + 1
        # Tokens out by the end of decode step k: floor(k * rate) (an int64 arange times a float is the same
        # float product; the cast truncates, which is floor for k >= 0), laid out after a -1 so that one
        # subtraction gives the sizes, the prefill's token first (0 - -1). The last step emits only what was
        # left (speculation may propose more than needed): the last entry is total - 1, so its size is the rest.
        counts = _STEP_COUNTS[: n - 1] if n <= _STEP_COUNTS.size else np.arange(n - 1, dtype=np.float64)
        emitted = np.empty(n + 1, dtype=np.int64)
        emitted[0] = -1
        emitted[1:n] = counts * req.tokens_per_step
        emitted[n] = total_tokens - 1
        sizes = emitted[1:] - emitted[:-1]
        return times, sizes

    def _complete(self, req: SimRequest, step: int) -> None:
        del self.running_order[req.admitted_order]
        self.kv_used -= req.context
        if req.finish_step >= 0:  # it was decoding
            self.decoding -= 1
            self.decode_rate -= req.tokens_per_step
            self.kv_used -= (step - req.prefill_end_step) * req.tokens_per_step
        first = req.prefill_end_step
        base = self._block_base
        if req.tokens_per_step == 1.0 and not req.done_runs and first >= base:
            # _run_chunks' and _step_span's usual case written out (one token a step, one run, one step block):
            # the timeline is a view, and its last entry is this step's end. A completion comes at the step
            # just run, which is in the block being filled; so is the run's first step here (first >= base),
            # so that block holds the whole run, and the step's end is read through its memoryview (a float at
            # once). A run that began in an earlier block takes _run_chunks (a copy).
            times = self.step_times[first - base : step - base + 1]
            self.on_complete(req, self._step_view[step - base], times, None)
            return
        run_tokens = req.spec.output_tokens - req.generated
        times, sizes = self._run_chunks(req, step, run_tokens)
        if req.done_runs:
            runs = [*req.done_runs, (times, sizes)]
            times = np.concatenate([r[0] for r in runs])
            sizes = np.concatenate([r[1] if r[1] is not None else np.ones(len(r[0]), np.int64) for r in runs])
        block, offset = divmod(step, STEP_BLOCK)
        self.on_complete(req, float(self._step_blocks[block][offset]), times, sizes)

    def _preempt_until_fits(self, step: int) -> None:
        """Recompute preemption of the newest running requests until the KV cache fits (vLLM V1)."""
        while self.kv_used > self.kv_capacity and len(self.running_order) > 1:
            victim = self.running_order.popitem()[1]
            self.preemptions += 1
            self.kv_used -= victim.context
            if victim.prefill_end_step < 0:  # still prefilling: it has streamed nothing in this run
                self.prefilling.remove(victim)
            else:
                steps = step - victim.prefill_end_step
                self.kv_used -= steps * victim.tokens_per_step
                self.decoding -= 1
                self.decode_rate -= victim.tokens_per_step
                victim.alive = False  # its heap entry is now stale
                emitted = 1 + min(victim.out_left, int(steps * victim.tokens_per_step))
                victim.done_runs.append(self._run_chunks(victim, step, emitted))
                victim.generated += emitted
            # Recompute: re-prefill the prompt and everything it generated, then carry on.
            self.waiting.appendleft(
                SimRequest(
                    spec=victim.spec,
                    latency_from_s=victim.latency_from_s,
                    sent_s=victim.sent_s,
                    dispatched_s=victim.dispatched_s,
                    prompt_left=victim.spec.prompt_tokens + victim.generated,
                    out_left=victim.spec.output_tokens - victim.generated,
                    tokens_per_step=victim.tokens_per_step,
                    generated=victim.generated,
                    preemptions=victim.preemptions + 1,
                    done_runs=victim.done_runs,
                    controlled=victim.controlled,
                    tier=victim.tier,
                )
            )
