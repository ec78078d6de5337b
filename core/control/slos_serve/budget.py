"""How many tokens per second a replica can give to prefill while it keeps its decodes on their TPOT SLOs.

This is the supply side of SLOs-Serve's planner (paper 004):
- the step time of a batch comes from the calibrated roofline model (sec. 3.1.1; core/step_time.py,
  fitted by `--job calibrate`), inverted into "how many tokens fit in a batch of this duration" (Time2BS);
- without speculation the tightest TPOT among the decoding tiers sets the batch duration (Algorithm 2,
  sec. 3.2.2): every batch must hand each of those requests a token in time, and the batch takes as many
  tokens as fit in that duration (the dynamic batch size);
- with speculation (sec. 3.2.3, Appendix D) each tier l verifies `sl_l` drafted tokens per batch and gains
  Acc(sl_l) tokens, so the batch may last min_l TPOT_l * Acc(sl_l); the per-tier lengths are chosen to
  maximise the prefill throughput (batch tokens left after the decodes, per second).

Everything is a rate ("fluid") so that the admission DP can integrate it over the intervals between prefill
deadlines; the per-step batch formation (batching.py) turns the same plan into concrete batches.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.pickling import reduce_by_fields
from core.step_time import StepTimeModel, expected_accepted_tokens


@dataclass(slots=True)
class DecodePlan:
    """How batches serve one set of populated decode tiers (only read once made: BudgetModel keeps them)."""

    batch_time_s: float  # duration of one batch
    batch_tokens: float  # tokens it holds (decode verification positions + prefill)
    spec_len: tuple[int, ...]  # drafted tokens verified per request and batch, per tier (0 = autoregressive)
    # Batch tokens spent per output token of a request in each tier: (sl + 1) / Acc(sl).
    cost_per_token: tuple[float, ...]

    def __init__(
        self,
        batch_time_s: float,
        batch_tokens: float,
        spec_len: tuple[int, ...],
        cost_per_token: tuple[float, ...],
    ) -> None:
        # The dataclass's own __init__, written out (admission.NATIVE_INIT): ~7.6k plans a 5k-request run, each
        # ~6k instructions through the generated one. Not frozen: frozen's __init__ sets each field through
        # object.__setattr__ (nothing writes a plan after it is made; nothing hashes one).
        self.batch_time_s = batch_time_s
        self.batch_tokens = batch_tokens
        self.spec_len = spec_len
        self.cost_per_token = cost_per_token

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    @property
    def supply_tps(self) -> float:
        """Batch tokens per second."""
        return self.batch_tokens / self.batch_time_s


class BudgetModel:
    """Prefill throughput left over by decode tiers, for one planning invocation.

    tiers: the distinct TPOT SLOs (seconds) the planner tracks, tightest first; a tier's index is its
    position. context_tokens / sequences: the KV the batches read and the requests they hold (they enter
    the step time through the model's KV-read and per-sequence terms). max_batch_tokens caps a batch
    (the engine's max_num_batched_tokens); max_spec_len > 0 enables SLO-adaptive speculation with drafts
    accepted at `acceptance` per token. reference_counts: the decode population per tier the speculation
    lengths are chosen for (Appendix D), once per invocation; every plan then uses those lengths, so the
    admission DP does not re-solve the speculation problem for each of its states. knee_efficiency: None
    sizes each batch as Algorithm 2 does (as large as the tightest pace allows); a share such as 0.95 takes
    the smallest batch with that share of the largest one's token throughput instead (see `_knee`).
    """

    def __init__(
        self,
        model: StepTimeModel,
        tiers: Sequence[float],
        *,
        max_batch_tokens: int,
        context_tokens: float = 0.0,
        sequences: int = 0,
        max_spec_len: int = 0,
        acceptance: float = 0.0,
        reference_counts: Sequence[float] | None = None,
        knee_efficiency: float | None = None,
        memo: dict[tuple[int, int], tuple[Any, ...]] | None = None,
    ) -> None:
        self.model = model
        self.knee_efficiency = knee_efficiency
        self.tiers = tuple(tiers)
        self.max_batch_tokens = max_batch_tokens
        self.context_tokens = context_tokens
        self.sequences = sequences
        self.max_spec_len = max_spec_len if acceptance > 0.0 else 0
        self.acceptance = acceptance
        self._plans: dict[int, DecodePlan] = {}
        self._idle: tuple[float, float] | None = None  # the largest batch allowed (no decodes), when first asked
        self._limits: dict[int, float] = {}  # populated mask -> the tightest TPOT among its tiers (no speculation)
        self._no_negative_costs: bool | None = None  # every term's per-token cost >= 0 (holds_decodes), when asked
        # every coefficient but the base >= 0 (holds_decodes_between), when asked: the model's terms are fixed
        self._monotone: bool | None = None
        self._reference = list(reference_counts) if reference_counts is not None else [1.0] * len(self.tiers)
        # The last batch worked out per (sequences, populated mask), with the bounds under which it holds at another KV
        # (_remember); `memo` may be shared by models of the same step-time model, tiers, batch cap and knee (the
        # admission DP's and the virtual replica's, one per decision).
        self._batch_memo: dict[tuple[int, int], tuple[Any, ...]] = {} if memo is None else memo
        # The model's terms split for it (_split_terms), worked out when batch_at first keeps an answer
        self._split: tuple[list[tuple[float, ...]], list[tuple[float, ...]]] | None = None
        self._split_known = False
        self._search: tuple[dict[int, float], float, float] | None = None  # the last knee walk's (times, goal, longest)
        self.spec_len = self._choose_speculation(self._reference)

    def at_context(self, context_tokens: float) -> BudgetModel:
        """This model, now for `context_tokens` of KV in use: what a new one built with it would answer (every
        plan, and the speculation lengths chosen, depend on it). The simulated replica asks one per step of a
        stretch (stepping.py), where building a model each step cost more than its answer."""
        self.context_tokens = context_tokens
        self._plans = {}
        self._idle = None
        if self.max_spec_len:  # without speculation the lengths are all zero whatever the context
            self.spec_len = self._choose_speculation(self._reference)
        return self

    def batch_at(self, context_tokens: float, populated: int) -> tuple[float, float]:
        """(batch_tokens, batch_time_s) of `at_context(context_tokens).plan(populated)` without speculation, from
        `_batch` itself, without the DecodePlan, its per-tier costs and the plan cache around it (the simulated
        replica asks this at every step of a stretch with a prefill chunk, stepping.plain_prefill_check, where
        the plan is used once). Leaves the model at `context_tokens`."""
        assert not self.max_spec_len, "batch_at: no speculation (the lengths would depend on the context)"
        self.at_context(context_tokens)
        if populated:
            kept = self._kept_batch(populated)
            if kept is not None:
                return kept
            limit = self._limit(populated)
            self._search = None
            tokens, duration = self._batch(limit, 0)  # _evaluate's limit and spec steps
            if tokens > 0.0:
                self._remember(populated, limit, tokens, duration)
                return tokens, duration
        self._idle = self._batch(None, 0)  # plan's idle fallback (as `_evaluate([], ...)` caches it)
        return self._idle

    def _kept_batch(self, populated: int) -> tuple[float, float] | None:
        """`_batch(_limit(populated), 0)` at this model's KV where a batch kept for these sequences and tiers holds
        here (see _remember: the KV moves only terms that take no token cost, and they stay within every bound)."""
        memo = self._batch_memo.get((self.sequences, populated))
        if memo is None:
            return None
        tokens, duration = memo[0], memo[1]
        # Typed as _remember keeps them (floats, and the KV terms' columns): the test's arithmetic runs natively, not
        # through the generic number protocol (the same IEEE operations on the same doubles).
        limit: float = memo[2]
        lowest: float = memo[3]
        longest: float = memo[4]
        goal: float = memo[5]
        need: float = memo[6]
        kv_terms: list[tuple[float, ...]] = memo[7]
        ctx, seqs = self.context_tokens, self.sequences
        for base, _, per_ctx, per_spec, per_seq in kv_terms:
            fixed = base + per_ctx * ctx + per_spec * 0 + per_seq * seqs
            if fixed > limit or fixed > lowest or not fixed * 1e6 >= longest or goal * fixed / 1.0 > need:
                return None
        return tokens, duration

    def _remember(self, populated: int, limit: float, tokens: float, duration: float) -> None:
        """Keep batch_at's answer at this KV where it is the same at every KV that passes batch_at's test.

        Where each roofline term either has no KV cost or no token cost (a memory term: weights and KV read; a
        compute term: the tokens), the KV moves only the memory terms' value, the same at every batch size:
        `fixed` below, as tokens_within, _knee_estimate and step_time each add it up (step_time's 0.0 x tokens
        adds nothing). The knee walk (its guess solved per term, then `enough` at a few sizes) then follows the
        same path with the same floats at another KV as long as every memory term there (1) stays within the
        TPOT limit (tokens_within returns 0.0 past it, and only the compute terms size the batch), (2) stays at
        or below the compute terms' step time at every size the walk priced (so each step_time is the compute
        terms' value, as here), and, in _knee_estimate, (3) keeps its fixed cost at least a millionth of the
        longest step and (4) needs no more tokens than the compute terms (goal x fixed / room; the guess is the
        ceiling of their max, 1.0 included). Kept only where the walk ran here and all four hold here too."""
        search = self._search
        if not self._split_known:
            self._split, self._split_known = _split_terms(self.model), True
        split = self._split
        if search is None or split is None or int(tokens) not in search[0]:
            return  # no walk (no knee, a one-token batch, or the bisection) or a term with both costs
        times, goal, longest = search
        kv_terms, other_terms = split
        seqs, ctx = self.sequences, self.context_tokens
        lowest = math.inf  # the compute terms' step time at the smallest of the sizes the walk priced
        for size in times:
            value = 0.0  # step_time's loop over the compute terms alone
            for base, k_tok, k_ctx, k_spec, k_seq in other_terms:
                value_term = base + k_tok * size + k_ctx * ctx + k_spec * 0 + k_seq * seqs
                if value_term > value:
                    value = value_term
            if value < lowest:
                lowest = value
        need = 1.0  # _knee_estimate's max over the compute terms
        for base, per_token, per_ctx, per_spec, per_seq in other_terms:
            fixed = base + per_ctx * ctx + per_spec * 0 + per_seq * seqs
            room = 1.0 - goal * per_token
            if not fixed * 1e6 >= longest or not room > 0.0:
                return
            need = max(need, goal * fixed / room)
        for base, _, per_ctx, per_spec, per_seq in kv_terms:  # _kept_batch's test, here
            fixed = base + per_ctx * ctx + per_spec * 0 + per_seq * seqs
            if fixed > limit or fixed > lowest or not fixed * 1e6 >= longest or goal * fixed / 1.0 > need:
                return
        self._batch_memo[seqs, populated] = (tokens, duration, limit, lowest, longest, goal, need, kv_terms)

    def _limit(self, populated: int) -> float:
        """The tightest TPOT among the tiers in `populated`: `_evaluate`'s batch time limit when no tier
        speculates (each tier's TPOT times a gain of 1.0, which is the TPOT to the bit)."""
        limit = self._limits.get(populated)
        if limit is None:
            limit = self._limits[populated] = min(self.tiers[t] for t in range(len(self.tiers)) if populated >> t & 1)
        return limit

    def _batch(self, time_limit_s: float | None, spec_steps: int) -> tuple[float, float]:
        """(tokens, duration) of the largest batch within `time_limit_s` (None: the largest batch allowed)."""
        model = self.model
        tokens = float(self.max_batch_tokens)
        if time_limit_s is not None:
            tokens = min(tokens, model.tokens_within(time_limit_s, self.context_tokens, spec_steps, self.sequences))
        tokens = float(int(tokens + 1e-6))  # whole tokens; the slack absorbs float error
        duration: float | None = None
        if self.knee_efficiency is not None and tokens > 1.0:
            tokens, duration = self._knee_timed(tokens, spec_steps)
        if duration is None:
            duration = model.step_time(tokens, self.context_tokens, spec_steps, self.sequences)
        return tokens, max(duration, 1e-9)

    def _knee(self, most: float, spec_steps: int) -> float:
        """The smallest batch whose token throughput is within `knee_efficiency` of the largest allowed one.
        Beyond the roofline's knee a bigger batch only lengthens the step (every request's TPOT, and so how
        long it holds its KV cache) for little more throughput."""
        return self._knee_timed(most, spec_steps)[0]

    def _knee_timed(self, most: float, spec_steps: int) -> tuple[float, float | None]:
        """`_knee`'s batch and its step time where the search already worked it out (None where not): the same
        call with the same arguments (a whole number of tokens as an int or a float is the same operand), so
        `_batch` need not price the batch again."""
        ctx, seqs = self.context_tokens, self.sequences
        step_time = self.model.step_time
        longest = step_time(most, ctx, spec_steps, seqs)
        goal = self.knee_efficiency * most / longest  # type: ignore[operator]
        high = int(most)
        guess = _knee_estimate(self.model, goal, longest, ctx, spec_steps, seqs)
        if guess is None:
            return float(bisect_knee(self.model, goal, high, ctx, spec_steps, seqs)), None
        times = {high: longest}

        def enough(tokens: int) -> bool:
            took = times[tokens] = step_time(tokens, ctx, spec_steps, seqs)
            return tokens / took >= goal

        # With every roofline term's fixed cost at least a millionth of the longest step, tokens / step_time
        # rises from one batch size to the next by far more than float rounding can move it, so `enough`
        # flips once and the bisection's answer is the smallest batch where it holds. Solved per term, then
        # confirmed on `enough` itself and moved a token at a time: the same answer from a few step times
        # instead of a dozen (this runs at every engine step).
        self._search = (times, goal, longest)  # for batch_at's memo (_remember)
        tokens = min(max(guess, 1), high)
        if enough(tokens):
            while tokens > 1 and enough(tokens - 1):
                tokens -= 1
        else:
            while tokens < high:
                tokens += 1
                if enough(tokens):
                    break
        return float(tokens), times.get(tokens)

    def _gain(self, spec_len: int) -> float:
        return expected_accepted_tokens(self.acceptance, spec_len) if spec_len else 1.0

    def _evaluate(self, members: Sequence[int], lengths: Sequence[int]) -> DecodePlan:
        """The batch plan for populated tiers `members` verifying `lengths[t]` drafts per request of tier t."""
        if not members:
            if self._idle is None:
                self._idle = self._batch(None, 0)
            tokens, duration = self._idle
            return DecodePlan(duration, tokens, (0,) * len(self.tiers), (1.0,) * len(self.tiers))
        # The batch may last until the tightest tier's request would fall behind its pace (sec. 3.2.3;
        # without speculation: the tightest TPOT, Algorithm 2 line 1).
        limit = min(self.tiers[t] * self._gain(lengths[t]) for t in members)
        spec_steps = max(lengths[t] for t in members)
        tokens, duration = self._batch(limit, spec_steps)
        costs = tuple((lengths[t] + 1) / self._gain(lengths[t]) for t in range(len(self.tiers)))
        return DecodePlan(duration, tokens, tuple(lengths), costs)

    def _choose_speculation(self, reference: Sequence[float]) -> tuple[int, ...]:
        """Appendix D: enumerate per-tier speculation lengths, keep those with the most prefill throughput
        for the reference population."""
        zeros = (0,) * len(self.tiers)
        if self.max_spec_len == 0:
            return zeros
        members = [t for t, n in enumerate(reference) if n > 0]
        if not members:
            return zeros
        best, best_rate = zeros, -float("inf")
        for combo in itertools.product(range(self.max_spec_len + 1), repeat=len(members)):
            lengths = list(zeros)
            for t, sl in zip(members, combo, strict=True):
                lengths[t] = sl
            plan = self._evaluate(members, lengths)
            if plan.batch_tokens <= 0.0:
                continue
            rate = self._rate(plan, reference)
            if rate > best_rate:
                best, best_rate = tuple(lengths), rate
        return best

    def plan(self, populated: int) -> DecodePlan:
        """The batch plan while the tiers in bitmask `populated` have decoding requests (cached)."""
        cached = self._plans.get(populated)
        if cached is None:
            if not self.max_spec_len and populated:  # _evaluate's batch is `_batch(_limit(populated), 0)`: kept?
                kept = self._kept_batch(populated)
                if kept is not None:
                    n = len(self.tiers)
                    # _evaluate's plan without speculation: lengths 0, costs (0 + 1) / 1.0 each
                    cached = self._plans[populated] = DecodePlan(kept[1], kept[0], (0,) * n, (1.0,) * n)
                    return cached
                self._search = None
            members = [t for t in range(len(self.tiers)) if populated >> t & 1]
            cached = self._evaluate(members, self.spec_len)
            if not self.max_spec_len and members and cached.batch_tokens > 0.0:
                self._remember(populated, self._limit(populated), cached.batch_tokens, cached.batch_time_s)
            if cached.batch_tokens <= 0.0:  # not one token fits at the tightest pace: the idle plan's pace
                cached = self._evaluate([], self.spec_len)
            self._plans[populated] = cached
        return cached

    def holds_decodes(self, populated: int, decodes: int) -> bool:
        """Whether `plan(populated)` has room for `decodes` batch tokens, without speculation: a sufficient test
        (False where unsure: then ask `plan`) that sizes the batch as `_batch` does but skips the knee's
        search. The knee is the largest batch (checked to hold `decodes`) or a size where `_knee`'s `enough`
        holds (its walk and `bisect_knee` both end on one), and no size below `decodes` is one when even
        `decodes - 1` tokens over the quickest step (one token's) fall short of the goal. Float rounding is
        monotone, so the bounds hold for the computed values too (with no negative per-token cost). The
        simulated replica asks it at every step of a stretch of plain decode steps
        (stepping.plain_decode_check)."""
        if self.max_spec_len or not populated:
            return False
        model = self.model
        ctx, seqs = self.context_tokens, self.sequences
        limit = self._limit(populated)  # _evaluate's, gain 1
        tokens = min(float(self.max_batch_tokens), model.tokens_within(limit, ctx, 0, seqs))
        tokens = float(int(tokens + 1e-6))
        if tokens <= 0.0:
            return False  # not one token fits: `plan` falls back to the idle plan
        if self.knee_efficiency is None or tokens <= 1.0:
            return decodes <= tokens
        if decodes > tokens:
            return False
        if decodes <= 1:
            return True
        longest = model.step_time(tokens, ctx, 0, seqs)
        goal = self.knee_efficiency * tokens / longest  # _knee's
        quickest = model.step_time(1, ctx, 0, seqs)
        if self._no_negative_costs is None:
            self._no_negative_costs = all(term[1] >= 0.0 for term in model.terms)
        return quickest > 0.0 and (decodes - 1) / quickest < goal and self._no_negative_costs

    def holds_decodes_between(self, populated: int, decodes: int, low: float, high: float) -> bool:
        """Whether `holds_decodes(populated, decodes)` says True at every context in [low, high] (a sufficient
        test, False where unsure), from four step times instead of three at each context. Needs every roofline
        coefficient but the base non-negative: then each term's value, and so step_time, is non-decreasing in
        the tokens and in the context, and tokens_within non-increasing in the context, for the rounded floats
        too (each sum, product and quotient rounds monotonically). Over the range the batch then holds at least
        `fewest` tokens (its size at `high`), and in `holds_decodes`' knee test the goal, knee x tokens /
        step_time(tokens), is at least knee x fewest / step_time(most, high), while (decodes - 1) / step_time(1)
        is at most its value at `low`: the first below the second answers for every context between. The
        simulated replica asks it once per window of a stretch of plain decode steps (stepping.plain_decode_check)."""
        if self.max_spec_len or not populated or low > high:
            return False
        model = self.model
        if self._monotone is None:
            self._monotone = all(k >= 0.0 for term in model.terms for k in term[1:])
        if not self._monotone:
            return False
        seqs, cap = self.sequences, float(self.max_batch_tokens)
        limit = self._limit(populated)
        fewest = float(int(min(cap, model.tokens_within(limit, high, 0, seqs)) + 1e-6))  # holds_decodes' size
        if fewest <= 0.0 or decodes > fewest:
            return False
        if self.knee_efficiency is None or decodes <= 1:
            return True  # decodes <= tokens at every context (or the one-decode answer of the knee branch)
        if fewest <= 1.0:
            return False  # some contexts may take holds_decodes' `tokens <= 1` branch: not worth the case
        most = float(int(min(cap, model.tokens_within(limit, low, 0, seqs)) + 1e-6))
        longest = model.step_time(most, high, 0, seqs)
        quickest = model.step_time(1, low, 0, seqs)
        if not (longest > 0.0 and quickest > 0.0):
            return False
        return (decodes - 1) / quickest < self.knee_efficiency * fewest / longest

    def _rate(self, plan: DecodePlan, counts: Sequence[float]) -> float:
        rate = plan.supply_tps
        for tier, n in enumerate(counts):
            if n:
                rate -= n * plan.cost_per_token[tier] / self.tiers[tier]
        return rate

    def prefill_rate(self, counts: Sequence[float], populated: int) -> float:
        """Prefill tokens per second left while `counts[l]` requests decode in tier l at their TPOT
        (negative: the decodes alone do not fit)."""
        return self._rate(self.plan(populated), counts)


def _split_terms(model: StepTimeModel) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]]] | None:
    """The model's terms as (those with a KV cost, the others), each in the model's order; None where a term has
    both a KV and a token cost (batch_at's memo then keeps nothing)."""
    kv_terms: list[tuple[float, ...]] = []
    others: list[tuple[float, ...]] = []
    for term in model.terms:
        if term[2] == 0.0:
            others.append(term)
        elif term[1] == 0.0:
            kv_terms.append(term)
        else:
            return None
    return kv_terms, others


def bisect_knee(
    model: StepTimeModel, goal: float, most: int, context_tokens: float, spec_steps: int, sequences: int
) -> int:
    """The knee by definition: a bisection over 1..most for the smallest batch with tokens / step_time >= goal."""
    low, high = 1, most
    while low < high:
        middle = (low + high) // 2
        if middle / model.step_time(middle, context_tokens, spec_steps, sequences) >= goal:
            high = middle
        else:
            low = middle + 1
    return low


def _knee_estimate(
    model: StepTimeModel, goal: float, longest_s: float, context_tokens: float, spec_steps: int, sequences: int
) -> int | None:
    """Where tokens / step_time(tokens) reaches `goal` on the real numbers: for each term, tokens >= goal x
    fixed / (1 - goal x per_token). None where a term's fixed cost is (next to) nothing against the longest
    step: its tokens / step_time is flat, only float rounding moves it, and the bisection's answer is
    whatever those roundings make it."""
    need = 1.0
    for base, per_token, per_ctx, per_spec, per_seq in model.terms:
        fixed = base + per_ctx * context_tokens + per_spec * spec_steps + per_seq * sequences
        room = 1.0 - goal * per_token
        if not fixed * 1e6 >= longest_s or not room > 0.0:
            return None
        need = max(need, goal * fixed / room)
    return math.ceil(need) if need < 2.0**62 else None
