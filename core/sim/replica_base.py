"""What both engine replicas share: the virtual clock, step pricing and noise, step end times, KV accounting and
acceptance draws.

Two replicas model an engine: the fast one (replica.py, vLLM's batching hard-wired, O(1) per step) and the
planner path (stepwise.py, a scheduling mode forms every batch). They hold their queues differently: the fast
replica keeps `SimRequest`s and a count of decoding requests, the planner path `StepRequest`s and the list of
decoding requests its planner reads. Each declares its own queue attributes with its own types on top of this
base (the queues' item type is the base's type parameter; `decoding` is each subclass's own): mypyc compiles
both, and refuses a subclass that re-declares a base attribute with another type, which is why the planner
path was once an interpreted subclass of the fast replica.

Only the base's state and the methods both use live here; each replica's batch formation stays in its module.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np

from core.controller_api import ControlledRequest
from core.profile import Calibration, KnobsSpec
from core.records import RequestSpec
from core.sim.blocks import NOISE_BLOCK, NOISE_CHUNK, STEP_BLOCK
from core.sim.compile_hints import mypyc_attr
from core.sim.sim_request import CompletionCallback, SimRequest
from core.sim.stalls import StallClock
from core.step_time import StepTimeModel

# The replica's queue entry: SimRequest for the fast replica, StepRequest for the planner path.
Q = TypeVar("Q")


@mypyc_attr(allow_interpreted_subclasses=True)
class ReplicaBase(Generic[Q]):
    """One engine on the simulation's virtual clock. `clock` is when its next step can start.

    `waiting` (queued, FCFS unless a planner reorders) and `prefilling` (admitted, prompt not yet processed)
    hold the subclass's queue entries; the engine reads `len(waiting)` of either replica."""

    def __init__(
        self,
        index: int,
        calibration: Calibration,
        knobs: KnobsSpec,
        rng: np.random.Generator,
        on_complete: CompletionCallback,
    ) -> None:
        self.index = index
        self.calibration = calibration
        self.model = StepTimeModel.from_calibration(calibration)
        self.rng = rng
        self.on_complete = on_complete
        # The current NOISE_BLOCK draws, the next chunk's place in them (past the end: the first chunk draws them)
        self._noise_draws: np.ndarray | None = None
        self._noise_next = NOISE_BLOCK
        self._noise = self._noise_block()  # the chunk being read (a list of NOISE_CHUNK factors)
        self._noise_i = 0
        self._stalls = (
            StallClock(calibration.stalls, rng) if calibration.stalls and calibration.stalls.rate_per_s else None
        )

        self.width = knobs.effective_spec_width
        self.max_seqs = knobs.max_num_seqs
        self.token_budget = knobs.max_num_batched_tokens
        self.chunked = knobs.chunked_prefill
        self.block = calibration.block_size
        self.kv_capacity = calibration.kv_capacity_tokens

        self.clock = 0.0
        self.step = 0
        # Step s ends at _step_blocks[s // STEP_BLOCK][s % STEP_BLOCK]; step_times is the block being filled.
        self._step_blocks: list[np.ndarray] = [np.empty(STEP_BLOCK)]
        self.step_times = self._step_blocks[0]
        # step_times as a memoryview: a store through it takes half the time of numpy's item assignment.
        self._step_view: memoryview[float] = memoryview(self.step_times)  # type: ignore[arg-type]
        self._block_base = 0  # the step index of step_times[0]
        self.busy_s = 0.0
        self.preemptions = 0
        self.generated_tokens = 0.0

        self.waiting: deque[Q] = deque()
        self.prefilling: list[Q] = []
        # Float: decodes with speculation grow the cache by a fractional expected count per step.
        self.kv_used = 0.0
        self._admit_seq = 0
        # The largest running count that max_seqs was compared with (admission, admits_head): any
        # max_num_seqs above it would have made every one of those tests come out the same, so the same run
        # (core/sim/reach.py; a tune's sweep reuses the run for those values). The fast replica keeps it.
        self.seqs_probe = 0

    # ------------------------------------------------------------ what each replica defines

    def enqueue(self, req: SimRequest, now: float) -> None:
        """Accept a request released at `now`; an idle replica's next step starts no earlier than that."""
        raise NotImplementedError

    def has_work(self) -> bool:
        raise NotImplementedError

    @property
    def running(self) -> int:
        """Requests admitted (prefilling or decoding)."""
        raise NotImplementedError

    def step_once(self) -> bool:
        """Form one batch and execute it. Returns False when there was nothing to run."""
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
        """Run the steps that only decode, up to the next event (each replica's own contract); how many."""
        raise NotImplementedError

    # ------------------------------------------------------------ shared

    def _wake_at(self, now: float) -> None:
        if not self.has_work() and self.clock < now:
            self.clock = now

    def _draw_acceptance(self, spec: RequestSpec) -> float:
        """This request's draft acceptance rate: a Beta draw around its task's mean (or the calibration's)."""
        mean = spec.acceptance if spec.acceptance is not None else self.calibration.default_acceptance
        concentration = self.calibration.acceptance_concentration
        if mean <= 0.0:
            return 0.0
        return float(self.rng.beta(mean * concentration, (1.0 - mean) * concentration))

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.kv_used / self.kv_capacity)

    def _noise_block(self) -> list[float]:
        """The next NOISE_CHUNK step-time factors, as a list of the same doubles (blocks.py says why a list, and
        why a chunk). The replica's rng draws NOISE_BLOCK of them at a time, when a step first needs one of a new
        block, as it always has: the same draws at the same point of its stream."""
        cv = self.calibration.noise_cv
        if cv <= 0:
            return [1.0] * NOISE_CHUNK
        start = self._noise_next
        if start >= NOISE_BLOCK:
            sigma = math.sqrt(math.log1p(cv * cv))
            self._noise_draws = self.rng.lognormal(-0.5 * sigma * sigma, sigma, NOISE_BLOCK)
            start = 0
        self._noise_next = start + NOISE_CHUNK
        draws = self._noise_draws
        assert draws is not None
        factors: list[float] = draws[start : start + NOISE_CHUNK].tolist()
        return factors

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block) * self.block

    def _noisy(self, dt: float) -> float:
        i = self._noise_i
        if i >= NOISE_CHUNK:
            self._noise = self._noise_block()
            i = 0
        self._noise_i = i + 1
        return dt * self._noise[i]

    def _record_step_end(self, dt: float) -> int:
        """Advance the clock by one step of `dt` seconds (plus any stall that falls in it); returns its index."""
        if self._stalls is not None:
            dt += self._stalls.stall_within(dt)
        self.clock += dt
        self.busy_s += dt
        step = self.step
        if step - self._block_base >= STEP_BLOCK:
            self._next_step_block()
        # through the memoryview: the same double stored, at a third of numpy's item assignment (one per step)
        self._step_view[step - self._block_base] = self.clock
        return step

    def _next_step_block(self) -> None:
        self.step_times = np.empty(STEP_BLOCK)
        self._step_view = memoryview(self.step_times)  # type: ignore[arg-type]
        self._step_blocks.append(self.step_times)
        self._block_base += STEP_BLOCK

    def _step_span(self, first: int, last: int) -> np.ndarray:
        """End times of steps first..last: a view when they share a block, else a copy."""
        block, offset = divmod(first, STEP_BLOCK)
        if last - first < STEP_BLOCK - offset:
            return self._step_blocks[block][offset : offset + last - first + 1]
        end_block, end_offset = divmod(last, STEP_BLOCK)
        return np.concatenate(
            [
                self._step_blocks[block][offset:],
                *self._step_blocks[block + 1 : end_block],
                self._step_blocks[end_block][: end_offset + 1],
            ]
        )


class SimReplicaView:
    """What a policy sees of one simulated replica (core/controller_api.ReplicaView)."""

    __slots__ = ("_replica", "in_flight", "index")

    def __init__(self, replica: ReplicaBase[Any]) -> None:
        self.index = replica.index
        self._replica = replica
        self.in_flight: dict[int, ControlledRequest] = {}

    @property
    def load(self) -> int:
        return len(self.in_flight)

    @property
    def engine_waiting(self) -> int:
        return len(self._replica.waiting)

    @property
    def kv_usage(self) -> float:
        return self._replica.kv_usage
