"""Token-length samplers for prompts and outputs, vectorised over blocks of requests.

Samplers are built once from a profile's length model (checking what pydantic cannot: min <= max,
weights that match values) and then draw whole numpy blocks.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from core.profile import EmpiricalLength, FixedLength, LengthDist, LognormalLength, UniformLength


class LengthModelError(ValueError):
    """A length model that validates field by field but cannot be sampled (e.g. min > max)."""


class LengthSampler(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` token counts (int64, each >= 1)."""
        ...

    @property
    def mean(self) -> float:
        """The mean the model is meant to have before clipping (for descriptions and checks)."""
        ...


class FixedSampler:
    def __init__(self, model: FixedLength) -> None:
        self._value = model.value

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self._value, dtype=np.int64)

    @property
    def mean(self) -> float:
        return float(self._value)


class LognormalSampler:
    """Lognormal with a given arithmetic mean; `sigma` is the std of the underlying normal.

    E[X] = exp(mu + sigma^2 / 2), so mu = ln(mean) - sigma^2 / 2 keeps the requested mean whatever the
    spread. Draws are rounded to whole tokens and clipped to [min, max]; clipping shifts the mean a
    little when the bounds cut into the tails.
    """

    def __init__(self, model: LognormalLength) -> None:
        if model.min > model.max:
            raise LengthModelError(f"min ({model.min}) is above max ({model.max}); swap them or widen the range")
        try:
            self._mu = math.log(model.mean) - model.sigma**2 / 2
        except OverflowError:
            raise LengthModelError(
                f"sigma {model.sigma:g} is too large to sample (its square overflows); give a spread below 1e150"
            ) from None
        self._sigma = model.sigma
        self._mean = model.mean
        self._low = model.min
        self._high = model.max

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        draws = rng.lognormal(self._mu, self._sigma, n)
        return np.clip(np.rint(draws), self._low, self._high).astype(np.int64)

    @property
    def mean(self) -> float:
        return self._mean


class UniformSampler:
    """Whole numbers from low to high, both included."""

    def __init__(self, model: UniformLength) -> None:
        if model.low > model.high:
            raise LengthModelError(f"low ({model.low}) is above high ({model.high}); swap them")
        self._low = model.low
        self._high = model.high

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self._low, self._high, size=n, endpoint=True, dtype=np.int64)

    @property
    def mean(self) -> float:
        return (self._low + self._high) / 2


class EmpiricalSampler:
    """Draws from observed values, with optional weights (normalised here, so any scale works)."""

    def __init__(self, model: EmpiricalLength) -> None:
        self._values = np.asarray(model.values, dtype=np.int64)
        if model.weights is None:
            self._probabilities: np.ndarray | None = None
        else:
            if len(model.weights) != len(model.values):
                raise LengthModelError(
                    f"{len(model.weights)} weights for {len(model.values)} values; give one weight per value"
                )
            weights = np.asarray(model.weights, dtype=float)
            total = weights.sum()
            if total <= 0:
                raise LengthModelError("the weights sum to zero; give at least one positive weight")
            self._probabilities = weights / total

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(self._values, size=n, p=self._probabilities)

    @property
    def mean(self) -> float:
        if self._probabilities is None:
            return float(self._values.mean())
        return float(self._values @ self._probabilities)


def make_length_sampler(model: LengthDist) -> LengthSampler:
    if isinstance(model, FixedLength):
        return FixedSampler(model)
    if isinstance(model, LognormalLength):
        return LognormalSampler(model)
    if isinstance(model, UniformLength):
        return UniformSampler(model)
    if isinstance(model, EmpiricalLength):
        return EmpiricalSampler(model)
    raise TypeError(f"unknown length model {type(model).__name__}")
