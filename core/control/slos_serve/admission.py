"""SLOs-Serve's admission control: a dynamic program over prefill deadlines (paper 004, sec. 3.2.1, App. C).

The question it answers, for one replica at time `now`: of the new requests, which can be admitted so
that every admitted request (the ones already running included) still meets its SLOs, admitting as many
as possible?

Model (the paper's, in "fluid" token rates):
- Requests are visited in order of prefill deadline (arrival + TTFT SLO). Between two consecutive
  deadlines the replica produces batch tokens at the rate of the decode plan for the tiers that decode
  then (budget.py: the tightest TPOT sets the batch time, Algorithm 2); the decodes of admitted requests
  take their share (a request admitted with prefill deadline d decodes from d on at 1 token per TPOT);
  what is left is the prefill budget `pb`.
- A request is admitted when the prefill budget accumulated by its deadline, after paying every earlier
  admitted prefill, still covers its prompt: pb[i] = pb[j] + delta(j -> i) - p_i >= 0. State: the number
  of admitted requests per TPOT tier (the decode population that fixes delta); value: the most prefill
  budget left (Appendix C's throughput form: every request is worth one, so the count is the objective).
- Running requests are admitted by force ("continuous optimisation"): decoding ones are a known token
  demand (their remaining tokens at their pace), prefilling ones are visited at their deadline and always
  taken. A new request is admitted only where no admitted request's budget goes negative.
- KV memory: admitted requests (prompt + output, lengths known as in the paper's evaluation) must fit
  in what the running requests leave of the KV cache; and sequence slots: with `max_seqs` (the engine's
  max_num_seqs), no more are admitted than the running requests leave. The paper's memory check alone
  let the DP admit a burst into an engine whose slots long decodes held, where the new requests queued
  past their TTFT (on a bursty trace of long-output requests, a quarter of the admitted ones).
- After the last deadline the admitted decode population must still fit the batches (prefill rate >= 0).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from core.control.slos_serve.budget import BudgetModel
from core.pickling import reduce_by_fields
from core.step_time import StepTimeModel

EPSILON = 1e-6  # tokens: rounding slack in budget comparisons
# NATIVE_INIT: the dataclasses built per decision or per DP state here, in batching.py and in virtual.py write their
# __init__ out (the same parameters, defaults and assignments as the generated one, which `dataclass` then keeps).
# Compiled, mypyc calls a class's own __init__ natively with unboxed arguments; the generated one is interpreted
# code reached through tp_init with an argument tuple (1.8-5k instructions a construction, ~4% of a SLOs-Serve run).


@dataclass(slots=True)
class PlanRequest:
    """One request as the planner sees it."""

    request_id: int
    prefill_deadline_s: float  # absolute: arrival + TTFT SLO
    prefill_tokens: int  # prompt tokens still to prefill (0: decoding)
    decode_tokens: int  # output tokens still owed after the first
    tpot_s: float
    kv_tokens: int  # KV the request holds when it ends (prompt + output)
    context_tokens: int = 0  # KV it holds now
    # Decoding requests: when their token pace starts (token k of the remaining is due at start + k * TPOT).
    decode_start_s: float = 0.0

    def __init__(
        self,
        request_id: int,
        prefill_deadline_s: float,
        prefill_tokens: int,
        decode_tokens: int,
        tpot_s: float,
        kv_tokens: int,
        context_tokens: int = 0,
        decode_start_s: float = 0.0,
    ) -> None:
        # The dataclass's own __init__, written out (see NATIVE_INIT).
        self.request_id = request_id
        self.prefill_deadline_s = prefill_deadline_s
        self.prefill_tokens = prefill_tokens
        self.decode_tokens = decode_tokens
        self.tpot_s = tpot_s
        self.kv_tokens = kv_tokens
        self.context_tokens = context_tokens
        self.decode_start_s = decode_start_s

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    @property
    def decoding(self) -> bool:
        return self.prefill_tokens <= 0


@dataclass(slots=True)
class Admission:
    admitted: list[int] = field(default_factory=list)  # new requests' ids, in deadline order
    declined: list[int] = field(default_factory=list)
    prefill_slack_tokens: float = 0.0  # prefill budget left at the last deadline of the chosen plan

    def __init__(
        self, admitted: list[int] | None = None, declined: list[int] | None = None, prefill_slack_tokens: float = 0.0
    ) -> None:
        # The dataclass's own __init__ (fresh lists for those not given), written out (see NATIVE_INIT).
        self.admitted = [] if admitted is None else admitted
        self.declined = [] if declined is None else declined
        self.prefill_slack_tokens = prefill_slack_tokens

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    max_batch_tokens: int
    kv_capacity_tokens: int
    max_spec_len: int = 0
    acceptance: float = 0.0
    # None: batches as large as the tightest TPOT allows (Algorithm 2); a share: the roofline's knee (budget.py).
    knee_efficiency: float | None = None
    # The engine's sequence limit (max_num_seqs); None: no limit but memory.
    max_seqs: int | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(slots=True)
class _State:
    budget: float  # prefill budget at the last visited deadline
    memory: int  # KV of the new requests admitted so far
    admitted: int  # bitmask over new-request positions
    new: int  # how many new requests are admitted

    def __init__(self, budget: float, memory: int, admitted: int, new: int) -> None:
        # The dataclass's own __init__, written out (see NATIVE_INIT).
        self.budget = budget
        self.memory = memory
        self.admitted = admitted
        self.new = new

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(slots=True)
class RunningParts:
    """What the admission DP reads of the running requests (`admit`'s `running`, summed and split): their TPOTs
    (in any order), context and KV tokens (sums of ints), how many, the prefilling ones (prefill_tokens > 0, in
    order) and, in order, each decoding one still owed tokens as (decode_start_s, tpot_s, decode_tokens)."""

    tpots: list[float]
    context_tokens: int
    kv_tokens: int
    count: int
    forced: list[PlanRequest]
    decoders: list[tuple[float, float, int]]

    def __init__(
        self,
        tpots: list[float],
        context_tokens: int,
        kv_tokens: int,
        count: int,
        forced: list[PlanRequest],
        decoders: list[tuple[float, float, int]],
    ) -> None:
        # The dataclass's own __init__, written out (see NATIVE_INIT).
        self.tpots = tpots
        self.context_tokens = context_tokens
        self.kv_tokens = kv_tokens
        self.count = count
        self.forced = forced
        self.decoders = decoders

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


def plan_parts(running: Sequence[PlanRequest]) -> RunningParts:
    """The parts `admit_parts` reads of `running`, in one pass (`decoding`, prefill_tokens <= 0, inline)."""
    forced: list[PlanRequest] = []
    decoders: list[tuple[float, float, int]] = []
    for r in running:
        if r.prefill_tokens > 0:
            forced.append(r)
        elif r.decode_tokens > 0:
            decoders.append((r.decode_start_s, r.tpot_s, r.decode_tokens))
    return RunningParts(
        [r.tpot_s for r in running],
        sum(r.context_tokens for r in running),
        sum(r.kv_tokens for r in running),
        len(running),
        forced,
        decoders,
    )


def tier_list(tpots: Iterable[float]) -> list[float]:
    """The distinct TPOT SLOs, tightest first (per-TPOT tiers, sec. 3.2.1 "Multi-Decode SLOs")."""
    if type(tpots) is list and tpots:
        # A list of one TPOT over and over (one SLO class: bench-chat's every request), compared instead of hashed
        # into a set: the set would keep the first of the equal values (a NaN equals nothing: the set path).
        values = cast(list[float], tpots)
        first = values[0]
        for tpot in values:
            if tpot != first:
                return sorted(set(values))
        return [first]
    return sorted(set(tpots))


class AdmissionPlanner:
    """Runs the admission DP for one replica; `model` is the calibrated step-time model."""

    def __init__(self, model: StepTimeModel, settings: PlannerSettings) -> None:
        self.model = model
        self.settings = settings
        # BudgetModel's kept batches (its `memo`), shared by the models of every decision with the same tiers: the
        # step-time model, batch cap and knee are this planner's (a decision's models differ in KV and sequences).
        self._memos: dict[tuple[float, ...], dict[tuple[int, int], tuple[Any, ...]]] = {}

    def batch_memo(self, tiers: Sequence[float]) -> dict[tuple[int, int], tuple[Any, ...]]:
        """The kept batches shared by this planner's BudgetModels on `tiers` (BudgetModel's `memo`)."""
        key = tuple(tiers)
        memo = self._memos.get(key)
        if memo is None:
            memo = self._memos[key] = {}
        return memo

    def budget_model(self, running: Sequence[PlanRequest], new: Sequence[PlanRequest]) -> BudgetModel:
        return self._budget_model(
            [r.tpot_s for r in running], sum(r.context_tokens for r in running), len(running), new
        )

    def _budget_model(
        self, tpots: list[float], running_context: int, running: int, new: Sequence[PlanRequest]
    ) -> BudgetModel:
        """`budget_model` from the running requests' TPOTs (in any order: only counted), their context tokens
        and their number."""
        tpots = tpots + [r.tpot_s for r in new]
        tiers = tier_list(tpots)
        if len(tiers) == 1:
            reference = [float(len(tpots))]  # 1.0 added that many times (exact: a count far below 2**53)
        else:
            index = {t: i for i, t in enumerate(tiers)}
            reference = [0.0] * len(tiers)
            for tpot in tpots:
                reference[index[tpot]] += 1.0
        s = self.settings
        return BudgetModel(
            self.model,
            tiers,
            max_batch_tokens=s.max_batch_tokens,
            context_tokens=running_context + sum(r.prefill_tokens for r in new),
            sequences=running + len(new),
            max_spec_len=s.max_spec_len,
            acceptance=s.acceptance,
            reference_counts=reference,
            knee_efficiency=s.knee_efficiency,
            memo=self.batch_memo(tiers),
        )

    def slots_free(self, running: int, new: int) -> int:
        """Sequence slots the DP may fill: what `running` requests leave of max_num_seqs (no limit: all `new`).
        With none free the DP admits nobody (`state.new < slots_free` never holds)."""
        max_seqs = self.settings.max_seqs
        return new if max_seqs is None else max_seqs - running

    def admit(self, now: float, running: Sequence[PlanRequest], new: Sequence[PlanRequest]) -> Admission:
        if not new:
            return Admission()
        return self.admit_parts(now, plan_parts(running), new)

    def admit_parts(self, now: float, running: RunningParts, new: Sequence[PlanRequest]) -> Admission:
        """`admit` with the running requests given as the parts the DP reads (RunningParts; the controller's
        virtual replica builds them from its own records without a PlanRequest per decoding request)."""
        if not new:
            return Admission()
        budget = self._budget_model(running.tpots, running.context_tokens, running.count, new)
        tiers = budget.tiers
        tier_of = {t: i for i, t in enumerate(tiers)}
        n_tiers = len(tiers)
        forced = running.forced
        decoders = running.decoders

        # Visit order: by prefill deadline; a running request before a new one on a tie.
        visits: list[tuple[float, int, int, PlanRequest]] = [(r.prefill_deadline_s, 0, -1, r) for r in forced]
        visits += [(r.prefill_deadline_s, 1, pos, r) for pos, r in enumerate(new)]
        if len(visits) > 1:  # (the usual decision: one arrival, nothing prefilling; a sort still keys its one visit)
            visits.sort(key=lambda v: (v[0], v[1]))
        deadlines = [max(v[0], now) for v in visits]
        # Each decoding request's tier looked up once (with one tier, every TPOT is it: no float hashing), for its
        # pace and for the tiers decoding and the ones still decoding after the last deadline.
        one_tier = n_tiers == 1
        decoder_tiers: list[int] = []  # (left empty with one tier: every decoding request is in tier 0)
        running_mask = 0
        alive_at_end = [0] * n_tiers
        last = deadlines[-1]
        for start, pace, left in decoders:
            tier = 0
            if not one_tier:
                tier = tier_of[pace]
                decoder_tiers.append(tier)
            running_mask |= 1 << tier
            if start + left * pace > last:
                # (read, then stored: compiled, `+=` on a list item adds through the generic number protocol)
                alive: int = alive_at_end[tier]
                alive_at_end[tier] = alive + 1
        # The decoders' own tuples (no tuple of boxed floats rebuilt per request per decision, as `paces` were).
        demand = _demand_rows(decoders, decoder_tiers, n_tiers, deadlines)
        kv_free = self.settings.kv_capacity_tokens - running.kv_tokens
        slots_free = self.slots_free(running.count, len(new))

        states: dict[tuple[int, ...], _State] = {(0,) * n_tiers: _State(0.0, 0, 0, 0)}
        previous_t = now
        previous_demand = [0.0] * n_tiers
        for k, (deadline, kind, pos, req) in enumerate(visits):
            at = deadlines[k]
            dt = at - previous_t
            # (by index: every row holds n_tiers sums; compiled, `zip(..., strict=True)` is the builtin called through
            # the interpreter's API and iterated generically)
            row = demand[k]
            running_tokens = [row[i] - previous_demand[i] for i in range(n_tiers)]
            if dt > 0.0 or any(running_tokens):
                states = _advance(states, budget, running_mask, dt, running_tokens, tiers)
            previous_t, previous_demand = at, demand[k]
            tier = 0 if one_tier else tier_of[req.tpot_s]
            grown: dict[tuple[int, ...], _State] = {}
            for counts, state in states.items():
                bigger = (*counts[:tier], counts[tier] + 1, *counts[tier + 1 :])
                if kind == 0:  # running: admitted by force
                    room = state.budget - req.prefill_tokens
                    if room >= -EPSILON or state.new == 0:
                        _keep(grown, bigger, _State(room, state.memory, state.admitted, state.new))
                    continue
                _keep(grown, counts, state)
                room = state.budget - req.prefill_tokens
                memory = state.memory + req.kv_tokens
                if room >= -EPSILON and memory <= kv_free and state.new < slots_free and deadline > now:
                    _keep(grown, bigger, _State(room, memory, state.admitted | 1 << pos, state.new + 1))
            states = grown

        best: _State | None = None
        for counts, state in states.items():
            if state.new and not _sustainable(budget, running_mask, counts, alive_at_end):
                continue
            if best is None or (state.new, state.budget) > (best.new, best.budget):
                best = state
        chosen = 0 if best is None else best.admitted
        result = Admission(prefill_slack_tokens=0.0 if best is None else best.budget)
        for _, kind, pos, req in visits:
            if kind == 1:
                (result.admitted if chosen >> pos & 1 else result.declined).append(req.request_id)
        return result


def _running_demand(
    now: float, decoders: Sequence[PlanRequest], tier_of: dict[float, int], n_tiers: int, deadlines: Sequence[float]
) -> list[list[float]]:
    """Cumulative decode tokens the running requests are owed by each deadline, per tier (K lists of n_tiers).
    Tokens already overdue at `now` count in the first interval. Plain floats, summed request by request in
    their order (numpy's arrays cost more than their arithmetic at a few dozen requests and deadlines)."""
    paces = [(r.decode_start_s, r.tpot_s, r.decode_tokens) for r in decoders]
    return _demand_rows(paces, [tier_of[r.tpot_s] for r in decoders], n_tiers, list(deadlines))


def _demand_rows(
    decoders: list[tuple[float, float, int]], tiers: list[int], n_tiers: int, deadlines: list[float]
) -> list[list[float]]:
    """`_running_demand` from each decoding request's (pace start, TPOT, tokens left) (RunningParts.decoders) and,
    with more than one tier, its tier (`tiers`, in the same order; not read with one tier). Lists, typed: compiled,
    a Sequence is iterated through the interpreter's API."""
    out = []
    row: list[float] = []
    last = math.nan  # the deadline `row` is for (a NaN equals nothing: the first row is always worked out)
    # Deadline by deadline: each row's sums still run request by request in their order. A deadline equal to
    # the one before has the same row (the same operands in the same order; -0.0 and 0.0 are no deadlines
    # here): a best-effort retry's fresh windows are mostly `now` + the same TTFT SLO. The rows are only read.
    one_tier = n_tiers == 1
    for deadline in deadlines:
        if deadline != last:
            last = deadline
            if one_tier:  # the same sums in a local (0.0, then each request's owed tokens in order)
                total = 0.0
                for start, pace, tokens in decoders:
                    left = float(tokens)
                    owed = (deadline - start) / pace
                    if owed < 0.0:
                        owed = 0.0
                    if left < owed:
                        owed = left
                    total += owed
                row = [total]
                out.append(row)
                continue
            row = [0.0] * n_tiers
            for i, (start, pace, tokens) in enumerate(decoders):
                left = float(tokens)
                # min(max(owed, 0.0), left) without the two calls: the same value (max keeps `owed` unless 0.0
                # is larger, min keeps it unless `left` is smaller; NaN and -0.0 come through both alike)
                owed = (deadline - start) / pace
                if owed < 0.0:
                    owed = 0.0
                if left < owed:
                    owed = left
                row[tiers[i]] += owed
        out.append(row)
    return out


def _advance(
    states: dict[tuple[int, ...], _State],
    budget: BudgetModel,
    running_mask: int,
    dt: float,
    running_tokens: Sequence[float],
    tiers: Sequence[float],
) -> dict[tuple[int, ...], _State]:
    """Add the prefill budget each state earns over `dt`; drop states where an admitted request would
    miss (budget < 0 with new requests in it)."""
    out: dict[tuple[int, ...], _State] = {}
    running = [float(x) for x in running_tokens]
    for counts, state in states.items():
        mask = running_mask
        for tier, n in enumerate(counts):
            if n:
                mask |= 1 << tier
        plan = budget.plan(mask)
        gain = plan.supply_tps * dt
        for tier, cost in enumerate(plan.cost_per_token):
            owed = running[tier] + counts[tier] * dt / tiers[tier]
            if owed:
                gain -= cost * owed
        state = _State(state.budget + gain, state.memory, state.admitted, state.new)
        if state.budget < -EPSILON and state.new:
            continue
        out[counts] = state
    return out


def _keep(states: dict[tuple[int, ...], _State], counts: tuple[int, ...], state: _State) -> None:
    """Merge: per decode population, keep the state with the most prefill budget (then least memory)."""
    held = states.get(counts)
    # Ties go to the earlier requests (a smaller mask of positions in deadline order).
    if held is None or (state.budget, -state.memory, -state.admitted) > (held.budget, -held.memory, -held.admitted):
        states[counts] = state


def _sustainable(budget: BudgetModel, running_mask: int, counts: tuple[int, ...], alive: Sequence[int]) -> bool:
    """After the last deadline: do the admitted decodes (and the running ones still going) fit the batches?"""
    mask = running_mask
    total = []
    for tier, n in enumerate(counts):
        if n:
            mask |= 1 << tier
        total.append(n + alive[tier])
    return budget.prefill_rate(total, mask) >= -EPSILON
