"""The SLO verdict (core/metrics/slo_verdict.py): met or violated, and by how much, relative to the SLO."""

from __future__ import annotations

import math

import pytest

from core.metrics.slo_verdict import SloVerdict, slo_verdict


def test_a_p99_under_the_slo_meets_it_with_the_headroom_as_margin() -> None:
    met, margin = slo_verdict(0.9, 1.2)
    assert met is True and margin == pytest.approx(0.25)


def test_a_p99_over_the_slo_violates_it_by_a_negative_margin() -> None:
    assert slo_verdict(1.344, 1.2) == SloVerdict(False, pytest.approx(-0.12))


def test_a_p99_equal_to_the_slo_meets_it() -> None:
    assert slo_verdict(1.2, 1.2) == SloVerdict(True, 0.0)


@pytest.mark.parametrize("p99", [None, math.nan])
def test_nothing_measured_proves_no_slo(p99: float | None) -> None:
    met, margin = slo_verdict(p99, 1.2)
    assert met is False and math.isnan(margin)


@pytest.mark.parametrize("slo", [0.0, -1.0, math.inf, math.nan])
def test_an_slo_that_is_no_positive_number_is_refused(slo: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        slo_verdict(1.0, slo)
