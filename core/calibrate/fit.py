"""Fit the simulator's step-time model to measured engine steps, and write the calibration profile.

The model is the simulator's own (core/step_time.py, paper 004 sec. 3.1.1, a generalised roofline):

    step_time = max over terms l of (base_l + per_token_l * batched_tokens + per_ctx_token_l * context_tokens
                                     + per_spec_step_l * spec_steps + per_seq_l * sequences)

An observation is one measured step time together with the batch composition the simulator would see for
that step (`batched_tokens`, `context_tokens`, `spec_steps`, `sequences`, exactly as core/sim/engine.py
passes them): a step timed by the engine (vLLM's own /metrics), or a median inter-chunk gap at a known
batch. A client-measured time to first token (`with_overhead`) is one prefill step plus a fixed
per-request latency outside the engine (HTTP, tokenisation, the API server's hand-off), fitted as a
separate nuisance parameter `request_overhead_s` so that it does not leak into every step's base cost. The
simulator has no field for that latency; it is reported alongside the fit.

Residuals are relative (error / measured), so a 3 ms decode step weighs as much as a 40 ms prefill, and all
coefficients are bounded at zero (a negative cost per token has no physical meaning).

One term (a sum of costs) is the physically right form when nothing overlaps, as on a CPU where one host
thread does everything in turn. Two terms (the roofline max of a memory/host term and a compute term) fit
an accelerator where weight streaming and compute overlap; `fit_step_model(..., terms="auto")` keeps the
second term only when it explains the data clearly better.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from scipy.optimize import brentq, least_squares, lsq_linear

from core.durable_files import replace_atomically
from core.profile import Calibration, PerfTerm, PowerModel, StallModel
from core.step_time import expected_accepted_tokens

# Feature columns of an observation, in PerfTerm's coefficient order.
COEFFICIENTS = ("base_s", "per_token_s", "per_ctx_token_s", "per_spec_step_s", "per_seq_s")
# The two-term roofline: a memory/host term (weights streaming, KV reads, per-sequence host work, draft
# passes) and a compute term (grows with the tokens in the batch), as in profiles/calibrations/*.yaml.
MEMORY_COEFFICIENTS = ("base_s", "per_ctx_token_s", "per_spec_step_s", "per_seq_s")
COMPUTE_COEFFICIENTS = ("base_s", "per_token_s")
# `terms="auto"` keeps the two-term fit only if it cuts the RMS relative error by at least this share.
TWO_TERM_GAIN = 0.25
SIGNIFICANT_DIGITS = 4


class FitError(ValueError):
    """The observations cannot determine the model (too few, or non-positive times)."""


@dataclass(frozen=True, slots=True)
class StepObservation:
    """One measured step time and the batch the simulator would see for that step."""

    step_s: float
    batched_tokens: float
    context_tokens: float
    spec_steps: float = 0.0
    sequences: float = 1.0
    kind: Literal["decode", "prefill"] = "decode"
    # A client-measured TTFT: one prefill step plus the per-request latency outside the engine (fitted as
    # `request_overhead_s`). False for steps timed by the engine itself or from chunk gaps.
    with_overhead: bool = False
    weight: float = 1.0  # e.g. sqrt of the number of gaps behind a median
    label: str = ""

    def features(self) -> np.ndarray:
        return np.array([1.0, self.batched_tokens, self.context_tokens, self.spec_steps, self.sequences])


@dataclass(frozen=True, slots=True)
class StepFit:
    terms: tuple[PerfTerm, ...]
    request_overhead_s: float  # latency outside engine steps, seen in TTFT only (not in the simulator)
    observations: tuple[StepObservation, ...]
    predictions: tuple[float, ...]
    alternatives: dict[str, float] = field(default_factory=dict)  # RMS relative error of each form tried

    @property
    def relative_errors(self) -> np.ndarray:
        measured = np.array([o.step_s for o in self.observations])
        return (np.array(self.predictions) - measured) / measured

    @property
    def rms_relative_error(self) -> float:
        errors = self.relative_errors
        return float(np.sqrt(np.mean(errors**2))) if len(errors) else 0.0

    @property
    def max_relative_error(self) -> float:
        errors = self.relative_errors
        return float(np.abs(errors).max()) if len(errors) else 0.0

    def step_time(
        self, batched_tokens: float, context_tokens: float, spec_steps: float = 0.0, sequences: float = 1.0
    ) -> float:
        """The fitted model's step time (the same arithmetic as core/step_time.py)."""
        return _step_time(self.terms, batched_tokens, context_tokens, spec_steps, sequences)


def _step_time(terms: Sequence[PerfTerm], tokens: float, ctx: float, spec: float, seqs: float) -> float:
    return max(
        t.base_s + t.per_token_s * tokens + t.per_ctx_token_s * ctx + t.per_spec_step_s * spec + t.per_seq_s * seqs
        for t in terms
    )


def _check(observations: Sequence[StepObservation]) -> None:
    if len(observations) < 3:
        raise FitError(f"{len(observations)} step observations; the fit needs at least 3")
    bad = [o for o in observations if not (o.step_s > 0 and math.isfinite(o.step_s))]
    if bad:
        raise FitError(f"step time {bad[0].step_s!r} of observation {bad[0].label!r} is not a positive number")


def _arrays(observations: Sequence[StepObservation]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    features = np.array([o.features() for o in observations])
    measured = np.array([o.step_s for o in observations])
    prefill = np.array([1.0 if o.with_overhead else 0.0 for o in observations])
    weights = np.sqrt(np.array([max(o.weight, 0.0) for o in observations]))
    return features, measured, prefill, weights


def _fit_one_term(observations: Sequence[StepObservation]) -> tuple[PerfTerm, float]:
    """Non-negative linear least squares on relative residuals: the sum-of-costs form, solved exactly."""
    features, measured, prefill, weights = _arrays(observations)
    design = np.column_stack([features, prefill])
    rows = design / measured[:, None] * weights[:, None]
    target = weights.copy()
    # Columns the design never exercises (no speculation measured, no prefill point) stay at zero; the
    # others are scaled to unit maximum so the solver sees a well-conditioned problem.
    scale = np.abs(rows).max(axis=0)
    used = scale > 0
    solution = np.zeros(design.shape[1])
    result = lsq_linear(rows[:, used] / scale[used], target, bounds=(0.0, np.inf), method="bvls")
    solution[used] = result.x / scale[used]
    term = PerfTerm(name="step (sum of costs)", **dict(zip(COEFFICIENTS, map(float, solution[:5]), strict=True)))
    return term, float(solution[5])


def _unpack_two(x: np.ndarray) -> tuple[PerfTerm, PerfTerm, float]:
    memory = PerfTerm(
        name="memory and host (weights, KV reads, per-sequence work, draft passes)",
        **dict(zip(MEMORY_COEFFICIENTS, map(float, x[0:4]), strict=True)),
    )
    compute = PerfTerm(name="compute", **dict(zip(COMPUTE_COEFFICIENTS, map(float, x[4:6]), strict=True)))
    return memory, compute, float(x[6])


def _fit_two_terms(
    observations: Sequence[StepObservation], one_term: PerfTerm, overhead: float
) -> tuple[tuple[PerfTerm, PerfTerm], float, float]:
    """The roofline max of two terms, by bounded least squares from a few starting points; returns the
    terms, the overhead and the cost."""
    features, measured, prefill, weights = _arrays(observations)
    memory_cols = [COEFFICIENTS.index(c) for c in MEMORY_COEFFICIENTS]
    compute_cols = [COEFFICIENTS.index(c) for c in COMPUTE_COEFFICIENTS]

    def residuals(x: np.ndarray) -> np.ndarray:
        memory = features[:, memory_cols] @ x[0:4]
        compute = features[:, compute_cols] @ x[4:6]
        predicted = np.maximum(memory, compute) + x[6] * prefill
        return (predicted - measured) / measured * weights

    base, per_token, per_ctx, per_spec, per_seq = (getattr(one_term, c) for c in COEFFICIENTS)
    typical = float(np.median(measured))
    starts = [
        # The one-term solution split: everything but the tokens in memory, a steeper compute term.
        [base, per_ctx, per_spec, per_seq, 0.5 * base, 2.0 * per_token, overhead],
        [0.8 * base, per_ctx, per_spec, per_seq, 0.1 * base, 1.5 * per_token, overhead],
        # From scratch: half the typical step each, small slopes.
        [0.5 * typical, 1e-9, 0.1 * typical, 0.01 * typical, 0.1 * typical, typical / 1000, overhead],
    ]
    # Parameter scales for the solver: the columns' typical magnitudes of contribution.
    column_max = np.maximum(features.max(axis=0), 1.0)
    x_scale = np.array(
        [typical / column_max[c] for c in memory_cols] + [typical / column_max[c] for c in compute_cols] + [typical]
    )
    best: tuple[np.ndarray, float] | None = None
    for start in starts:
        x0 = np.maximum(np.asarray(start, dtype=float), 0.0)
        result = least_squares(residuals, x0, bounds=(0.0, np.inf), x_scale=x_scale, method="trf")
        if best is None or result.cost < best[1]:
            best = (result.x, float(result.cost))
    assert best is not None
    memory, compute, fitted_overhead = _unpack_two(best[0])
    return (memory, compute), fitted_overhead, best[1]


def _predict(terms: Sequence[PerfTerm], overhead: float, observations: Sequence[StepObservation]) -> list[float]:
    return [
        _step_time(terms, o.batched_tokens, o.context_tokens, o.spec_steps, o.sequences)
        + (overhead if o.with_overhead else 0.0)
        for o in observations
    ]


def _rms(predicted: Sequence[float], observations: Sequence[StepObservation]) -> float:
    errors = [(p - o.step_s) / o.step_s for p, o in zip(predicted, observations, strict=True)]
    return float(np.sqrt(np.mean(np.square(errors))))


def _binding_counts(terms: Sequence[PerfTerm], observations: Sequence[StepObservation]) -> list[int]:
    """How many observations each term is the maximum for."""
    counts = [0] * len(terms)
    for o in observations:
        values = [_step_time([t], o.batched_tokens, o.context_tokens, o.spec_steps, o.sequences) for t in terms]
        counts[int(np.argmax(values))] += 1
    return counts


def fit_step_model(observations: Sequence[StepObservation], terms: Literal[1, 2, "auto"] = "auto") -> StepFit:
    """Fit the roofline step-time model (paper 004 sec. 3.1.1) to measured steps. Raises FitError."""
    _check(observations)
    observations = tuple(observations)
    one_term, one_overhead = _fit_one_term(observations)
    one_predicted = _predict([one_term], one_overhead, observations)
    alternatives = {"one term": _rms(one_predicted, observations)}
    chosen: tuple[tuple[PerfTerm, ...], float, list[float]] = ((one_term,), one_overhead, one_predicted)
    if terms in (2, "auto"):
        two_terms, two_overhead, _ = _fit_two_terms(observations, one_term, one_overhead)
        two_predicted = _predict(two_terms, two_overhead, observations)
        alternatives["two terms"] = _rms(two_predicted, observations)
        # Keep the roofline's second term only when both terms bind somewhere and it clearly fits better:
        # a max whose second term never binds is the one-term model with an unused parameter.
        both_bind = min(_binding_counts(two_terms, observations)) >= 2
        clearly_better = alternatives["two terms"] < (1.0 - TWO_TERM_GAIN) * alternatives["one term"]
        if terms == 2 or (both_bind and clearly_better):
            chosen = (two_terms, two_overhead, two_predicted)
    fitted_terms, overhead, predicted = chosen
    return StepFit(
        terms=tuple(fitted_terms),
        request_overhead_s=overhead,
        observations=observations,
        predictions=tuple(predicted),
        alternatives=alternatives,
    )


# ---------------------------------------------------------------- speculation and noise


def acceptance_from_length(mean_acceptance_length: float, width: int) -> float:
    """Per-token acceptance a whose expected tokens per verification step, (1 - a^(k+1)) / (1 - a), equals
    vLLM's mean acceptance length (1 + accepted / drafts): the quantity the simulator draws per request.

    Clamped to [0, 0.99]: the calibration requires a < 1.
    """
    if width <= 0:
        raise ValueError("acceptance needs a speculative width of at least 1")
    if not mean_acceptance_length > 1.0:
        return 0.0
    ceiling = 0.99
    if mean_acceptance_length >= expected_accepted_tokens(ceiling, width):
        return ceiling
    return float(brentq(lambda a: expected_accepted_tokens(a, width) - mean_acceptance_length, 0.0, ceiling))


def robust_cv(values: Sequence[float] | np.ndarray) -> float:
    """Coefficient of variation from the median absolute deviation (1.4826 x MAD / median): the spread of
    ordinary steps, not of the rare stalls a shared CPU adds (those would inflate a plain std)."""
    array = np.asarray(values, dtype=float)
    if len(array) < 2:
        return 0.0
    median = float(np.median(array))
    if median <= 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(array - median)) / median)


# ---------------------------------------------------------------- the calibration profile


def _significant(value: float, digits: int = SIGNIFICANT_DIGITS) -> float:
    return float(f"{value:.{digits}g}")


def build_calibration(
    fit: StepFit,
    *,
    name: str,
    model: str,
    hardware: str,
    derivation: str,
    kv_capacity_tokens: int,
    block_size: int,
    noise_cv: float,
    default_acceptance: float,
    max_model_len: int,
    acceptance_concentration: float = 20.0,
    power: PowerModel | None = None,
    stalls: StallModel | None = None,
) -> Calibration:
    """A validated `Calibration` (core/profile.py) from the fit and the server's facts."""
    terms = [term.model_copy(update={c: _significant(getattr(term, c)) for c in COEFFICIENTS}) for term in fit.terms]
    return Calibration(
        name=name,
        model=model,
        hardware=hardware,
        derivation=derivation,
        terms=terms,
        kv_capacity_tokens=int(kv_capacity_tokens),
        block_size=int(block_size),
        noise_cv=min(max(_significant(noise_cv, 2), 0.0), 0.5),
        default_acceptance=min(max(_significant(default_acceptance, 3), 0.0), 0.99),
        acceptance_concentration=acceptance_concentration,
        max_model_len=int(max_model_len),
        power=power,
        stalls=None
        if stalls is None
        else StallModel(
            rate_per_s=_significant(stalls.rate_per_s),
            mean_s=_significant(stalls.mean_s),
            cv=_significant(stalls.cv, 2),
        ),
    )


def calibration_yaml(calibration: Calibration, header: str = "") -> str:
    """YAML in the layout of profiles/calibrations/*.yaml; `header` lines become comments on top."""
    data: dict[str, Any] = calibration.model_dump(exclude_none=True)
    # Zero coefficients are the defaults; leaving them out keeps each term to what it actually costs.
    data["terms"] = [{k: v for k, v in term.items() if k == "name" or v != 0.0} for term in data["terms"]]
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines()) if header else ""
    return comments + yaml.safe_dump(data, sort_keys=False, width=110, allow_unicode=True)


def write_calibration(calibration: Calibration, path: Path, header: str = "") -> Path:
    return replace_atomically(path, calibration_yaml(calibration, header))


def read_calibration(path: Path) -> Calibration:
    """Load a calibration file the way profiles do (core.profile.Calibration validates it)."""
    return Calibration.model_validate(yaml.safe_load(path.read_text()))
