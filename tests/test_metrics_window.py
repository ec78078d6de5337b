"""WindowedAggregator: the live panels' sliding window agrees with summarize on the same requests."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from core.metrics import WindowedAggregator, summarize
from core.profile import SLOSpec, SmoothGoodputSpec
from core.records import RequestRecord, RequestSLO, Status

SLO = SLOSpec(e2e_s=1.0)
SMOOTH = SmoothGoodputSpec(alpha=2.0, reading_speed_tps=5.0, ttft_allow_s=0.5)


def finished(rid: int, arrival: float, e2e: float, *, status: Status = Status.OK, warmup: bool = False):
    """A 3-token request whose chunks are evenly spread over its latency."""
    times = arrival + e2e * np.array([0.4, 0.7, 1.0])
    return RequestRecord(
        request_id=rid,
        task="default",
        slo=RequestSLO(),
        prompt_tokens=8,
        max_tokens=3,
        scheduled_s=arrival,
        arrival_s=arrival,
        status=status,
        end_s=arrival + e2e,
        output_tokens=3 if status is Status.OK else 0,
        chunk_times=times if status is Status.OK else None,
        warmup=warmup,
    )


def test_snapshot_covers_requests_that_ended_in_the_window() -> None:
    agg = WindowedAggregator(10.0, SLO, SMOOTH)
    # Ends at 1.5, 5.0, 12.0, 14.0 and a timeout ending at 13.0.
    for rec in [
        finished(0, 1.0, 0.5),
        finished(1, 3.0, 2.0),
        finished(2, 11.5, 0.5),
        finished(3, 13.2, 0.8),
        finished(4, 8.0, 5.0, status=Status.TIMEOUT),
    ]:
        agg.add(rec)
    snap = agg.snapshot(14.0)  # window (4, 14]: drops the request that ended at 1.5
    assert (snap.requests, snap.completed, snap.failed) == (4, 3, 1)
    assert snap.window_s == 10.0
    e2es = np.array([2.0, 0.5, 0.8])
    assert snap.p50_s == pytest.approx(np.percentile(e2es, 50))
    assert snap.p99_s == pytest.approx(np.percentile(e2es, 99))
    assert snap.goodput_rps == pytest.approx(2 / 10)  # 0.5 and 0.8 within 1.0 s
    assert snap.slo_attainment == pytest.approx(2 / 4)
    assert snap.throughput_rps == pytest.approx(3 / 10)
    assert snap.output_tps == pytest.approx(9 / 10)
    json.dumps(snap.to_dict(), allow_nan=False)


def test_snapshot_matches_summarize_over_the_same_requests_and_window() -> None:
    rng = np.random.default_rng(5)
    records = [finished(i, float(i) * 0.05, float(rng.exponential(0.8))) for i in range(400)]
    records.sort(key=lambda r: r.end_s)
    agg = WindowedAggregator(5.0, SLO, SMOOTH, batch_size=32)
    now = 15.0
    for rec in records:
        if rec.end_s <= now:  # live: what has finished by now
            agg.add(rec)
    snap = agg.snapshot(now)
    inside = [r for r in records if now - 5.0 < r.end_s <= now]
    ref = summarize(inside, slo=SLO, smooth=SMOOTH, window_s=5.0)
    assert snap.requests == ref.requests
    assert snap.p50_s == pytest.approx(ref.p50_s)
    assert snap.p95_s == pytest.approx(ref.p95_s)
    assert snap.p99_s == pytest.approx(ref.p99_s)
    assert snap.ttft_p99_s == pytest.approx(ref.ttft_p99_s)
    assert snap.tpot_p99_s == pytest.approx(ref.tpot_p99_s)
    assert snap.goodput_rps == pytest.approx(ref.goodput_rps)
    assert snap.smooth_goodput == pytest.approx(ref.smooth_goodput)
    assert snap.slo_attainment == pytest.approx(ref.slo_attainment)


def test_totals_are_cumulative_and_old_rows_are_evicted() -> None:
    agg = WindowedAggregator(2.0, SLO, SMOOTH, batch_size=4)
    for i in range(100):
        agg.add(finished(i, float(i), 0.5 if i % 2 else 1.5))
    totals = agg.totals
    assert (totals.requests, totals.completed, totals.failed) == (100, 100, 0)
    assert totals.good == 50 and totals.attained == 50
    assert totals.output_tokens == 300
    # Only the last window's rows are kept, not the whole run.
    assert len(agg._rows) <= 4
    ends = [i + (0.5 if i % 2 else 1.5) for i in range(100)]
    assert agg.snapshot(99.6).requests == sum(1 for e in ends if 97.6 < e <= 99.6) == 2


def test_warmup_records_are_skipped_and_counted_apart() -> None:
    agg = WindowedAggregator(10.0, SLO, SMOOTH)
    agg.add(finished(0, 0.0, 0.3, warmup=True))
    agg.add(finished(1, 1.0, 0.3))
    assert agg.totals.requests == 1 and agg.totals.warmup_skipped == 1
    assert agg.snapshot(2.0).requests == 1


def test_a_young_run_divides_by_its_age_not_the_full_window() -> None:
    agg = WindowedAggregator(60.0, SLO, SMOOTH)
    for i in range(10):
        agg.add(finished(i, 0.5 * i, 0.2))
    snap = agg.snapshot(5.0)  # first arrival at 0, so the run is 5 s old
    assert snap.window_s == pytest.approx(5.0)
    assert snap.throughput_rps == pytest.approx(10 / 5.0)


def test_an_empty_window_reads_as_undefined() -> None:
    agg = WindowedAggregator(5.0, SLO, SMOOTH)
    snap = agg.snapshot(3.0)
    assert snap.requests == 0
    assert math.isnan(snap.p99_s) and math.isnan(snap.goodput_rps) and math.isnan(snap.slo_attainment)
    assert snap.to_dict()["p99_s"] is None
    with pytest.raises(ValueError, match="window_s"):
        WindowedAggregator(0.0, SLO, SMOOTH)
