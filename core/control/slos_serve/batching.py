"""Batch formation with a dynamic batch size (paper 004, Algorithm 2, sec. 3.2.2) and SLO-adaptive
speculation per request (sec. 3.2.3).

One batch: the decode plan of the tiers now decoding (budget.py) fixes its duration (the tightest TPOT, or
TPOT x Acc(sl) with speculation) and so its token budget; decode tokens go first, earliest-deadline-first,
to the requests whose next token falls due before the batch ends (each verifies 1 + its tier's speculation
length); the rest of the budget goes to prefill, earliest prefill deadline first. Additions to the paper's
pseudocode, all work-conserving (`work_conserving=True`): prefill gets first only what its deadlines need
soon (`urgency` x the least rate that meets them all), then decodes not yet due get a token too (a request
that finishes sooner frees its KV cache sooner), then prefill takes the rest; the best-effort tier
(sec. 4.1) gets only what the SLO requests leave.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from core.control.slos_serve.budget import BudgetModel
from core.pickling import reduce_by_fields
from core.step_time import expected_accepted_tokens


@dataclass(slots=True)
class DecodeTask:
    request_id: int
    tpot_s: float
    next_due_s: float  # when its next output token is due
    tokens_left: float
    best_effort: bool = False

    def __init__(
        self, request_id: int, tpot_s: float, next_due_s: float, tokens_left: float, best_effort: bool = False
    ) -> None:
        # The dataclass's own __init__, written out (admission.NATIVE_INIT: a native constructor when compiled).
        self.request_id = request_id
        self.tpot_s = tpot_s
        self.next_due_s = next_due_s
        self.tokens_left = tokens_left
        self.best_effort = best_effort

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(slots=True)
class PrefillTask:
    request_id: int
    deadline_s: float  # prefill deadline (arrival + TTFT SLO)
    tokens_left: int
    best_effort: bool = False
    tpot_s: float = 0.0  # its decode SLO once the prefill is done (schedule_batches)
    decode_tokens: int = 0

    def __init__(
        self,
        request_id: int,
        deadline_s: float,
        tokens_left: int,
        best_effort: bool = False,
        tpot_s: float = 0.0,
        decode_tokens: int = 0,
    ) -> None:
        # The dataclass's own __init__, written out (admission.NATIVE_INIT: a native constructor when compiled).
        self.request_id = request_id
        self.deadline_s = deadline_s
        self.tokens_left = tokens_left
        self.best_effort = best_effort
        self.tpot_s = tpot_s
        self.decode_tokens = decode_tokens

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


# Prefill that cannot wait gets this multiple of the least rate that meets every prefill deadline first.
URGENCY = 2.0

_DUE = operator.attrgetter("next_due_s")
_DEADLINE = operator.attrgetter("deadline_s")


@dataclass(slots=True)
class StepBatch:
    start_s: float
    duration_s: float  # the plan's batch time (the tokens below may fill less)
    token_budget: int
    decode: dict[int, int] = field(default_factory=dict)  # request -> positions verified (1 + drafts)
    prefill: dict[int, int] = field(default_factory=dict)  # request -> prompt tokens this batch

    def __init__(
        self,
        start_s: float,
        duration_s: float,
        token_budget: int,
        decode: dict[int, int] | None = None,
        prefill: dict[int, int] | None = None,
    ) -> None:
        # The dataclass's own __init__ (fresh dicts for those not given), written out (admission.NATIVE_INIT).
        self.start_s = start_s
        self.duration_s = duration_s
        self.token_budget = token_budget
        self.decode = {} if decode is None else decode
        self.prefill = {} if prefill is None else prefill

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    @property
    def tokens(self) -> int:
        return sum(self.decode.values()) + sum(self.prefill.values())


def form_batch(
    now: float,
    decoding: Sequence[DecodeTask],
    prefilling: Sequence[PrefillTask],
    budget: BudgetModel,
    *,
    work_conserving: bool = True,
    urgency: float = URGENCY,
) -> StepBatch:
    """The next batch (Algorithm 2's loop body) for the requests as they stand at `now`."""
    tiers = {t: i for i, t in enumerate(budget.tiers)}
    mask = 0
    for d in decoding:
        if not d.best_effort:
            mask |= 1 << tiers[d.tpot_s]
    plan = budget.plan(mask)
    batch = StepBatch(now, plan.batch_time_s, int(plan.batch_tokens))
    left = batch.token_budget
    end = now + plan.batch_time_s
    slo_decodes = sorted([d for d in decoding if not d.best_effort and d.tokens_left > 0], key=_DUE)
    later: list[DecodeTask] = []
    # Algorithm 2, lines 8-13: EDF over the decodes whose next token would be late if it waited for the
    # next batch (one due before that batch could end).
    next_end = end + plan.batch_time_s - 1e-9
    for d in slo_decodes:
        if d.next_due_s >= next_end:
            later.append(d)
            continue
        need = 1 + plan.spec_len[tiers[d.tpot_s]]
        if need > left:
            break
        batch.decode[d.request_id] = need
        left -= need
    slo_prefills = sorted([p for p in prefilling if not p.best_effort], key=_DEADLINE)
    if work_conserving:
        # Prefill that cannot wait (at `urgency` x the least rate that meets every prefill deadline), then
        # the decodes not yet due (finished sooner, they free their KV sooner), then the rest of the prefill.
        urgent = urgent_prefill_tokens(now, slo_prefills, plan.batch_time_s, urgency)
        left -= _fill_prefill(batch, slo_prefills, min(left, urgent))
        for d in later:
            need = 1 + plan.spec_len[tiers[d.tpot_s]]
            if need > left:
                break
            batch.decode[d.request_id] = need
            left -= need
    left -= _fill_prefill(batch, slo_prefills, left)
    if work_conserving:
        for p in (p for p in prefilling if p.best_effort):
            if left <= 0:
                break
            chunk = min(p.tokens_left, left)
            if chunk > 0:
                batch.prefill[p.request_id] = chunk
                left -= chunk
        for d in decoding:
            if left <= 0:
                break
            if d.best_effort and d.tokens_left > 0:
                batch.decode[d.request_id] = 1
                left -= 1
    return batch


def urgent_prefill_tokens(now: float, slo_prefills: Sequence[PrefillTask], batch_time_s: float, urgency: float) -> int:
    """The prefill tokens a work-conserving batch gives first: `urgency` x the least rate that meets every
    prefill deadline, over one batch (`slo_prefills` in deadline order)."""
    return math.ceil(urgency * _least_prefill_rate(now, slo_prefills, batch_time_s) * batch_time_s)


def prefill_beside_every_decode(token_budget: int, decodes: int, urgent: int, prefill_left: int) -> int | None:
    """What `form_batch` gives the SLO prefills, when it gives each of `decodes` SLO decodes one token (no
    speculation, every decode with tokens left): None where that is not sure. Best-effort requests do not
    change it (form_batch serves them after the SLO prefill, from what is left).

    The due decodes take one token each (all of them, when `decodes` fit the budget), the urgent prefill
    min(left, urgent, prefill_left), then the later decodes a token each while any is left, then the prefill
    the rest. When token_budget - decodes >= min(urgent, prefill_left), the urgent share leaves a token for
    every later decode whatever the due times split them into, and the prefill gets min(token_budget -
    decodes, prefill_left) in deadline order (both fills walk the same order from where they stand). The
    simulated replica asks it at each step of a stretch with a prefill chunk (stepping.plain_prefill_check)."""
    left = token_budget - decodes
    if left < 0 or left < min(urgent, prefill_left):
        return None
    return min(left, prefill_left)


def _least_prefill_rate(now: float, prefills: Sequence[PrefillTask], batch_time_s: float) -> float:
    """Tokens per second that prefill in deadline order must run at to meet every deadline (a deadline
    within the next batch counts as due at its end)."""
    rate = 0.0
    total = 0.0
    for p in prefills:
        total += p.tokens_left
        rate = max(rate, total / max(p.deadline_s - now, batch_time_s))
    return rate


def _fill_prefill(batch: StepBatch, prefills: Sequence[PrefillTask], tokens: int) -> int:
    """Give up to `tokens` prefill tokens in deadline order (on top of what the batch already gives them)."""
    used = 0
    for p in prefills:
        if used >= tokens:
            break
        chunk = min(p.tokens_left - batch.prefill.get(p.request_id, 0), tokens - used)
        if chunk > 0:
            batch.prefill[p.request_id] = batch.prefill.get(p.request_id, 0) + chunk
            used += chunk
    return used


def schedule_batches(
    now: float,
    horizon_s: float,
    decoding: Sequence[DecodeTask],
    prefilling: Sequence[PrefillTask],
    budget: BudgetModel,
    *,
    work_conserving: bool = False,
) -> list[StepBatch]:
    """Algorithm 2 run forward over `horizon_s` in the plan's own model: each decode gains its expected
    tokens per verification and its next token falls due one TPOT per token later; a request whose prefill
    completes decodes from its prefill deadline on (the DP's accounting, sec. 3.2.1). Pure: the inputs are
    copied, not changed."""
    decodes = [DecodeTask(d.request_id, d.tpot_s, d.next_due_s, d.tokens_left, d.best_effort) for d in decoding]
    prefills = [
        PrefillTask(p.request_id, p.deadline_s, p.tokens_left, p.best_effort, p.tpot_s, p.decode_tokens)
        for p in prefilling
    ]
    tiers = {t: i for i, t in enumerate(budget.tiers)}
    batches: list[StepBatch] = []
    clock = now
    while clock < now + horizon_s - 1e-9:
        batch = form_batch(clock, decodes, prefills, budget, work_conserving=work_conserving)
        if batch.duration_s <= 0.0:
            break
        batches.append(batch)
        clock += batch.duration_s
        for d in decodes:
            verified = batch.decode.get(d.request_id)
            if verified:
                gained = expected_accepted_tokens(budget.acceptance, verified - 1) if verified > 1 else 1.0
                d.tokens_left -= gained
                d.next_due_s += d.tpot_s * gained
        for p in prefills:
            p.tokens_left -= batch.prefill.get(p.request_id, 0)
            if p.tokens_left <= 0 and p.decode_tokens > 0 and p.tpot_s in tiers:
                start = max(clock, p.deadline_s)
                decodes.append(DecodeTask(p.request_id, p.tpot_s, start + p.tpot_s, p.decode_tokens, p.best_effort))
                p.decode_tokens = 0
        prefills = [p for p in prefills if p.tokens_left > 0]
    return batches
