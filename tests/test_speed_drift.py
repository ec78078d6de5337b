"""SpeedDrift: the observed / predicted speed ratio that scales SABER's offline f(L) on a live engine."""

from __future__ import annotations

import pytest

from core.control.saber.speed_drift import QUANTILE_FLOOR, RATIO_BOUNDS, SpeedDrift


def test_starts_at_the_fitted_model_and_moves_toward_what_requests_got() -> None:
    drift = SpeedDrift(weight=0.5)
    assert drift.ratio == 1.0
    drift.observe(predicted_tps=100.0, tokens=100, elapsed_s=2.0)  # got 50 tok/s: half the prediction
    assert drift.ratio == pytest.approx(0.75)
    for _ in range(20):
        drift.observe(predicted_tps=100.0, tokens=100, elapsed_s=2.0)
    assert drift.ratio == pytest.approx(0.5, abs=1e-4)
    assert drift.describe()["completions"] == 21


def test_requests_that_produced_nothing_say_nothing_and_outliers_are_bounded() -> None:
    drift = SpeedDrift(weight=1.0)
    drift.observe(predicted_tps=100.0, tokens=0, elapsed_s=3.0)  # failed before its first token
    drift.observe(predicted_tps=100.0, tokens=10, elapsed_s=0.0)
    drift.observe(predicted_tps=float("inf"), tokens=10, elapsed_s=1.0)
    assert drift.ratio == 1.0 and drift.observed == 0
    drift.observe(predicted_tps=100.0, tokens=1, elapsed_s=100.0)  # a request admitted into a stall
    assert drift.ratio == RATIO_BOUNDS[0]
    drift.observe(predicted_tps=1.0, tokens=1000, elapsed_s=1.0)
    assert drift.ratio == RATIO_BOUNDS[1] == 1.0  # faster than profiled never admits beyond the profile


def test_weight_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="weight"):
        SpeedDrift(weight=0.0)


def test_a_low_quantile_of_recent_ratios_leaves_a_margin_as_wide_as_their_spread() -> None:
    # Requests got 40-130% of the predicted speed, evenly spread: the mean is 0.85, the 10% quantile 0.49.
    drift = SpeedDrift(quantile=0.1, window=10)
    for percent in range(40, 131, 10):
        drift.observe(predicted_tps=100.0, tokens=percent, elapsed_s=1.0)
    assert drift.ratio == pytest.approx(0.49)
    mean = SpeedDrift(weight=0.2)
    for percent in range(40, 131, 10):
        mean.observe(predicted_tps=100.0, tokens=percent, elapsed_s=1.0)
    assert mean.ratio > 0.7  # the mean sits in the middle of the spread: half the requests get less
    # The window keeps the recent ones only: a quiet spell (every request at 90%) narrows the margin.
    for _ in range(10):
        drift.observe(predicted_tps=100.0, tokens=90, elapsed_s=1.0)
    assert drift.ratio == pytest.approx(0.9)
    assert drift.describe() == {"ratio": 0.9, "completions": 20, "quantile": 0.1}
    # Bounded: never above the profile, never below QUANTILE_FLOOR.
    for _ in range(10):
        drift.observe(predicted_tps=100.0, tokens=1, elapsed_s=1.0)
    assert drift.ratio == QUANTILE_FLOOR
    with pytest.raises(ValueError, match="quantile"):
        SpeedDrift(quantile=1.0)
