"""A replica's scheduler in the controller (paper 004, sec. 4.2): it "virtualizes execution using the
performance model". It keeps the requests admitted to one replica and advances them in the planner's own
fluid model between events (prefill budget spent earliest-deadline-first, decodes at their TPOT pace), so
that each admission decision starts from where the plan says the replica is, without reading engine
internals. Where the engine can tell the truth (the simulator's step planner), `observe` overrides the
estimate with the real progress.

Best-effort requests are tracked too, but an SLO arrival's admission is planned without them (`try_admit`):
pricing them as SLO-holding running requests was what made admission far too conservative after a burst.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.control.slos_serve.admission import Admission, AdmissionPlanner, PlanRequest, RunningParts, tier_list
from core.control.slos_serve.budget import BudgetModel
from core.pickling import reduce_by_fields


def round_half_even(x: float) -> int:
    """round(x) for a float: the same int (ties to even; NaN and infinities raise as round does, from int()).
    Compiled, `round` is looked up in builtins and called through the interpreter, ~900 instructions a call and
    two calls per running request at every admission decision (running_parts); this is native arithmetic.
    Exact: int(x) truncates toward zero, and x - n is exact (0 <= |x - n| < 1 with x and n of one sign and
    n <= |x| < n + 1: Sterbenz's lemma for |n| >= 1, x itself for n == 0; a float of 2**52 or more is whole)."""
    n = int(x)
    rest = x - n
    if rest > 0.5 or (rest == 0.5 and n & 1):
        return n + 1
    if rest < -0.5 or (rest == -0.5 and n & 1):
        return n - 1
    return n


@dataclass(slots=True)
class Tracked:
    request_id: int
    prompt_tokens: int
    prefill_deadline_s: float
    prefill_left: float  # prompt tokens still to prefill
    decode_left: float  # output tokens after the first still owed
    decode_total: int  # output tokens after the first, all told
    tpot_s: float
    kv_tokens: int
    best_effort: bool = False
    # When its first token came (its decode pace starts there: token k after it is due k TPOTs later).
    decode_start_s: float | None = None

    def __init__(
        self,
        request_id: int,
        prompt_tokens: int,
        prefill_deadline_s: float,
        prefill_left: float,
        decode_left: float,
        decode_total: int,
        tpot_s: float,
        kv_tokens: int,
        best_effort: bool = False,
        decode_start_s: float | None = None,
    ) -> None:
        # The dataclass's own __init__, written out (admission.NATIVE_INIT: a native constructor when compiled).
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.prefill_deadline_s = prefill_deadline_s
        self.prefill_left = prefill_left
        self.decode_left = decode_left
        self.decode_total = decode_total
        self.tpot_s = tpot_s
        self.kv_tokens = kv_tokens
        self.best_effort = best_effort
        self.decode_start_s = decode_start_s

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    def as_plan(self) -> PlanRequest:
        # max(0, round(x)) as a comparison (the same int: max keeps round's unless 0 is larger), and the pace's
        # start and the context as before; one per running request at every admission decision.
        prefill = round_half_even(self.prefill_left)
        if prefill < 0:
            prefill = 0
        decode_left = self.decode_left
        decode = round_half_even(decode_left)
        if decode < 0:
            decode = 0
        done = self.decode_total - decode_left
        # PlanRequest's pace counts from the next token: shift the start past the tokens already produced.
        start = self.decode_start_s
        if start is None:
            start = self.prefill_deadline_s
        start += done * self.tpot_s
        generated = 0.0 if prefill else 1.0 + done
        # Positional (PlanRequest's field order: ..., kv_tokens, context_tokens, decode_start_s).
        return PlanRequest(
            self.request_id,
            self.prefill_deadline_s,
            prefill,
            decode,
            self.tpot_s,
            self.kv_tokens,
            int(self.prompt_tokens - prefill + generated),
            start,
        )


def running_parts(held: Sequence[Tracked]) -> RunningParts:
    """What `AdmissionPlanner.admit` reads of `[t.as_plan() for t in held]`, read from the records themselves: the
    same values (as_plan's arithmetic, written out for the decoding ones; a prefilling one is still made a
    PlanRequest, the DP visits it) without a PlanRequest per decoding request at every decision.
    tests/test_slos_serve_admission_parts.py holds it to `admit` on the PlanRequests."""
    tpots: list[float] = []
    forced: list[PlanRequest] = []
    decoders: list[tuple[float, float, int]] = []
    context = 0
    kv = 0
    for t in held:
        tpot = t.tpot_s
        tpots.append(tpot)
        kv += t.kv_tokens
        if round_half_even(t.prefill_left) > 0:  # as_plan's prefill above 0: the DP visits it (a forced admission)
            plan = t.as_plan()
            forced.append(plan)
            context += plan.context_tokens
            continue
        # as_plan with prefill 0: the decode count, the pace's start past the tokens produced, the context
        decode_left = t.decode_left
        done = t.decode_total - decode_left
        context += int(t.prompt_tokens + (1.0 + done))
        decode = round_half_even(decode_left)
        if decode > 0:
            start = t.decode_start_s
            if start is None:
                start = t.prefill_deadline_s
            decoders.append((start + done * tpot, tpot, decode))
    return RunningParts(tpots, context, kv, len(tpots), forced, decoders)


class VirtualReplica:
    """The controller's model of one replica: what it admitted there and how far the plan has got."""

    def __init__(self, index: int, planner: AdmissionPlanner) -> None:
        self.index = index
        self.planner = planner
        self.requests: dict[int, Tracked] = {}
        self.clock = 0.0

    def __len__(self) -> int:
        return len(self.requests)

    def add(self, tracked: Tracked, now: float) -> None:
        self.advance(now)
        self.requests[tracked.request_id] = tracked

    def remove(self, request_id: int) -> None:
        self.requests.pop(request_id, None)

    def advance(self, now: float) -> None:
        """Move the virtual execution forward to `now` (fluid: one rate for the whole interval)."""
        dt = now - self.clock
        if dt <= 0.0:
            return
        self.clock = now
        if not self.requests:
            return
        # One pass over the records (the two lists in the dict's order, as two comprehensions gave them), and the
        # sort only with two prefilling or more: most decisions find none or one (a sort calls its key even so).
        decoding: list[Tracked] = []
        prefilling: list[Tracked] = []
        for t in self.requests.values():
            if t.prefill_left > 0:
                prefilling.append(t)
            elif t.decode_left > 0:
                decoding.append(t)
        if len(prefilling) > 1:
            prefilling.sort(key=lambda t: (t.best_effort, t.prefill_deadline_s))
        for t in decoding:
            # max(0.0, x) as a comparison: max keeps 0.0 unless x is larger (NaN and -0.0 give 0.0 both ways)
            left = t.decode_left - dt / t.tpot_s
            t.decode_left = left if left > 0.0 else 0.0
        if not prefilling:
            return
        budget = self._budget(decoding)
        counts = [0.0] * len(budget.tiers)
        mask = 0
        tiers = budget.tiers
        one_tier = len(tiers) == 1  # every TPOT is that tier (tiers holds every tracked request's)
        for t in decoding:
            tier = 0 if one_tier else tiers.index(t.tpot_s)
            # (read, then stored: compiled, `+=` on a list item adds through the generic number protocol)
            count: float = counts[tier]
            counts[tier] = count + 1.0
            mask |= 1 << tier
        tokens = max(0.0, budget.prefill_rate(counts, mask)) * dt
        spent = 0.0
        rate = tokens / dt
        for t in prefilling:
            if tokens <= 0.0:
                break
            used = min(t.prefill_left, tokens)
            t.prefill_left -= used
            tokens -= used
            spent += used
            if t.prefill_left <= 0.0:
                # Its first token comes when its prefill ends; its decode pace starts then.
                t.decode_start_s = now - dt + spent / rate

    def _budget(self, decoding: Sequence[Tracked]) -> BudgetModel:
        settings = self.planner.settings
        tiers = tier_list([t.tpot_s for t in self.requests.values()])
        return BudgetModel(
            self.planner.model,
            tiers,
            max_batch_tokens=settings.max_batch_tokens,
            context_tokens=sum(t.kv_tokens - t.decode_left for t in decoding),
            sequences=len(self.requests),
            knee_efficiency=settings.knee_efficiency,
            memo=self.planner.batch_memo(tiers),
        )

    def held(self, now: float, *, best_effort: bool = True) -> list[Tracked]:
        """The requests the replica holds and still owes work to, advanced to `now`; `best_effort=False`
        leaves out the best-effort tier (it reserves nothing: see `try_admit`)."""
        self.advance(now)
        return [
            t
            for t in self.requests.values()
            if (t.prefill_left > 0 or t.decode_left > 0) and (best_effort or not t.best_effort)
        ]

    def running(self, now: float, *, best_effort: bool = True) -> list[PlanRequest]:
        """What the replica holds and still owes work to, as the DP sees it (`held`'s requests as plans)."""
        as_plan = Tracked.as_plan
        return [as_plan(t) for t in self.held(now, best_effort=best_effort)]

    def room(self, now: float, *, best_effort: bool = False) -> list[Tracked] | None:
        """`held(now, best_effort)`, or None where those requests hold every sequence slot: then `try_admit` at
        `now` admits nobody whatever it is offered (the DP's slot condition, AdmissionPlanner.slots_free), so the
        policy need not ask it. Advances the replica as `try_admit` does (advancing twice to the same `now` is
        advancing once), and the list is what `try_admit` plans on top of (pass it as `held`)."""
        held = self.held(now, best_effort=best_effort)
        return None if self.planner.slots_free(len(held), 1) <= 0 else held

    def try_admit(
        self, now: float, new: Sequence[PlanRequest], *, best_effort: bool = False, held: list[Tracked] | None = None
    ) -> Admission:
        """The admission DP for `new` on top of what this replica already holds.

        For SLO requests (`best_effort=False`) the best-effort requests the replica serves are not in the
        DP: that tier runs on what the SLO requests leave and yields to them (paper 004 sec. 4.1; the step
        planner gives it only leftover tokens and preempts it for an SLO request's memory or slot). Priced
        as running requests, they reserved a TTFT and a TPOT pace each, so every best-effort request served
        after a burst made the DP decline more of the next burst, which went to the tier, and so on (the
        cause this module's admission was too conservative under bursty arrivals). A best-effort retry
        (`best_effort=True`) is planned on top of everything, so the tier does not crowd itself out. `held`:
        `room(now, best_effort)`'s list, where the caller has it."""
        if held is None:
            return self.planner.admit(now, self.running(now, best_effort=best_effort), new)
        return self.planner.admit_parts(now, running_parts(held), new)
