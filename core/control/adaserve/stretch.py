"""Several of AdaServe's throughput-phase selection steps computed at once, exactly as one at a time.

A selection step with nobody behind (Algorithm 2 with only its throughput-optimized selection, paper 002
sec. 4.3 step 3: the budget's globally most probable candidates, then verification) reads nothing but the
batch, its budget B, the tree shape (d, w) that B and the batch size give, and each request's randomness at
this step, which was drawn ahead (scheduler.AcceptanceRun: entry `next` is the step's). So while the batch
and its (d, w) stay the same, the next K steps' path probabilities are known now (computed once: they do not
depend on B), and their selections and draws at one B: `TreeScheduler.throughput_step` on the K steps at
once, each row to the bit what the step alone gives. No random number is drawn: the steps read entries
already drawn, and a stretch is never built past the end of any request's run (the draw at a run's end
stays where it was).

The planner (policy.TreePlanner) builds a stretch at a throughput selection step and takes its rows while
its checks hold: the same batch (the same requests in the same order), the same (d, w), and every run
advanced in lockstep (any other step that advances runs drops the stretch). Rows are selected a few steps
at a time: where B has changed (it grows with the context the batch holds), the next rows are selected at
the new B. A row not taken is never read; its runs' entries are read again by whatever step comes next.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.control.adaserve.scheduler import AcceptanceRun, float_array
from core.control.adaserve.speculation import candidate_shape, path_probabilities
from core.pickling import reduce_by_fields
from core.step_planner_api import StepRequest

STRETCH_STEPS = 8  # the most steps a stretch computes ahead (a batch holds ~5 selection steps in a row)
SELECT_STEPS = 4  # the most steps selected at one B at once (B grows with the context every few steps)
TOKENS_PER_STEP = 3  # a stretch's rows reach no further than a third of the tokens any request has left (stretch_steps)

# TreeScheduler.throughput_step: (probs (K, 2, n, N), uniforms (K, n), B) -> (verified, emitted), (K, n) each.
Throughput = Callable[[np.ndarray, np.ndarray, int], tuple[np.ndarray, np.ndarray]]


@dataclass(slots=True)
class SelectionStretch:
    """K consecutive throughput selection steps of one batch: each step's path probabilities and uniforms and,
    for up to SELECT_STEPS steps from `start` at one budget B, each request's verified positions (root
    included) and emitted tokens."""

    items: list[StepRequest]  # the batch, in order (a copy)
    runs: list[AcceptanceRun]  # their runs, in the same order
    first: int  # runs[0].next at the stretch's first step, before that step's advance
    dims: tuple[int, int]  # the tree's (d, w)
    probs: np.ndarray  # (K, 2, n, N): each step's estimates' path probabilities, then its truths' (no B in them)
    uniforms: np.ndarray  # (K, n)
    throughput: Throughput
    budget: int = 0  # B of the rows selected
    start: int = 0  # the first step selected at `budget`
    verified: list[list[int]] = field(default_factory=list)  # [step - start][request]
    emitted: list[list[int]] = field(default_factory=list)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    def select(self, start: int, budget: int) -> None:
        """Select the steps from `start` on at budget B, at most SELECT_STEPS of them (B changes every few
        steps, and rows selected at an old B are thrown away)."""
        end = start + SELECT_STEPS
        verified, emitted = self.throughput(self.probs[start:end], self.uniforms[start:end], budget)
        self.budget, self.start = budget, start
        self.verified, self.emitted = verified.tolist(), emitted.tolist()

    def take(
        self, decoding: list[StepRequest], budget: int, dims: tuple[int, int]
    ) -> tuple[list[int], list[int]] | None:
        """This step's row, advancing every request's run by one as the step-by-step columns do (selected first
        where B has changed or the rows selected end before it); None when the batch or the tree's (d, w) is
        not the stretch's or its steps are used up (then nothing changes). The caller asks it only for a step
        whose candidates do not all fit B and B > n (no full tree)."""
        if dims != self.dims or decoding != self.items:  # (StepRequest compares by identity)
            return None
        runs = self.runs
        step = runs[0].next - self.first
        if step >= len(self.uniforms):
            return None
        row = step - self.start
        if budget != self.budget or row >= len(self.verified):
            self.select(step, budget)
            row = 0
        for run in runs:
            run.next += 1
        return self.verified[row], self.emitted[row]


def stretch_steps(
    decoding: list[StepRequest], slo_selection: bool, drawn: Callable[[StepRequest], AcceptanceRun]
) -> int:
    """How many steps a stretch built at this step may hold, asked before the step takes its entries: at most
    STRETCH_STEPS, none past any request's run (its entries from this step's on) nor past a third of its tokens left
    (it emits at least one token a step, about three on bench-chat), and none when Algorithm 2's SLO phase is
    on and some request has a TPOT SLO (a later step may find it behind, which the throughput phase alone,
    paper 002 sec. 4.3 step 3, does not answer). `drawn(item)` is the request's run with this step's entry
    drawn (TreePlanner._drawn_run: a run is drawn when a step first needs it, in the batch's order, as the
    step's columns would draw it), not advanced. Asking this first lets a step that builds a stretch skip the
    columns the stretch gathers again."""
    steps = STRETCH_STEPS
    for item in decoding:
        run = drawn(item)
        if slo_selection and item.planned.tpot_s < math.inf:
            return 0
        entries = run.length - run.next
        if entries < steps:
            steps = entries
        # A request's completion changes the batch and ends the stretch; it emits 1 + its accepted drafts a
        # step (about 3.4 on bench-chat), so rows past a third of its tokens left are rarely read (measured at
        # 5k: with out_left 8, 2.4 of 8 rows were). This bounds only how far ahead rows are computed, never a
        # value; it keeps the hard bound (at least one token a step: never past out_left). A third rather than
        # half (session 40, compiled bench-chat 3k): 3.3-3.6% fewer instructions in all; a quarter saved less.
        ahead = (item.out_left + 1) // TOKENS_PER_STEP
        if ahead < steps:
            steps = ahead
    return steps


def advance(decoding: list[StepRequest]) -> None:
    """Every request's run past this step's entry (what the step's columns do; `build_stretch` expects it)."""
    for item in decoding:
        run: AcceptanceRun = item.planned.run  # (typed: native field reads, not generic ones)
        run.next += 1


def build_stretch(
    decoding: list[StepRequest], dims: tuple[int, int], budget: int, steps: int, throughput: Throughput
) -> SelectionStretch:
    """The stretch whose first step is the one whose entries the runs have just taken (each run's `next` is
    one past it, as `TreePlanner._step_columns` leaves it), for `steps` steps (each run must hold them)."""
    runs: list[AcceptanceRun] = [item.planned.run for item in decoding]  # (typed: native field reads)
    n = len(runs)
    # (K, 3n): each step's n estimates, n truths and n uniforms, from the first step's entries on (flat lists
    # into one array: numpy reads a flat list of floats far cheaper than a list of lists).
    estimates: list[float] = []
    truths: list[float] = []
    uniforms: list[float] = []
    for run in runs:
        start = run.next - 1
        end = start + steps
        if end > run.listed:  # (the run's lists are filled as steps reach them)
            run.list_through(end)
        estimates += run.estimate_list[start:end]
        truths += run.truth_list[start:end]
        uniforms += run.uniform_list[start:end]
    estimates += truths
    estimates += uniforms
    columns = float_array(estimates).reshape(3 * n, steps).T
    rates = columns[:, : 2 * n].ravel()  # step by step: its n estimates, then its n truths
    shape = candidate_shape(*dims)
    probs = path_probabilities(shape, rates, clipped=True, shared=False).reshape(steps, 2, n, shape.size)
    stretch = SelectionStretch(list(decoding), runs, runs[0].next - 1, dims, probs, columns[:, 2 * n :], throughput)
    stretch.select(0, budget)
    return stretch
