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

from core.profile import Calibration


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
