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


def varied_records(rng: np.random.Generator, n: int) -> list[RequestRecord]:
    """Streamed, multi-token-chunk, unstreamed, single-chunk, failed and warm-up records over three tasks,
    some with their own SLO."""
    records = []
    for rid in range(n):
        arrival = float(rng.uniform(0, 50))
        status = Status.OK if rng.random() < 0.85 else Status.TIMEOUT
        chunks = int(rng.integers(1, 9))
        times = np.sort(arrival + rng.uniform(0.01, 3.0, size=chunks))
        kind = rng.random()
        tokens = rng.integers(1, 4, size=chunks) if kind < 0.3 else None
        streamed = kind < 0.9
        n_out = int(tokens.sum()) if tokens is not None else chunks
        records.append(
            RequestRecord(
                request_id=rid,
                task=str(rng.choice(["chat", "code", "summary"])),
                slo=RequestSLO(e2e_s=2.0, ttft_s=0.5) if rng.random() < 0.3 else RequestSLO(),
                prompt_tokens=8,
                max_tokens=n_out,
                scheduled_s=arrival,
                arrival_s=arrival,
                status=status,
                end_s=float(times[-1]),
                output_tokens=n_out if status is Status.OK else 0,
                chunk_times=times if streamed else None,
                chunk_tokens=tokens if streamed else None,
                warmup=rng.random() < 0.05,
            )
        )
    return records


def test_a_summary_from_the_windows_outcomes_is_the_summary_judged_afresh() -> None:
    """summarize(judged=window.judged) reuses the live window's outcomes (issue 22: each record judged once):
    the same summary to the last bit, records fed in any completion order and batching."""
    rng = np.random.default_rng(5)
    records = varied_records(rng, 700)
    agg = WindowedAggregator(10.0, SLO, SMOOTH, batch_size=37, keep_outcomes=True)
    for i in rng.permutation(len(records)):
        agg.add(records[i])
        if rng.random() < 0.05:
            agg.snapshot(50.0)
    judged = agg.judged([r for r in records if not r.warmup], SLO, SMOOTH)
    assert judged is not None  # the reuse path is taken, not the fallback
    reused = summarize(records, slo=SLO, smooth=SMOOTH, judged=agg.judged)
    fresh = summarize(records, slo=SLO, smooth=SMOOTH)
    assert json.dumps(reused.to_dict()) == json.dumps(fresh.to_dict())
    assert list(reused.per_task) == list(fresh.per_task)  # tasks in first-appearance order, as judged afresh


def test_the_window_judges_nothing_it_did_not_see() -> None:
    rng = np.random.default_rng(6)
    records = [r for r in varied_records(rng, 50) if not r.warmup]
    agg = WindowedAggregator(10.0, SLO, SMOOTH, keep_outcomes=True)
    for record in records[:-1]:
        agg.add(record)
    assert agg.judged(records, SLO, SMOOTH) is None  # one record missing
    assert agg.judged(records[:-1], SLOSpec(e2e_s=9.0), SMOOTH) is None  # another SLO
    assert agg.judged(records[:-1], SLO, SMOOTH) is not None
    assert WindowedAggregator(10.0, SLO, SMOOTH).judged(records, SLO, SMOOTH) is None  # kept nothing


def test_a_live_backends_summary_sees_records_completed_after_the_run() -> None:
    """A live backend may complete records after they reached the observer (the gateway's settle reconciles
    every record after the run): its summary judges the final records, not the live window's outcomes."""
    import asyncio

    from core.backends.factory import make_backend
    from core.events import null_sink
    from core.jobs.run import RunOptions, run_workload
    from core.profile import load_profile

    profile = load_profile("quickstart")

    class SettlesLate:
        def __init__(self, backend_kind: str) -> None:
            self.sim = make_backend("sim", profile)
            self.kind = backend_kind

        def describe(self) -> dict:
            return {**self.sim.describe(), "backend": self.kind}

        async def run(self, plan, observer=None):  # type: ignore[no-untyped-def]
            outcome = await self.sim.run(plan, observer)
            for record in outcome.records[::2]:  # rejected after the fact, as a gateway's settle may
                record.status, record.error = Status.REJECTED, "settled late"
            return outcome

    def failed(kind: str) -> tuple[int, int]:
        """(failed in the summary, measured records rejected late)"""
        result = asyncio.run(run_workload(profile, SettlesLate(kind), null_sink, RunOptions(requests=1000)))
        late = sum(not r.warmup and r.status is Status.REJECTED for r in result.records)
        return result.summary.failed, late

    summary_failed, late = failed("url")
    assert late > 40 and summary_failed == late  # judged afresh: every late rejection counts
    summary_failed, late = failed("sim")
    assert late > 40 and summary_failed < late  # the simulator: the window's verdicts stand (its records are final)


def test_the_window_keeps_the_rows_a_deque_of_tuples_kept() -> None:
    """The rows table against the reference it replaced: each batch's outcome columns as tuples of Python
    floats appended to a deque, the oldest popped while its end is at or before the horizon (out-of-order
    ends linger behind an older row, failures keyed by their end, a request that never ended by its arrival)."""
    from collections import deque

    from core.metrics.outcomes import compute_outcomes

    rng = np.random.default_rng(11)
    statuses = [Status.OK] * 8 + [Status.TIMEOUT, Status.ERROR]
    records = []
    for i in range(600):
        status = statuses[int(rng.integers(len(statuses)))]
        records.append(finished(i, float(i) * 0.1, float(rng.exponential(1.5)), status=status))
    records.sort(key=lambda r: r.end_s + float(rng.normal(0.0, 0.4)))  # roughly in end order
    agg = WindowedAggregator(3.0, SLO, SMOOTH, batch_size=16)
    reference: deque[tuple[float, ...]] = deque()
    newest = -math.inf
    pending = []
    for step, rec in enumerate(records, 1):
        agg.add(rec)
        pending.append(rec)
        if len(pending) == 16 or step % 37 == 0:
            out = compute_outcomes(pending, fallback_slo=SLO, smooth=SMOOTH)
            pending = []
            key = np.where(np.isnan(out.end_s), out.arrival_s, out.end_s)
            columns = (key, out.ok, out.e2e_s, out.ttft_s, out.tpot_s, out.good, out.attained, out.benefit)
            reference.extend(zip(*(c.astype(float).tolist() for c in (*columns, out.output_tokens)), strict=True))
            newest = max(newest, float(key.max()))
            now = newest if step % 37 else newest + 0.5  # a snapshot a little after the newest end too
            while reference and reference[0][0] <= now - 3.0:
                reference.popleft()
            if step % 37 == 0:
                agg.snapshot(now)
            else:
                agg._flush()
            assert np.array_equal(agg._rows, np.array(reference, dtype=float).reshape(-1, 9), equal_nan=True)


def test_advance_leaves_the_window_as_a_snapshot_leaves_it() -> None:
    """`advance` (a run whose progress events nobody reads) judges and drops what `snapshot` would: the
    next snapshot and the kept outcomes are the same to the last bit."""
    rng = np.random.default_rng(7)
    records = varied_records(rng, 600)
    read = WindowedAggregator(10.0, SLO, SMOOTH, batch_size=512, keep_outcomes=True)
    unread = WindowedAggregator(10.0, SLO, SMOOTH, batch_size=512, keep_outcomes=True)
    for i, record in enumerate(records):
        read.add(record)
        unread.add(record)
        if i % 41 == 40:
            now = max(r.end_s or r.arrival_s for r in records[: i + 1])
            read.snapshot(now)
            unread.advance(now)
    # The same state before the last snapshot: the same records judged, the same rows kept (a no-op
    # `advance` leaves records pending and fails here).
    assert read._totals == unread._totals and np.array_equal(read._rows, unread._rows, equal_nan=True)
    assert json.dumps(read.snapshot(60.0).to_dict()) == json.dumps(unread.snapshot(60.0).to_dict())
    kept = [r for r in records if not r.warmup]
    a, b = read.judged(kept, SLO, SMOOTH), unread.judged(kept, SLO, SMOOTH)
    assert a is not None and b is not None
    assert json.dumps(summarize(records, slo=SLO, smooth=SMOOTH, judged=read.judged).to_dict()) == json.dumps(
        summarize(records, slo=SLO, smooth=SMOOTH, judged=unread.judged).to_dict()
    )


@pytest.mark.parametrize("mode", ["fcfs", "slos-serve"])
def test_a_run_nobody_watches_has_the_summary_of_one_that_is_watched(mode: str) -> None:
    """run_workload with null_sink (a capacity probe) skips the progress snapshots: the same summary as the
    run whose progress events are read, which did emit them."""
    import asyncio

    from core.backends.factory import make_backend
    from core.events import null_sink
    from core.jobs.run import RunOptions, run_workload
    from core.profile import load_profile

    profile = load_profile("quickstart").model_copy(update={"mode": mode})
    options = RunOptions(seed=3, requests=600, progress_every=37, engine_events=False)

    def run(sink):  # type: ignore[no-untyped-def]
        backend = make_backend("sim", profile, seed=3, mode=mode)
        return asyncio.run(run_workload(profile, backend, sink, options)).summary.to_dict()

    events: list[dict] = []
    watched = run(events.append)
    assert sum(e["event"] == "progress" for e in events) >= 15
    assert json.dumps(run(null_sink)) == json.dumps(watched)
