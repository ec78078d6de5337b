"""Discrete-event, iteration-level model of a vLLM-like engine, with its clients.

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
- step time from the roofline model (perf_model.py) times lognormal noise;
- clients: open-loop arrivals with an optional in-flight cap, or closed-loop clients with think time.

Why it is fast: the cost per engine step is O(1) in the batch size. A decoding request's finish step is
known when it starts decoding (it emits a fixed number of tokens per step), so completions come off a heap
keyed by step index; the KV total grows by a maintained sum each step; every step's end time is stored
once in a shared array, and a request's token timeline is a view of that array (chunk i of a request is
the step it decoded in). No per-token or per-request work happens inside a step.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from core.backends.base import EngineSample, LoadPlan
from core.profile import Calibration, KnobsSpec
from core.records import RequestRecord, RequestSpec, Status
from core.sim.perf_model import StepTimeModel, expected_accepted_tokens

NOISE_BLOCK = 65536
INITIAL_STEPS = 1 << 16


@dataclass(slots=True)
class _Req:
    spec: RequestSpec
    latency_from_s: float  # RequestRecord.arrival_s
    prompt_left: int  # prompt tokens still to prefill (includes recomputed output after preemption)
    context: int = 0  # tokens held in KV for this request
    out_left: int = 0  # output tokens still to produce
    tokens_per_step: float = 1.0
    prefill_end_step: int = -1
    finish_step: int = -1
    admitted_order: int = 0
    generated: int = 0  # output tokens streamed so far (before the current run)
    preemptions: int = 0
    done_runs: list[tuple[np.ndarray, np.ndarray | None]] = field(default_factory=list)
    alive: bool = True  # False once preempted out of the decode heap (lazy heap deletion)
    sent_s: float = 0.0  # when it actually left the client


class SimEngine:
    """Runs a `LoadPlan` against the modelled engine in virtual time.

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
        on_record: Callable[[RequestRecord], None] | None = None,
        on_sample: Callable[[EngineSample], None] | None = None,
        sample_interval_s: float = 0.5,
    ) -> None:
        self.calibration = calibration
        self.knobs = knobs
        self.plan = plan
        self.model = StepTimeModel.from_calibration(calibration)
        self.rng = np.random.default_rng(seed)
        self._noise = self._noise_block()
        self._noise_i = 0
        self.on_record = on_record
        self.on_sample = on_sample
        self.sample_interval_s = sample_interval_s
        self._next_sample_s = 0.0

        self.width = knobs.effective_spec_width
        self.max_seqs = knobs.max_num_seqs
        self.token_budget = knobs.max_num_batched_tokens
        self.chunked = knobs.chunked_prefill
        self.block = calibration.block_size
        self.kv_capacity = calibration.kv_capacity_tokens
        self.max_model_len = calibration.max_model_len

        self.clock = 0.0
        self.step = 0
        self.step_times = np.empty(INITIAL_STEPS)
        self.busy_s = 0.0
        self.preemptions = 0
        self.generated_tokens = 0.0

        self.waiting: deque[_Req] = deque()
        self.prefilling: list[_Req] = []
        self.running_order: list[_Req] = []  # admission order, for LIFO preemption
        self.decode_heap: list[tuple[int, int, _Req]] = []
        self.decoding = 0
        self.decode_rate = 0.0  # sum of tokens_per_step over decoding requests
        # Float: decodes with speculation grow the cache by a fractional expected count per step.
        self.kv_used = 0.0
        self._admit_seq = 0

        # Client side.
        self._specs: Iterator[RequestSpec] = plan.requests
        self._lookahead: RequestSpec | None = None
        self._sent = 0
        self._in_flight = 0
        self._blocked: deque[RequestSpec] = deque()  # open loop, waiting for the in-flight cap
        self._client_sends: list[tuple[float, int, int]] = []  # closed loop: (time, client, order)
        self._send_order = 0
        self._exhausted = False
        self.records: list[RequestRecord] = []
        self.finished = False
        if plan.mode == "closed":
            for client in range(plan.concurrency or 1):
                heapq.heappush(self._client_sends, (0.0, client, client))
            self._send_order = plan.concurrency or 1
        else:
            self._lookahead = self._pull_spec()

    # ------------------------------------------------------------ client side

    def _pull_spec(self) -> RequestSpec | None:
        if self._exhausted:
            return None
        if self.plan.max_requests is not None and self._sent >= self.plan.max_requests:
            self._exhausted = True
            return None
        spec = next(self._specs, None)
        if spec is None:
            self._exhausted = True
        return spec

    def _send_window_open(self, t: float) -> bool:
        return self.plan.duration_s is None or t <= self.plan.duration_s

    def _send(self, spec: RequestSpec, t: float, scheduled: float) -> None:
        plan = self.plan
        self._sent += 1
        self._in_flight += 1
        warmup = spec.warmup or t < plan.warmup_s or self._sent <= plan.warmup_requests
        spec.warmup = warmup
        spec.arrival_s = scheduled
        if spec.output_tokens + spec.prompt_tokens > self.max_model_len:
            # vLLM refuses such a request with HTTP 400; so does the model.
            self._finish_failed(
                spec,
                t,
                f"prompt+output {spec.prompt_tokens + spec.output_tokens} tokens "
                f"exceeds max_model_len {self.max_model_len}",
            )
            return
        # Latency starts when the client was ready to send (the scheduled time for a request that waited for
        # an open-loop in-flight slot), see RequestRecord.arrival_s; `t` is when it actually left.
        req = _Req(
            spec=spec, latency_from_s=scheduled, sent_s=t, prompt_left=spec.prompt_tokens, out_left=spec.output_tokens
        )
        acceptance = spec.acceptance if spec.acceptance is not None else self.calibration.default_acceptance
        if self.width > 0:
            acceptance = self._draw_acceptance(acceptance)
            req.tokens_per_step = expected_accepted_tokens(acceptance, self.width)
        self.waiting.append(req)

    def _draw_acceptance(self, mean: float) -> float:
        concentration = self.calibration.acceptance_concentration
        if mean <= 0.0:
            return 0.0
        return float(self.rng.beta(mean * concentration, (1.0 - mean) * concentration))

    def _release_arrivals(self, now: float) -> None:
        """Send every request whose time has come (open-loop schedule or closed-loop client)."""
        if self.plan.mode == "closed":
            sends = self._client_sends
            while sends and sends[0][0] <= now:
                t, client, _ = heapq.heappop(sends)
                if not self._send_window_open(t):
                    continue
                spec = self._pull_spec()
                if spec is None:
                    continue
                spec.client_id = client
                self._send(spec, t, t)
            return
        cap = self.plan.concurrency
        while self._blocked and (cap is None or self._in_flight < cap):
            spec = self._blocked.popleft()
            self._send(spec, now, spec.arrival_s)
        while self._lookahead is not None and self._lookahead.arrival_s <= now:
            spec = self._lookahead
            self._lookahead = self._pull_spec()
            if not self._send_window_open(spec.arrival_s):
                self._lookahead = None
                self._exhausted = True
                break
            if cap is not None and (self._in_flight >= cap or self._blocked):
                self._blocked.append(spec)
            else:
                self._send(spec, spec.arrival_s, spec.arrival_s)

    def _next_send_time(self) -> float:
        if self.plan.mode == "closed":
            return self._client_sends[0][0] if self._client_sends else math.inf
        if self._lookahead is not None:
            return self._lookahead.arrival_s
        return math.inf

    def _on_request_done(self, spec: RequestSpec, t: float) -> None:
        self._in_flight -= 1
        if self.plan.mode == "closed" and spec.client_id is not None:
            heapq.heappush(self._client_sends, (t + self.plan.think_time_s, spec.client_id, self._send_order))
            self._send_order += 1

    # ------------------------------------------------------------ engine

    def _noise_block(self) -> np.ndarray:
        cv = self.calibration.noise_cv
        if cv <= 0:
            return np.ones(NOISE_BLOCK)
        sigma = math.sqrt(math.log1p(cv * cv))
        return self.rng.lognormal(-0.5 * sigma * sigma, sigma, NOISE_BLOCK)

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block) * self.block

    def _schedule_and_step(self) -> bool:
        """Form one batch and execute it. Returns False when there was nothing to run."""
        budget = self.token_budget
        width = self.width
        decode_tokens = self.decoding * (width + 1)
        budget -= decode_tokens
        prefill_tokens = 0
        prefill_seqs = 0
        finished_prefill: list[_Req] = []
        # Continue chunked prefills first (they are already running).
        for req in self.prefilling:
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
        while waiting and budget > 0 and len(self.running_order) < self.max_seqs:
            req = waiting[0]
            chunk = req.prompt_left if req.prompt_left <= budget else budget
            if chunk < req.prompt_left and not self.chunked:
                break  # whole prompts only
            need = self._blocks(req.context + req.prompt_left + 1) - req.context
            if self.kv_used + need > self.kv_capacity:
                break  # no room: wait for completions (vLLM admits nothing it cannot hold)
            waiting.popleft()
            req.admitted_order = self._admit_seq
            self._admit_seq += 1
            self.running_order.append(req)
            self.kv_used += need
            req.context += need
            req.prompt_left -= chunk
            budget -= chunk
            prefill_tokens += chunk
            prefill_seqs += 1
            if req.prompt_left == 0:
                finished_prefill.append(req)
            else:
                self.prefilling.append(req)
        sequences = self.decoding + prefill_seqs
        if decode_tokens == 0 and prefill_tokens == 0:
            return False

        spec_steps = width if self.decoding else 0
        dt = self.model.step_time(decode_tokens + prefill_tokens, self.kv_used, spec_steps, sequences)
        i = self._noise_i
        if i >= NOISE_BLOCK:
            self._noise = self._noise_block()
            i = 0
        dt *= self._noise[i]
        self._noise_i = i + 1
        self.clock += dt
        self.busy_s += dt
        step = self.step
        if step >= len(self.step_times):
            self.step_times = np.concatenate([self.step_times, np.empty(len(self.step_times))])
        self.step_times[step] = self.clock

        # Decodes grew the KV cache by their emitted tokens this step.
        if self.decoding:
            self.kv_used += self.decode_rate
            self.generated_tokens += self.decode_rate

        if finished_prefill:
            self.prefilling = [r for r in self.prefilling if r.prompt_left > 0]
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

    def _start_decoding(self, req: _Req, step: int) -> None:
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

    def _run_chunks(self, req: _Req, last_step: int, total_tokens: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Chunk times and sizes of one run of a request: its prefill step, then one chunk per decode step."""
        first = req.prefill_end_step
        times = self.step_times[first : last_step + 1]
        if req.tokens_per_step == 1.0:
            return times, None
        steps = last_step - first
        emitted = np.floor(np.arange(steps + 1) * req.tokens_per_step).astype(np.int64)
        sizes = np.empty(steps + 1, dtype=np.int64)
        sizes[0] = 1
        sizes[1:] = np.diff(emitted)
        # The last step emits only what was left (speculation may propose more than needed).
        sizes[-1] -= int(sizes.sum()) - total_tokens
        return times, sizes

    def _complete(self, req: _Req, step: int) -> None:
        self.running_order.remove(req)
        self.kv_used -= req.context
        if req.finish_step >= 0:  # it was decoding
            self.decoding -= 1
            self.decode_rate -= req.tokens_per_step
            self.kv_used -= (step - req.prefill_end_step) * req.tokens_per_step
        run_tokens = req.spec.output_tokens - req.generated
        times, sizes = self._run_chunks(req, step, run_tokens)
        if req.done_runs:
            runs = [*req.done_runs, (times, sizes)]
            times = np.concatenate([r[0] for r in runs])
            sizes = np.concatenate([r[1] if r[1] is not None else np.ones(len(r[0]), np.int64) for r in runs])
        end = float(self.step_times[step])
        self._emit(req.spec, req.latency_from_s, req.sent_s, end, times, sizes, Status.OK, None, req.preemptions)

    def _preempt_until_fits(self, step: int) -> None:
        """Recompute preemption of the newest running requests until the KV cache fits (vLLM V1)."""
        while self.kv_used > self.kv_capacity and len(self.running_order) > 1:
            victim = self.running_order.pop()
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
                _Req(
                    spec=victim.spec,
                    latency_from_s=victim.latency_from_s,
                    sent_s=victim.sent_s,
                    prompt_left=victim.spec.prompt_tokens + victim.generated,
                    out_left=victim.spec.output_tokens - victim.generated,
                    tokens_per_step=victim.tokens_per_step,
                    generated=victim.generated,
                    preemptions=victim.preemptions + 1,
                    done_runs=victim.done_runs,
                )
            )

    # ------------------------------------------------------------ records

    def _emit(
        self,
        spec: RequestSpec,
        latency_from: float,
        sent: float,
        end: float,
        times: np.ndarray | None,
        sizes: np.ndarray | None,
        status: Status,
        error: str | None,
        preemptions: int,
    ) -> None:
        record = RequestRecord(
            request_id=spec.request_id,
            task=spec.task,
            slo=spec.slo,
            prompt_tokens=spec.prompt_tokens,
            max_tokens=spec.output_tokens,
            scheduled_s=spec.arrival_s,
            arrival_s=latency_from,
            sent_s=sent,
            status=status,
            end_s=end,
            output_tokens=spec.output_tokens if status is Status.OK else 0,
            chunk_times=times,
            chunk_tokens=sizes,
            error=error,
            warmup=spec.warmup,
            preemptions=preemptions,
            client_id=spec.client_id,
        )
        self.records.append(record)
        self._on_request_done(spec, end)
        if self.on_record is not None:
            self.on_record(record)

    def _finish_failed(self, spec: RequestSpec, t: float, error: str) -> None:
        self._emit(spec, t, t, t, None, None, Status.ERROR, error, 0)

    # ------------------------------------------------------------ driving

    def _maybe_sample(self) -> None:
        if self.on_sample is None or self.clock < self._next_sample_s:
            return
        self._next_sample_s = self.clock + self.sample_interval_s
        self.on_sample(self.sample())

    def sample(self) -> EngineSample:
        power = self.calibration.power
        busy_share = 1.0 if self.running_order else 0.0
        return EngineSample(
            time_s=self.clock,
            running=len(self.running_order),
            waiting=len(self.waiting) + len(self._blocked),
            kv_usage=min(1.0, self.kv_used / self.kv_capacity),
            preemptions_total=self.preemptions,
            generated_tokens_total=int(self.generated_tokens),
            power_w=None if power is None else power.idle_w + (power.peak_w - power.idle_w) * busy_share,
        )

    def _idle(self) -> bool:
        return not (self.running_order or self.waiting)

    def advance_until(self, until_s: float) -> bool:
        """Process events up to virtual time `until_s`. Returns True when the whole plan is done."""
        while not self.finished:
            self._release_arrivals(self.clock)
            if self._idle():
                next_send = self._next_send_time()
                if next_send == math.inf:
                    if not self._blocked and self._in_flight == 0:
                        self.finished = True
                    break
                if next_send > until_s:
                    self.clock = max(self.clock, until_s)  # idle virtual time passes
                    break
                self.clock = max(self.clock, next_send)
                continue
            if self.clock >= until_s:
                break
            if not self._schedule_and_step():
                # Nothing schedulable (should not happen with a non-empty queue); avoid spinning.
                raise RuntimeError(
                    "simulator stalled: a waiting request can never be admitted "
                    "(its prompt needs more KV cache than the calibration holds)"
                )
            self._maybe_sample()
        return self.finished

    def run(self) -> list[RequestRecord]:
        self.advance_until(math.inf)
        return self.records
