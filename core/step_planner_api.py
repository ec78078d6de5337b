"""The step-planner seam: what a planner-driven engine replica hands a scheduling mode each step, and what it
gets back (the replica itself is core/sim/stepwise.py; the modes' planners are core/control/slos_serve/
stepping.py and core/control/adaserve/policy.py).

It sits in the bottom layer, beside the controller seam (core/controller_api.py), because both sides use it:
the simulator's replica calls a `StepPlanner` and the control package implements one. Kept inside core/sim,
control would have to import the simulator, and the simulator already calls control's policies; here neither
imports the other. The planner sees the replica only through `StepReplicaView` (the fields of
`StepwiseReplica` it reads), so a planner never reaches into the simulator's internals. `PlannedReplica` is the
same view as a native base class (a mypyc trait) that StepwiseReplica derives from: a compiled planner typed
with it reads those fields natively (see there).

`plan_fcfs_prefill` and `draw_accepted` are here too: vLLM's FCFS chunked prefill and left-to-right draft
verification are the building blocks every planner shares (the simulator's own `FcfsStepPlanner` and
AdaServe's), one definition each.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from core.pickling import reduce_by_fields
from core.records import RequestSpec
from core.step_time import StepTimeModel

_T = TypeVar("_T")

try:
    from mypy_extensions import trait
except ImportError:  # pure Python without mypy_extensions: the decorator changes nothing at run time

    def trait(cls: _T) -> _T:  # type: ignore[no-redef]
        return cls


class PlannedRequest(Protocol):
    """The simulator's request as a planner may see it (core/sim/sim_request.SimRequest)."""

    spec: RequestSpec
    latency_from_s: float  # when its latency clock started (its record's arrival_s)
    preemptions: int
    controlled: Any  # the controller's handle (core/controller_api.ControlledRequest); None on the fast path
    tier: str | None


@dataclass(slots=True, eq=False)
class StepRequest:
    """A request inside a planner-driven replica, with its token timeline so far (kept across preemption)."""

    req: PlannedRequest  # the simulator's request (core/sim/sim_request.SimRequest)
    prompt_left: int  # prompt (and, after a preemption, recomputed output) tokens still to prefill
    out_left: int  # output tokens still to produce
    acceptance: float = 0.0  # this request's per-token draft acceptance rate (drawn when it arrives)
    context: int = 0  # KV tokens held (block-rounded at admission, then +1 per emitted token)
    admitted_order: int = -1
    decoding: bool = False
    run_tokens: int = 0  # tokens decoded in this run after its prefill (KV growth, not block-rounded)
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    # With a planner that takes lazy timelines (`StepPlanner.lazy_timelines`), a decoding request is also owed a
    # token at each of the replica's `stretch_log[owed_from:]` (stretch steps not yet written into the fields
    # above: out_left, run_tokens and the chunk lists lag by that many until the replica settles them).
    owed_from: int = 0
    # What the planner keeps of this request (AdaServe's SLO and randomness ahead), dropped with the request
    # when it finishes (a planner's dict of them would have to be emptied on every completion).
    planned: Any = None

    @property
    def generated(self) -> int:
        """Output tokens streamed so far."""
        return self.req.spec.output_tokens - self.out_left

    @property
    def spec(self) -> RequestSpec:
        return self.req.spec

    def __init__(
        self,
        req: PlannedRequest,
        prompt_left: int,
        out_left: int,
        acceptance: float = 0.0,
        context: int = 0,
        admitted_order: int = -1,
        decoding: bool = False,
        run_tokens: int = 0,
        chunk_times: list[float] | None = None,
        chunk_tokens: list[int] | None = None,
        owed_from: int = 0,
        planned: Any = None,
    ) -> None:
        # The dataclass's own __init__ (fresh lists for the chunks when none are given), written out: compiled, mypyc
        # runs it natively where the generated one is interpreted (core/records.RequestRecord says more).
        self.req = req
        self.prompt_left = prompt_left
        self.out_left = out_left
        self.acceptance = acceptance
        self.context = context
        self.admitted_order = admitted_order
        self.decoding = decoding
        self.run_tokens = run_tokens
        self.chunk_times = [] if chunk_times is None else chunk_times
        self.chunk_tokens = [] if chunk_tokens is None else chunk_tokens
        self.owed_from = owed_from
        self.planned = planned

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(slots=True)
class BatchPlan:
    """One step's batch. `prefill` holds (request, prompt tokens this step) for requests already prefilling
    and, after them, requests to admit from the queue (in the order to try; admission stops at the first one
    whose KV cache does not fit, as vLLM's does). `decode` holds (decoding request, positions verified).
    `preempt` holds admitted requests the replica preempts (recompute) before this step, to free their memory
    and slots for the requests the planner admits instead; none of them may appear in `prefill` or `decode`."""

    prefill: list[tuple[StepRequest, int]] = field(default_factory=list)
    decode: list[tuple[StepRequest, int]] = field(default_factory=list)
    preempt: list[StepRequest] = field(default_factory=list)
    spec_steps: int = 0  # the draft model's sequential passes this step (a term of the step-time model)
    # Tokens each `decode` entry emits (1..verified), when the planner draws them with the batch (AdaServe's
    # trees); every entry then verifies at least one position. None: the replica asks `accepted` for each.
    emitted: list[int] | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


class StepReplicaView(Protocol):
    """What a step planner may read of its replica (core/sim/stepwise.StepwiseReplica)."""

    index: int
    clock: float  # the replica's clock: where the step it is about to run starts
    model: StepTimeModel  # the replica's step-time model (the same one that prices each step)
    width: int  # speculation width the knobs set (0: off)
    max_seqs: int
    token_budget: int
    chunked: bool
    block: int
    kv_capacity: int
    kv_used: float
    waiting: deque[StepRequest]
    prefilling: list[StepRequest]
    decoding: list[StepRequest]
    # The ends of stretch steps not yet written into the decoding requests' timelines (planners with
    # `lazy_timelines` only): a decoding request's true tokens left are out_left - (len(stretch_log) - owed_from).
    stretch_log: list[float]

    @property
    def running(self) -> int:
        """Requests admitted (prefilling or decoding)."""
        ...


@trait
class PlannedReplica:
    """`StepReplicaView` as a native base: what a compiled planner reads of its replica (core/sim/stepwise.
    StepwiseReplica derives from it, beside its concrete base). Typed with the protocol (or `Any`), a compiled
    planner reads every field through the interpreter's generic getattr (~200 instructions a read, a boxed int
    or float to unbox); typed with this trait, mypyc reads them natively (an offset from the class's trait
    table, a getter through its vtable for an int, float or bool). A trait because StepwiseReplica already
    has its one concrete base (core/sim/replica_base.ReplicaBase, which holds most of these fields); it holds
    no state of its own. Planners that tests also drive with duck-typed fakes (AdaServe's) keep the protocol."""

    index: int
    clock: float
    model: StepTimeModel
    width: int
    max_seqs: int
    token_budget: int
    chunked: bool
    block: int
    kv_capacity: int
    kv_used: float
    waiting: deque[StepRequest]
    prefilling: list[StepRequest]
    decoding: list[StepRequest]
    stretch_log: list[float]  # as StepReplicaView says

    @property
    def running(self) -> int:
        """Requests admitted (prefilling or decoding)."""
        raise NotImplementedError


class StepPlanner(Protocol):
    """Forms each batch of one replica (see the module docstring)."""

    #: Draw each request's acceptance rate on arrival even when the knobs turn speculation off.
    wants_acceptance: bool
    # `lazy_timelines`, optional (looked up with getattr, False when absent): True lets the replica leave a
    # stretch's tokens owed to the decoding requests (StepRequest.owed_from) until `plan`, a completion or a
    # preemption needs them; the planner then reads a decoding request's out_left only in `plan` or as the
    # view's stretch_log says.

    def plan(self, replica: StepReplicaView, now: float) -> BatchPlan: ...

    def accepted(self, request: StepRequest, verified: int, rng: np.random.Generator) -> int:
        """Tokens `request` emits after verifying `verified` positions (1..verified)."""
        ...


class PlainDecodePlanner(StepPlanner, Protocol):
    """A planner that lets the replica run stretches of plain decode steps without asking `plan` each step
    (stepwise.StepwiseReplica.run_decode_steps; the replica checks for the method with getattr, so the hook
    is optional). Such a step's batch is every decoding request verifying one position: spec_steps 0,
    nothing admitted, prefilled or preempted, and `accepted` draws nothing."""

    def plain_decode_check(self, replica: StepReplicaView) -> Callable[[float], bool] | None:
        """Asked with nothing prefilling (requests may be queued: the plain batch admits none of them). None, or
        a function `fits(kv_used)` whose True promises that `plan`, asked with the replica as it is now but at
        a later clock and with `kv_used` KV tokens in use, gives the plain decode batch. The steps the replica
        runs on that promise never reach `plan`, so the planner must keep no state that those calls would
        have updated, or `fits` updates it itself when it answers True (the replica then runs that step, which
        starts at its `clock`; AdaServe's step lengths)."""
        ...

    def plain_prefill_check(
        self, replica: StepReplicaView
    ) -> Callable[[float, float], list[tuple[StepRequest, int]] | None] | None:
        """Asked with requests prefilling, or queued with a sequence slot free (optional too). None, or a function
        `prefill_chunks(kv_used, now)` whose answer, a list of (request, prompt tokens), promises that `plan`,
        asked at clock `now` with `kv_used` KV tokens in use and the prompts as they then stand, gives every
        decoding request one position and those chunks, in that order (a queued request in it is admitted, as
        step_once admits it), and nothing else (no preemption or speculation); None: no promise for that
        step. The planner must keep what `plan` would have kept of the replica (SLOs-Serve's `sync` reads it)."""
        ...


def draw_accepted(rng: np.random.Generator, acceptance: float, drafted: int) -> int:
    """Left-to-right verification of `drafted` tokens at per-token acceptance `acceptance`: the accepted
    prefix plus the token the target model adds itself."""
    emitted = 1
    while emitted <= drafted and rng.random() < acceptance:
        emitted += 1
    return emitted


def plan_fcfs_prefill(replica: StepReplicaView, batch: BatchPlan, budget: int) -> None:
    """vLLM's chunked prefill with the `budget` tokens the decodes leave: running prefills first, then FCFS
    admission within max_num_seqs (whole prompts only without chunked prefill)."""
    for r in replica.prefilling:
        if budget <= 0:
            return
        chunk = min(r.prompt_left, budget)
        batch.prefill.append((r, chunk))
        budget -= chunk
    seqs = replica.running
    for r in replica.waiting:
        if budget <= 0 or seqs >= replica.max_seqs:
            return
        chunk = min(r.prompt_left, budget)
        if chunk < r.prompt_left and not replica.chunked:
            return
        batch.prefill.append((r, chunk))
        budget -= chunk
        seqs += 1
