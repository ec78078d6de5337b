"""One step of AdaServe's decoding for a batch, on arrays (paper 002, sec. 4.3 Algorithm 2 and sec. 5.2).

`TreeScheduler.step` takes the decoding requests' SLO state and returns, per request, the positions it
verifies (its root plus its selected draft tokens) and how many tokens it emits, drawn from the token-level
model's true acceptance (speculation.py). `StaticScheduler` is the static baseline on the same model:
every request verifies a `width`-token chain (vLLM-Spec(k) in the paper's evaluation).

Both are free of the engine: the stepwise replica's planner (policy.py) feeds them and applies the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from struct import pack_into
from typing import Any, Final, cast

import numpy as np

from core.control.adaserve.speculation import (
    CandidateShape,
    accepted_depths,
    accepted_draft_tokens,
    candidate_shape,
    chain_selection,
    clip_acceptance,
    draft_estimate,
    every_candidate,
    full_selection,
    most_probable,
    path_probabilities,
    row_starts,
    select,
    selected_counts,
)
from core.control.adaserve.trees import adaptive_shape
from core.pickling import reduce_by_fields
from core.profile import AdaServeSpec
from core.step_time import StepTimeModel


@dataclass(frozen=True, slots=True)
class PrefillLoad:
    """The prompt work that shares a step with its decodes: what vLLM's chunked prefill would schedule beside
    them with no speculation (each decoding request one token), within the step's token budget."""

    tokens: int  # prompt tokens
    sequences: int  # the requests they belong to
    token_budget: int  # max_num_batched_tokens: verified tokens and prompt tokens share it
    # Queued requests the step leaves out for want of a sequence slot or KV cache, which decoding requests
    # hold until they finish (not for want of token budget).
    held_back: bool = False

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


NO_PREFILL = PrefillLoad(0, 0, 0)


def roofline_budget(
    model: StepTimeModel,
    context_tokens: float = 0.0,
    sequences: int = 1,
    prefill: PrefillLoad | None = None,
) -> int:
    """The most tokens one step verifies before its time rises above that of a step verifying one token per
    sequence (the roofline knee, paper 004 sec. 3.1.1's model): below it the step is bound by streaming the
    weights and reading the KV cache, so extra verified tokens are nearly free. Grows with the context held.
    With a `prefill` sharing the step, the step without speculation already carries its prompt tokens: only
    what still fits under that step's time is free, none once the prefill has made the step compute-bound."""
    prompt = prefill.tokens if prefill is not None else 0
    batch = sequences + (prefill.sequences if prefill is not None else 0)
    floor = model.step_time(sequences + prompt, context_tokens, 0, batch)
    knee = math.inf
    for base, per_token, per_ctx, _, per_seq in model.terms:
        if per_token > 0:
            fixed = base + per_ctx * context_tokens + per_seq * batch
            knee = min(knee, (floor - fixed) / per_token - prompt)
    return sequences if knee == math.inf else max(sequences, int(knee + 1e-9))


@dataclass(slots=True)
class DecodeBatch:
    """The decoding requests of one step, as arrays (one entry per request)."""

    budget: int  # B: tokens this step verifies, roots included
    # A(r) - 1: draft tokens to accept this step to be on the TPOT SLO after it (sec. 3); None with `behind`
    # False (the SLO phase does not run, so the caller need not build it).
    need: np.ndarray | None
    truth: np.ndarray  # this step's true local acceptance a (speculation.py)
    estimate: np.ndarray  # the draft's estimate â of it
    uniforms: np.ndarray  # one U(0, 1) per request: draws the accepted depth
    # `estimate` then `truth` in one array, already through clip_acceptance, when the caller has it (saves
    # the step a copy and the clip).
    paired: np.ndarray | None = None
    behind: bool = True  # whether some need may be > 0 (False: the caller checked none is; no SLO phase)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    def __len__(self) -> int:
        return len(self.uniforms)


@dataclass(slots=True)
class StepDecision:
    verified: np.ndarray  # (n,) positions verified: 1 (the root) + draft tokens
    emitted: np.ndarray  # (n,) tokens emitted: 1 + accepted draft tokens
    spec_steps: int  # the draft model's sequential passes (0: no speculation this step)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(slots=True)
class AcceptanceRun:
    """A request's per-step randomness, drawn ahead in one go (a step takes entry `next`)."""

    truth: np.ndarray  # true local acceptance a per step, through clip_acceptance (draw_run)
    estimate: np.ndarray  # the draft's estimate of it, through clip_acceptance too (draw_run)
    uniforms: np.ndarray  # draws the accepted depth
    length: int  # steps drawn
    next: int = 0
    # Accepted draft tokens at every step if the whole (d, w) candidate tree is verified, by (d, w).
    full: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    # The three arrays' entries [0, listed) as Python lists (the planner reads one entry of each per step).
    # Filled as steps reach them (list_through): a run holds an entry for every token its request
    # has left, but a speculating step takes one entry and emits ~3.4 tokens, and plain decode steps take none,
    # so most entries are never read (bench-chat 3k: 29% are), and turning them all into floats up front, then
    # freeing them, cost 3.5% of the run's instructions.
    truth_list: list[float] = field(default_factory=list)
    estimate_list: list[float] = field(default_factory=list)
    uniform_list: list[float] = field(default_factory=list)
    listed: int = 0

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    def list_through(self, end: int) -> None:
        """Entries up to `end` (exclusive) in the lists: at least LIST_CHUNK more, or as many as are listed
        already (a run read far is likely read further), within the run. The same floats as listing the whole
        arrays (tolist is elementwise)."""
        start = self.listed
        if end <= start:
            return
        stop = min(max(end, start + max(start, LIST_CHUNK)), self.length)
        self.truth_list += self.truth[start:stop].tolist()
        self.estimate_list += self.estimate[start:stop].tolist()
        self.uniform_list += self.uniforms[start:stop].tolist()
        self.listed = stop

    def full_tree_accepted(self, depth: int, width: int, start: int = 0) -> list[int]:
        """The draws of `accepted_draft_tokens` for the full candidate tree, for `FULL_TREE_STEPS` steps from
        `start` at once (entries not asked are 0: steps already taken are not asked again): they use the same
        per-step truth and uniform as the general path, so the outcome is the same. A request verifies its full
        tree on a few steps only (when the batch is small), so its run is not computed to the end."""
        known = self.full.get((depth, width), [])
        if len(known) <= start:
            end = min(start + FULL_TREE_STEPS, self.length)
            shape = candidate_shape(depth, width)
            selected = every_candidate(end - start, shape.size)
            probs = path_probabilities(shape, self.truth[start:end], clipped=True)
            drawn = accepted_depths(shape, selected, probs, self.uniforms[start:end]).tolist()
            known = self.full[(depth, width)] = known + [0] * (start - len(known)) + drawn
        return known


def float_array(values: list[float]) -> np.ndarray:
    """The floats as a fresh float64 array, to the byte what np.fromiter(values, float, len(values)) gives (each
    float's double, in order), written by struct (as stepwise's token times are): fromiter packs each element
    through numpy's generic per-item path, ~230 instructions a float against ~100 (a stretch's 3nK floats)."""
    count = len(values)
    array = np.empty(count)
    pack_into(f"{count}d", cast(Any, array), 0, *values)  # (typeshed: an ndarray is no Buffer)
    return array


FULL_TREE_STEPS = 16  # steps of a run AcceptanceRun.full_tree_accepted draws at once
LIST_CHUNK: Final = 32  # the fewest entries AcceptanceRun.list_through lists at once (a run's steps read ~60)


def draw_run(rng: np.random.Generator, mean: float, steps: int, spec: AdaServeSpec) -> AcceptanceRun:
    """`steps` steps of a request whose mean acceptance is `mean`: the true local acceptance a ~ Beta around
    it (per-step randomness), the draft's estimate of a (mismatch), and the uniforms of verification."""
    m = min(max(mean, 1e-6), 1.0 - 1e-6)
    # Kept clipped (every use of the truth clips it first; clip_acceptance is idempotent).
    truth = clip_acceptance(rng.beta(m * spec.step_concentration, (1.0 - m) * spec.step_concentration, steps))
    # The estimates clipped as path_probabilities would clip them (idempotent, so the outcome is the same; the
    # truth is): once here for the whole run rather than in each list_through chunk (the clip's two calls cost
    # less once on ~215 entries than twice a run on ~40; compiled bench-chat 3k: 0.4% fewer instructions).
    estimate = clip_acceptance(draft_estimate(truth, spec.mismatch, spec.overconfidence, rng, clipped=True))
    return AcceptanceRun(truth, estimate, rng.random(steps), steps)


class TreeScheduler:
    """Speculate (beam search), select (SLO-customized, then throughput-optimized), verify, per step."""

    def __init__(self, spec: AdaServeSpec, model: StepTimeModel, rng: np.random.Generator) -> None:
        self.spec = spec
        # Read every step; the spec is frozen, so kept as native fields (a pydantic attribute is a generic lookup).
        self._must_pay = spec.must_pay
        self._fixed_budget = spec.budget
        self.model = model
        self.rng = rng
        self._shapes: dict[tuple[int, int], tuple[int, int]] = {}
        self._budget_active = -1
        self._budget_context = 0.0
        self._budget = 0
        self._free_key: tuple[int, float, PrefillLoad] | None = None  # roofline_budget with a prefill, last asked
        self._free = 0
        self.steps = 0
        self.verified_tokens = 0  # roots included, over the run
        self.slo_tokens = 0  # draft tokens chosen in the SLO-customized phase
        self.selection_steps = 0  # steps that ran Algorithm 2's selection (the budget did not hold every tree)
        self.slo_served = 0  # requests given tokens by the SLO-customized phase, summed over steps
        self.slo_served_beyond_tree = 0  # of which needing more accepted drafts than the tree's depth
        self.draft_tokens = 0
        self.emitted_tokens = 0  # accepted drafts + the verifier's own token

    @property
    def must_pay(self) -> bool:
        """Whether speculation must pay for itself (AdaServeSpec.must_pay): the planner then hands `budget` the
        prefill sharing each step and drafts only when a request's TPOT SLO is at stake."""
        return self._must_pay

    def budget(self, active: int, context_tokens: float, prefill: PrefillLoad = NO_PREFILL) -> int:
        """B for this step: the profile's, or the roofline knee at the KV context the batch holds.

        With a prefill in the step (issue 21: speculation that cannot pay must not cost), B is also held to
        what the step verifies for free beside it: eq. 1's B is a hardware budget (sec. 3, footnote 1), and a
        step whose prompt chunk has made it compute-bound has no free verification left; nor may verified
        tokens take max_num_batched_tokens from the prompt (vLLM would have prefilled it), which would
        lengthen its TTFT by a step for every chunk they displace."""
        fixed = self._fixed_budget
        if fixed is not None:
            budget = max(fixed, active)
        else:
            if active != self._budget_active or context_tokens != self._budget_context:
                # Asked twice a step (full_tree, then planned) with the same batch: computed once.
                self._budget_active, self._budget_context = active, context_tokens
                self._budget = roofline_budget(self.model, context_tokens, active)
            budget = self._budget
        if prefill.tokens:
            key = (active, context_tokens, prefill)
            if key != self._free_key:  # asked twice a step too (full_tree, then planned)
                self._free_key, self._free = key, roofline_budget(self.model, context_tokens, active, prefill)
            budget = min(budget, self._free, max(active, prefill.token_budget - prefill.tokens))
        return budget

    def shape(self, active: int, budget: int) -> tuple[int, int]:
        """(d, w) for `active` decoding requests (eqs. 8-9, B1 = this step's budget), memoised."""
        key = (active, budget)
        known = self._shapes.get(key)
        if known is None:
            spec = self.spec
            known = self._shapes[key] = adaptive_shape(
                active,
                verify_budget=budget,
                draft_budget=spec.draft_budget,
                depth_bounds=spec.depth_bounds,
                max_width=spec.max_width,
                c1=spec.c1,
                c2=spec.c2,
            )
        return known

    def layout(
        self, active: int, context_tokens: float, prefill: PrefillLoad = NO_PREFILL
    ) -> tuple[int, int, tuple[int, int] | None]:
        """The coming step's (tokens verified, draft passes, full tree): B and d, which the planner prices for
        A(r)'s t_spec, and (d, w) when B holds every candidate of every request (then the selection is all of
        them, whatever the SLOs and estimates), else None. One call a step (B and the shape asked once)."""
        budget = self.budget(active, context_tokens, prefill)
        depth, width = self.shape(active, budget)
        return budget, depth, (depth, width) if budget - active >= active * depth * width else None

    def step(self, batch: DecodeBatch) -> StepDecision:
        n = len(batch)
        depth, width = self.shape(n, batch.budget)
        shape = candidate_shape(depth, width)
        if batch.budget <= n:
            self.roots_only()
            ones = np.ones(n, dtype=np.int64)
            return StepDecision(verified=ones, emitted=ones, spec_steps=depth)
        if batch.budget - n >= n * shape.size:
            # Every candidate fits the budget: the selection is everything, whatever the draft estimated.
            selection = full_selection(n, shape.size)
            accepted = accepted_draft_tokens(shape, selection, path_probabilities(shape, batch.truth), batch.uniforms)
        else:
            if batch.paired is not None:
                both = path_probabilities(shape, batch.paired, clipped=True)
            else:
                both = path_probabilities(shape, np.concatenate([batch.estimate, batch.truth]))
            self.selection_steps += 1
            if not (batch.behind and self.spec.slo_selection):
                verified, emitted = _throughput_phase(shape, both, batch.uniforms, batch.budget)
                return StepDecision(verified=verified, emitted=emitted, spec_steps=depth)
            assert batch.need is not None  # (behind: the caller built it)
            selection = select(both[:n], batch.need, batch.budget, depth, self.spec.n_max)
            accepted = accepted_draft_tokens(shape, selection, both[n:], batch.uniforms)
        self.slo_served += selection.behind
        self.slo_served_beyond_tree += selection.beyond_tree
        self.slo_tokens += selection.slo_total  # the rest of the account: record(), from the planner's lists
        return StepDecision(verified=selection.counts + 1, emitted=accepted + 1, spec_steps=depth)

    def throughput_step(self, paired: np.ndarray, uniforms: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
        """`step`'s answer (verified, emitted) for a batch with nobody behind (or the `slo_selection: false`
        ablation) whose candidates do not all fit the budget B (`layout` gave no full tree) and B leaves room
        beside the roots (B > n): the planner asks it directly with the batch's `paired` estimates and truths
        (clipped) and `uniforms`, without the DecodeBatch and StepDecision around the same calls.

        With a leading step axis (the same batch's next K steps at one B, stretch.py), `paired` is those
        steps' path probabilities, (K, 2, n, N), and `uniforms` (K, n): it answers (K, n) arrays, each row what
        the step alone would answer; the planner then counts each step as it takes it (a row may never be)."""
        shape = candidate_shape(*self.shape(uniforms.shape[-1], budget))
        if paired.ndim == 1:
            self.selection_steps += 1
            return _throughput_phase(shape, path_probabilities(shape, paired, clipped=True), uniforms, budget)
        return _throughput_phases(shape, paired, uniforms, budget)

    def roots_only(self) -> None:
        """Account a step whose budget holds no draft token beside the roots (B <= n): Algorithm 2 selects
        nothing (neither phase has budget left), so every request verifies its root alone and emits that one
        token (an empty tree is reached at depth 0). `step` answers it so; the planner skips the arrays."""
        self.selection_steps += 1

    def record(self, active: int, verified: int, emitted: int) -> None:
        """Account one step: `verified` positions (roots included) and `emitted` tokens over `active` requests."""
        self.steps += 1
        self.verified_tokens += verified
        self.draft_tokens += verified - active
        self.emitted_tokens += emitted

    def describe(self) -> dict[str, float | int]:
        steps = max(self.steps, 1)
        return {
            "verified_tokens_per_step": round(self.verified_tokens / steps, 2),
            "draft_tokens_per_step": round(self.draft_tokens / steps, 2),
            "slo_share_of_drafts": round(self.slo_tokens / max(self.draft_tokens, 1), 3),
            "selection_steps": self.selection_steps,
            "slo_served_per_selection_step": round(self.slo_served / max(self.selection_steps, 1), 2),
            "slo_served_beyond_tree_per_selection_step": round(
                self.slo_served_beyond_tree / max(self.selection_steps, 1), 2
            ),
            "acceptance_of_drafts": round(
                (self.emitted_tokens - self.verified_tokens + self.draft_tokens) / max(self.draft_tokens, 1), 3
            ),
        }


def _throughput_phase(
    shape: CandidateShape, both: np.ndarray, uniforms: np.ndarray, budget: int
) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 2 with nobody behind (or the ablation, as if every need were min(need, 0)): select() is its
    throughput phase alone, the budget's most probable candidates; the same calls without its bookkeeping (no
    SLO-phase tokens or requests to count). `both`: the estimates' path probabilities, then the truths'.
    Returns (verified, emitted) per request."""
    n = len(uniforms)
    selected = most_probable(both[:n], budget - n)
    return selected_counts(selected, 1), accepted_depths(shape, selected, both[n:], uniforms, 1)


def _throughput_phases(
    shape: CandidateShape, probs: np.ndarray, uniforms: np.ndarray, budget: int
) -> tuple[np.ndarray, np.ndarray]:
    """_throughput_phase for K steps of one batch at one B at once (`probs`: (K, 2, n, N), each step's
    estimates' and truths' path probabilities), each step's values to the bit: argpartition partitions each
    row of a 2-D array as it partitions the same 1-D array (one introselect per row, the same kth, so the same
    ties); the counts are integer sums; the acceptance matmul runs as a stack, which numpy hands to BLAS one
    (n, N) @ (N, d) matrix at a time, the call a single step makes."""
    steps, n = uniforms.shape
    size = shape.size
    estimated = probs[:, 0].reshape(steps, n * size)  # (a copy where not contiguous: rows to partition)
    cut = n * size - (budget - n)  # the B - n most probable candidates beside the n roots
    top = estimated.argpartition(cut, axis=1)[:, cut:]  # (K, B - n): each row's chosen columns
    # The same marks set through flat indices (each row's columns plus its row's start): a one-dimensional
    # index assignment, which numpy runs several times cheaper than the (row, column) pair of index arrays.
    top += row_starts(steps, n * size)
    chosen = np.zeros(steps * n * size, dtype=bool)
    chosen[top.ravel()] = True
    selected = chosen.reshape(steps, n, size)
    reach = np.matmul(probs[:, 1] * selected, shape.level_onehot)  # (K, n, d): P(accepted depth >= k)
    return (
        np.add.reduce(selected, axis=2, initial=1),  # + the root
        np.add.reduce(uniforms[:, :, None] < reach, axis=2, initial=1),  # + the verifier's own token
    )


class StaticScheduler:
    """The static-speculation baseline on the same token model: a `width`-token chain for everyone."""

    def __init__(self, width: int, spec: AdaServeSpec, rng: np.random.Generator) -> None:
        self.width = width
        self.spec = spec
        self.rng = rng

    def describe(self) -> dict[str, float | int]:
        return {"spec_width": self.width}

    must_pay = False  # vLLM-Spec(k) drafts every step, its verified tokens taking max_num_batched_tokens as vLLM's

    def layout(
        self, active: int, context_tokens: float, prefill: PrefillLoad = NO_PREFILL
    ) -> tuple[int, int, tuple[int, int] | None]:
        """TreeScheduler.layout's answer for a k-chain: the whole candidate tree of a depth-k, width-1 beam
        search, verified by everyone."""
        return active * (self.width + 1), self.width, (self.width, 1) if self.width > 0 else None

    def record(self, active: int, verified: int, emitted: int) -> None:
        return None

    def roots_only(self) -> None:
        return None  # (width 0: planned() leaves no draft token; nothing is accounted)

    def step(self, batch: DecodeBatch) -> StepDecision:
        n = len(batch)
        ones = np.ones(n, dtype=np.int64)
        if self.width == 0:
            return StepDecision(verified=ones, emitted=ones, spec_steps=0)
        shape = candidate_shape(self.width, 1)
        selection = chain_selection(n, self.width)
        accepted = accepted_draft_tokens(shape, selection, path_probabilities(shape, batch.truth), batch.uniforms)
        return StepDecision(verified=ones + self.width, emitted=accepted + 1, spec_steps=self.width)
