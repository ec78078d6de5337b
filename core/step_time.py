"""Step-time model of one engine iteration (paper 004, sec. 3.1.1: a generalised roofline).

    step_time = max over terms l of (b_l + k1_l * batched_tokens + k2_l * spec_steps
                                     + k_ctx_l * context_tokens + k_seq_l * sequences)

Each term is one bottleneck: weight streaming (memory-bound, a constant per step), compute (grows with the
tokens in the batch), the draft model's sequential proposal passes, and attention reading the KV cache
(grows with the context held by the batch; an addition to the paper's form, which matters for long contexts
at high batch). The max picks whichever resource limits the step, assuming the rest overlaps with it.

It sits in the bottom layer, not in core/sim: the simulator prices each step with it and the scheduling modes
in core/control plan with the same model (SLOs-Serve's budget, AdaServe's trees), and neither of those two
packages imports the other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from core.pickling import reduce_by_fields
from core.profile import Calibration

# A decode-only batch's step cost (StepTimeModel.decode_step_costs): (floor, the terms that grow with the context
# as (fixed, k_ctx, spec part, seq part), the one such term as (fixed, k_ctx, tail) when it sums so, else None).
DecodeStepCosts = tuple[float, list[tuple[float, float, float, float]], "tuple[float, float, float] | None"]


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    # Columns of the terms, flattened for a fast inner loop: (base, per_token, per_ctx, per_spec, per_seq).
    terms: tuple[tuple[float, float, float, float, float], ...]

    @classmethod
    def from_calibration(cls, calibration: Calibration) -> StepTimeModel:
        return cls(
            tuple(
                (t.base_s, t.per_token_s, t.per_ctx_token_s, t.per_spec_step_s, t.per_seq_s) for t in calibration.terms
            )
        )

    def step_time(self, tokens: float, context_tokens: float, spec_steps: int, sequences: int) -> float:
        best = 0.0
        for base, k_tok, k_ctx, k_spec, k_seq in self.terms:
            value = base + k_tok * tokens + k_ctx * context_tokens + k_spec * spec_steps + k_seq * sequences
            if value > best:
                best = value
        return best

    def decode_step_costs(self, decoding: int, width: int) -> DecodeStepCosts:
        """step_time of a decode-only batch of `decoding` requests at speculation width `width`, split for the
        simulator's decode runs (core/sim/decode_runs.run_decode_steps), which price such a batch every step.

        Each term is step_time's sum left to right, base + k_tok*tokens + k_ctx*context + k_spec*spec +
        k_seq*seqs, with everything but the context fixed by the batch: (base + k_tok*tokens, k_ctx,
        k_spec*width, k_seq*seqs). A term with no context cost is the same value every step (0.0 * context
        is a zero, and adding a zero changes no other value), so those fold into a floor with step_time's
        starting 0.0: the step's max over the terms is the max of that floor and the others, whatever the
        order. With one term left whose spec or seq part is zero, (x + a) + b is x + (a + b) to the bit, so
        the loop evaluates it as one sum of three."""
        tokens = decoding * (width + 1)
        floor_s = 0.0
        varying: list[tuple[float, float, float, float]] = []
        for base, k_tok, k_ctx, k_spec, k_seq in self.terms:
            fixed, spec_part, seq_part = base + k_tok * tokens, k_spec * width, k_seq * decoding
            if k_ctx == 0.0:
                value = fixed + k_ctx * 0.0 + spec_part + seq_part
                if value > floor_s:
                    floor_s = value
            else:
                varying.append((fixed, k_ctx, spec_part, seq_part))
        single = None
        if len(varying) == 1 and (varying[0][2] == 0.0 or varying[0][3] == 0.0):
            fixed, k_ctx, spec_part, seq_part = varying[0]
            single = (fixed, k_ctx, spec_part + seq_part)
        return floor_s, varying, single

    def tokens_within(self, budget_s: float, context_tokens: float, spec_steps: int, sequences: int) -> float:
        """The inverse in the batch size (paper 004's Time2BS): the most batched tokens whose step time stays
        within `budget_s`, given the rest of the batch; 0.0 when even an empty batch takes longer, inf when
        no term grows with tokens."""
        most = math.inf
        for base, k_tok, k_ctx, k_spec, k_seq in self.terms:
            fixed = base + k_ctx * context_tokens + k_spec * spec_steps + k_seq * sequences
            if fixed > budget_s:
                return 0.0
            if k_tok > 0.0:
                most = min(most, (budget_s - fixed) / k_tok)
        return most

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


def expected_accepted_tokens(acceptance: float, width: int) -> float:
    """Tokens emitted per verification step with `width` drafts at per-token acceptance `acceptance`.

    Drafts are accepted left to right until the first rejection, and the verifier always adds one token,
    so E = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a).
    """
    if width <= 0:
        return 1.0
    if acceptance >= 1.0:
        return float(width + 1)
    return (1.0 - acceptance ** (width + 1)) / (1.0 - acceptance)
