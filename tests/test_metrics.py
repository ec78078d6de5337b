"""Metrics: every number checked against a hand computation on hand-built records."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from core.metrics import benefit, compute_outcomes, idle_latency_s, outcomes, smooth_goodput, summarize
from core.metrics import summary as summary_module
from core.profile import SLOSpec, SmoothGoodputSpec
from core.records import RequestRecord, RequestSLO, Status

NO_SLO = SLOSpec()
SMOOTH = SmoothGoodputSpec()


def rec(
    rid: int = 0,
    *,
    arrival: float = 0.0,
    chunks: list[float] | np.ndarray | None = None,
    tokens: list[int] | None = None,
    end: float | None = None,
    status: Status = Status.OK,
    task: str = "default",
    slo: RequestSLO | None = None,
    warmup: bool = False,
    output_tokens: int | None = None,
) -> RequestRecord:
    """A record with explicit chunk times; end defaults to the last chunk, n to the tokens in chunks."""
    times = None if chunks is None else np.asarray(chunks, dtype=float)
    tok = None if tokens is None else np.asarray(tokens, dtype=np.int64)
    if output_tokens is None:
        output_tokens = 0 if times is None else (int(tok.sum()) if tok is not None else len(times))
    if end is None and times is not None and len(times) and status is Status.OK:
        end = float(times[-1])
    return RequestRecord(
        request_id=rid,
        task=task,
        slo=slo or RequestSLO(),
        prompt_tokens=10,
        max_tokens=max(output_tokens, 1),
        scheduled_s=arrival,
        arrival_s=arrival,
        status=status,
        end_s=end,
        output_tokens=output_tokens,
        chunk_times=times,
        chunk_tokens=tok,
        warmup=warmup,
    )


def one_token_at(rid: int, arrival: float, e2e: float, **kw) -> RequestRecord:
    return rec(rid, arrival=arrival, chunks=[arrival + e2e], **kw)


# ---------------------------------------------------------------- latencies


def test_e2e_percentiles_use_numpy_linear_interpolation() -> None:
    records = [one_token_at(i, 0.0, e2e) for i, e2e in enumerate([1.0, 2.0, 3.0, 4.0])]
    s = summarize(records, slo=NO_SLO, smooth=SMOOTH)
    # Linear rank: (n - 1) * q = 3q between sorted values.
    assert s.p50_s == pytest.approx(2.5)
    assert s.p90_s == pytest.approx(3.7)
    assert s.p95_s == pytest.approx(3.85)
    assert s.p99_s == pytest.approx(3.97)
    assert s.mean_s == pytest.approx(2.5)


@pytest.mark.parametrize("kind", ["lognormal", "ties", "signed", "infinities", "nan"])
def test_small_array_percentiles_equal_numpys_to_the_bit(kind: str) -> None:
    """`percentiles` sorts arrays of up to summary._SMALL values and partitions larger ones, and interpolates
    itself; every figure must be np.percentile's, in every size up to that bound and beyond it."""
    rng = np.random.default_rng(7)
    for n in [*range(1, 40), 127, 500, summary_module._SMALL, summary_module._SMALL + 1, 5000, 100_003]:
        values = {
            "lognormal": rng.lognormal(0.0, 2.0, n),
            "ties": rng.integers(0, 4, n) * 0.1,
            "signed": rng.normal(0.0, 1e-3, n),
            "infinities": np.where(rng.random(n) < 0.1, np.inf, rng.random(n)),
            "nan": np.where(rng.random(n) < 0.05, np.nan, rng.random(n)),
        }[kind]
        for qs in [(50.0, 90.0, 95.0, 99.0), (99.0,), (0.0, 100.0, 12.5, 33.3)]:
            with np.errstate(invalid="ignore"):  # inf - inf
                expected = np.percentile(values, qs, method="linear").tolist()
                got = summary_module.percentiles(values, qs)
                in_place = summary_module.percentiles(values.copy(), qs, overwrite_input=True)
            assert got == in_place or np.array_equal(np.array(got), np.array(in_place), equal_nan=True)
            assert np.array_equal(np.array(got), np.array(expected), equal_nan=True), (kind, n, qs, got, expected)


def test_ttft_tpot_itl_of_one_streamed_request() -> None:
    r = rec(arrival=1.0, chunks=[1.5, 1.6, 1.8])
    s = summarize([r], slo=NO_SLO, smooth=SMOOTH)
    assert s.ttft_p50_s == pytest.approx(0.5)
    assert s.tpot_p50_s == pytest.approx((1.8 - 1.5) / 2)
    assert s.itl_mean_s == pytest.approx(0.15)  # gaps 0.1 and 0.2
    assert s.itl_p50_s == pytest.approx(0.15)
    assert s.itl_p99_s == pytest.approx(0.1 + 0.99 * 0.1)
    assert s.p50_s == pytest.approx(0.8)


def test_tpot_excludes_single_token_requests_but_they_pass_a_tpot_slo() -> None:
    single = rec(0, chunks=[0.4])
    multi = rec(1, chunks=[0.2, 0.4, 0.6])  # tpot 0.2
    s = summarize([single, multi], slo=SLOSpec(tpot_s=0.1), smooth=SMOOTH)
    assert s.tpot_p50_s == pytest.approx(0.2)
    assert s.tpot_p99_s == pytest.approx(0.2)  # only one TPOT sample
    # As vllm bench's --goodput: n <= 1 counts as TPOT 0, so it meets the TPOT SLO; the other misses it.
    assert s.slo_attainment == pytest.approx(0.5)


def test_multi_token_chunks_count_all_tokens_for_tpot_and_one_gap_per_chunk_for_itl() -> None:
    r = rec(arrival=0.0, chunks=[0.2, 0.5], tokens=[3, 2])
    assert r.output_tokens == 5
    s = summarize([r], slo=NO_SLO, smooth=SMOOTH)
    assert s.ttft_p50_s == pytest.approx(0.2)
    assert s.tpot_p50_s == pytest.approx(0.3 / 4)
    assert s.itl_p50_s == pytest.approx(0.3)
    assert s.itl_p99_s == pytest.approx(0.3)  # a single ITL sample: one gap between two chunks
    assert s.output_tokens == 5


def test_itl_gaps_never_span_two_requests_and_skip_failed_requests() -> None:
    a = rec(0, arrival=0.0, chunks=[0.1, 0.2])  # gap 0.1
    b = rec(1, arrival=5.0, chunks=[5.1, 5.4])  # gap 0.3; the seam 0.2 -> 5.1 must not count
    broken = rec(2, arrival=0.0, chunks=[0.1, 9.0], end=9.5, status=Status.ERROR)
    s = summarize([a, b, broken], slo=NO_SLO, smooth=SMOOTH)
    assert s.itl_mean_s == pytest.approx(0.2)
    assert s.itl_p99_s == pytest.approx(0.1 + 0.99 * 0.2)


def test_unstreamed_response_arrives_whole_at_its_end() -> None:
    r = rec(arrival=0.0, chunks=None, end=2.0, output_tokens=40)
    s = summarize([r], slo=NO_SLO, smooth=SMOOTH)
    assert s.ttft_p50_s == pytest.approx(2.0)
    assert s.tpot_p50_s == pytest.approx(0.0)
    assert math.isnan(s.itl_p50_s)


# ---------------------------------------------------------------- failures, warm-up, window


def test_failures_are_counted_apart_excluded_from_percentiles_and_in_the_attainment_denominator() -> None:
    ok = [one_token_at(i, 0.0, e2e) for i, e2e in enumerate([0.5, 1.0, 3.0])]
    timeout = rec(10, arrival=0.0, chunks=None, end=30.0, status=Status.TIMEOUT)
    error = rec(11, arrival=0.0, chunks=[0.2], end=0.3, status=Status.ERROR, output_tokens=1)
    rejected = rec(12, arrival=1.0, chunks=None, end=1.0, status=Status.REJECTED)
    s = summarize([*ok, timeout, error, rejected], slo=SLOSpec(e2e_s=1.2), smooth=SMOOTH)
    assert (s.requests, s.completed, s.failed) == (6, 3, 3)
    assert s.failed_by_status == {"timeout": 1, "error": 1, "rejected": 1}
    assert s.p50_s == pytest.approx(1.0)  # of 0.5, 1.0, 3.0 only: the 30 s timeout is not a latency
    assert s.p99_s == pytest.approx(1.0 + 0.98 * 2.0)
    assert s.ttft_p50_s == pytest.approx(1.0)
    assert s.slo_attainment == pytest.approx(2 / 6)
    # T runs from the first arrival (0) to the last end, the timeout's (30 s).
    assert s.window_s == pytest.approx(30.0)
    assert s.goodput_rps == pytest.approx(2 / 30)
    assert s.throughput_rps == pytest.approx(3 / 30)
    assert s.output_tps == pytest.approx(3 / 30)  # output tokens of completed requests only


def test_warmup_records_are_discarded() -> None:
    warm = one_token_at(0, 0.0, 50.0, warmup=True)
    measured = [one_token_at(1, 10.0, 1.0), one_token_at(2, 11.0, 2.0)]
    s = summarize([warm, *measured], slo=SLOSpec(e2e_s=1.5), smooth=SMOOTH)
    assert s.requests == 2
    assert s.p99_s == pytest.approx(1.0 + 0.99 * 1.0)
    assert s.window_s == pytest.approx(13.0 - 10.0)  # the warm-up's arrival at 0 does not stretch T
    assert s.goodput_rps == pytest.approx(1 / 3)


def test_given_window_overrides_the_measured_span_and_must_be_positive() -> None:
    records = [one_token_at(i, float(i), 1.0) for i in range(4)]
    s = summarize(records, slo=SLOSpec(e2e_s=2.0), smooth=SMOOTH, window_s=8.0)
    assert s.window_s == 8.0
    assert s.goodput_rps == pytest.approx(0.5)
    with pytest.raises(ValueError, match="window_s"):
        summarize(records, slo=NO_SLO, smooth=SMOOTH, window_s=0.0)


def test_no_requests_gives_nan_metrics_and_json_null() -> None:
    s = summarize([], slo=SLOSpec(e2e_s=1.0), smooth=SMOOTH)
    assert (s.requests, s.completed, s.failed) == (0, 0, 0)
    for value in (s.p99_s, s.ttft_p99_s, s.goodput_rps, s.slo_attainment, s.smooth_goodput, s.window_s):
        assert math.isnan(value)
    d = s.to_dict()
    assert d["p99_s"] is None and d["goodput_rps"] is None
    json.dumps(d, allow_nan=False)


# ---------------------------------------------------------------- SLOs, goodput, attainment


def test_goodput_eq1_counts_completions_within_the_e2e_slo_per_second() -> None:
    e2es = [0.4, 0.9, 1.2, 1.3, 2.5]
    records = [one_token_at(i, float(i), e2e) for i, e2e in enumerate(e2es)]
    s = summarize(records, slo=SLOSpec(e2e_s=1.2), smooth=SMOOTH, window_s=10.0)
    assert s.goodput_rps == pytest.approx(3 / 10)  # 0.4, 0.9 and 1.2 (<= is inclusive)
    assert s.slo_attainment == pytest.approx(3 / 5)


def test_goodput_needs_every_slo_given_as_vllm_bench_goodput() -> None:
    slow_first_token = rec(0, chunks=[0.8, 0.9])  # e2e 0.9 ok, TTFT 0.8 > 0.5
    fine = rec(1, chunks=[0.1, 0.2])
    s = summarize([slow_first_token, fine], slo=SLOSpec(e2e_s=1.0, ttft_s=0.5), smooth=SMOOTH, window_s=1.0)
    # `vllm bench serve --goodput e2el:1000 ttft:500`: a request is good only if every SLO given holds.
    assert s.goodput_rps == pytest.approx(1.0)
    assert s.slo_attainment == pytest.approx(0.5)
    assert s.token_goodput_tps == pytest.approx(2.0)  # only the attained request's 2 tokens


def test_smooth_goodput_default_deadline_is_the_papers_i_over_v() -> None:
    # Paper 003 eq. 4 with V = 2 tokens/s and no first-token allowance: token i is due at a + i/2.
    smooth = SmoothGoodputSpec(alpha=2.0, reading_speed_tps=2.0, penalty="linear")
    assert smooth.ttft_allow_s is None and smooth.first_token_due_s == pytest.approx(0.5)
    # Tokens at 0.4, 1.0, 2.5 s after arrival: due at 0.5, 1.0, 1.5; the third is 1.0 s late.
    r = rec(0, chunks=[0.4, 1.0, 2.5])
    assert idle_latency_s(r, smooth) == pytest.approx(1.0)
    assert benefit(r, smooth) == pytest.approx(3 - 2.0 * 1.0)
    # The allowance stays an option: a first token due 1 s after arrival shifts every deadline by 0.5 s.
    allowed = SmoothGoodputSpec(alpha=2.0, reading_speed_tps=2.0, ttft_allow_s=1.0, penalty="linear")
    assert idle_latency_s(r, allowed) == pytest.approx(0.5)


@pytest.mark.parametrize("spec", [SMOOTH, SmoothGoodputSpec(reading_speed_tps=7.3, ttft_allow_s=0.37)])
def test_chunk_due_times_equal_token_due_s_to_the_bit(spec: SmoothGoodputSpec) -> None:
    # outcomes' per-chunk pass adds the per-request part once and divides in place; token_due_s is the definition.
    rng = np.random.default_rng(7)
    counts = rng.integers(1, 400, size=300)
    arrival = rng.uniform(0.0, 5e4, size=300) * rng.choice([1.0, 1e-3, 1e3], size=300)
    before = np.concatenate([np.sort(rng.integers(0, 5000, size=c)) for c in counts])
    expected = smooth_goodput.token_due_s(np.repeat(arrival, counts), before, spec)
    got = smooth_goodput.chunk_due_s(arrival, counts, before.astype(np.float64), spec)
    assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("spec", [SMOOTH, SmoothGoodputSpec(reading_speed_tps=7.3, ttft_allow_s=0.37)])
def test_one_token_chunks_judged_as_chunks_of_one_token_each(spec: SmoothGoodputSpec) -> None:
    # The lateness pass for records without chunk sizes (one token a chunk: positions from an arange) against
    # the sized pass (positions from the sizes' running sum) given sizes of 1: the same doubles.
    rng = np.random.default_rng(3)
    plain, sized = [], []
    for i in range(500):
        n = int(rng.integers(1, 600))
        arrival = float(rng.uniform(0.0, 3e4))
        times = arrival + np.cumsum(rng.exponential(0.05, size=n)) * rng.choice([0.2, 1.0, 8.0])
        plain.append(rec(i, chunks=times, arrival=arrival))
        sized.append(rec(i, chunks=times, tokens=[1] * n, arrival=arrival))
    got = compute_outcomes(plain, fallback_slo=NO_SLO, smooth=spec)
    expected = compute_outcomes(sized, fallback_slo=NO_SLO, smooth=spec)
    for name in ("idle_s", "benefit", "ttft_s", "tpot_s"):
        assert getattr(got, name).tobytes() == getattr(expected, name).tobytes(), name


def test_chunk_positions_are_an_arange_as_the_table_grows() -> None:
    for n in (0, 3, 70_000, 10, 300_000, 5):
        positions = outcomes._chunk_positions(n)
        assert positions.tobytes() == np.arange(n, dtype=np.float64).tobytes()
        assert not positions.flags.writeable  # shared by every batch: nobody may write into it


def test_goodput_without_an_e2e_slo_uses_the_other_slos() -> None:
    slow_first_token = rec(0, chunks=[0.8, 0.9])
    fine = rec(1, chunks=[0.1, 0.2])
    s = summarize([slow_first_token, fine], slo=SLOSpec(ttft_s=0.5), smooth=SMOOTH, window_s=1.0)
    assert s.goodput_rps == pytest.approx(1.0)
    # No SLO at all: every completed request is good (nothing it could miss).
    s = summarize([slow_first_token, fine], slo=NO_SLO, smooth=SMOOTH, window_s=1.0)
    assert s.goodput_rps == pytest.approx(2.0)
    assert s.slo_attainment == pytest.approx(1.0)


def test_per_task_slos_override_the_run_slo_and_give_per_task_summaries() -> None:
    tight = RequestSLO(e2e_s=0.5)
    chat = [one_token_at(i, 0.0, e2e, task="chat", slo=tight) for i, e2e in enumerate([0.4, 0.6])]
    # "batch" records carry no SLO of their own: the run SLO (2 s) applies.
    batch = [one_token_at(10 + i, 0.0, e2e, task="batch") for i, e2e in enumerate([0.6, 1.5, 3.0])]
    s = summarize([*chat, *batch], slo=SLOSpec(e2e_s=2.0), smooth=SMOOTH, window_s=4.0)
    assert s.slo_attainment == pytest.approx(3 / 5)  # 0.4 (chat), 0.6 and 1.5 (batch)
    assert s.goodput_rps == pytest.approx(3 / 4)
    chat_s, batch_s = s.per_task["chat"], s.per_task["batch"]
    assert (chat_s.requests, chat_s.slo_attainment, chat_s.goodput_rps) == (2, 0.5, pytest.approx(0.25))
    assert batch_s.requests == 3
    assert batch_s.slo_attainment == pytest.approx(2 / 3)
    assert batch_s.goodput_rps == pytest.approx(0.5)
    assert batch_s.p99_s == pytest.approx(1.5 + 0.98 * 1.5)
    assert chat_s.goodput_rps + batch_s.goodput_rps == pytest.approx(s.goodput_rps)


def test_a_record_slo_with_any_field_set_is_used_as_is_without_merging() -> None:
    ttft_only = RequestSLO(ttft_s=0.5)
    r = one_token_at(0, 0.0, 3.0, slo=ttft_only)  # TTFT 3.0 > 0.5
    s = summarize([r], slo=SLOSpec(e2e_s=10.0), smooth=SMOOTH)
    assert s.slo_attainment == 0.0
    # Merged with the run's e2e SLO it would count as good (3.0 <= 10); as is, TTFT decides.
    assert s.goodput_rps == 0.0


def test_token_goodput_sums_output_tokens_of_attaining_requests() -> None:
    quick = rec(0, chunks=[0.1, 0.2, 0.3], tokens=[4, 4, 2])  # 10 tokens, e2e 0.3
    slow = rec(1, chunks=[0.5, 2.0], tokens=[10, 10])  # 20 tokens, e2e 2.0
    s = summarize([quick, slow], slo=SLOSpec(e2e_s=1.0), smooth=SMOOTH, window_s=5.0)
    assert s.token_goodput_tps == pytest.approx(10 / 5)
    assert s.output_tps == pytest.approx(30 / 5)


def test_cv_of_completion_time_over_slo() -> None:
    slo = RequestSLO(e2e_s=2.0)
    records = [one_token_at(i, 0.0, e2e, slo=slo) for i, e2e in enumerate([1.0, 2.0, 3.0])]
    failed = rec(9, chunks=None, end=60.0, status=Status.TIMEOUT, slo=slo)
    s = summarize([*records, failed], slo=NO_SLO, smooth=SMOOTH)
    # ratios 0.5, 1.0, 1.5: mean 1, population std sqrt(1/6)
    assert s.cv_completion_over_slo == pytest.approx(math.sqrt(1 / 6))
    assert math.isnan(summarize(records[:1], slo=NO_SLO, smooth=SMOOTH).cv_completion_over_slo)


# ---------------------------------------------------------------- smooth goodput (paper 003)

# V = 2 tokens/s, 1 s first-token allowance, alpha = 2 tokens per idle second.
HAND = SmoothGoodputSpec(alpha=2.0, reading_speed_tps=2.0, ttft_allow_s=1.0, penalty="linear")


def hand_record() -> RequestRecord:
    # Tokens 1..4 due at 1.0, 1.5, 2.0, 2.5; delivered at 0.5, 2.0, 2.2, 2.2 (tokens 3-4 share a chunk).
    # Lateness -0.5, 0.5, 0.2, -0.3: the reader sat idle 0.5 s waiting for token 2.
    return rec(arrival=0.0, chunks=[0.5, 2.0, 2.2], tokens=[1, 1, 2])


def test_idle_latency_and_benefit_by_hand() -> None:
    r = hand_record()
    assert idle_latency_s(r, HAND) == pytest.approx(0.5)
    assert benefit(r, HAND) == pytest.approx(4 - 2 * 0.5)
    s = summarize([r], slo=NO_SLO, smooth=HAND, window_s=2.0)
    assert s.smooth_goodput == pytest.approx(3.0 / 2.0)
    assert s.mean_idle_latency_s == pytest.approx(0.5)
    assert (s.smooth_alpha, s.smooth_reading_speed_tps, s.smooth_ttft_allow_s, s.smooth_penalty) == (
        2.0,
        2.0,
        1.0,
        "linear",
    )


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("linear", 4 - 2 * 0.5), ("quadratic", 4 - 2 * 0.25), ("log1p", 4 - 2 * math.log1p(0.5))],
)
def test_penalty_shapes(kind: str, expected: float) -> None:
    smooth = HAND.model_copy(update={"penalty": kind})
    assert benefit(hand_record(), smooth) == pytest.approx(expected)


def test_on_time_request_keeps_its_full_benefit() -> None:
    # 10 tokens at 10 tok/s from t=0.5: always ahead of a 2 tok/s reader with a 1 s allowance.
    r = rec(chunks=0.5 + 0.1 * np.arange(10))
    assert idle_latency_s(r, HAND) == 0.0
    assert benefit(r, HAND) == pytest.approx(10.0)


def test_stall_hidden_by_tokens_already_ahead_of_the_reader_costs_nothing() -> None:
    # 40 tokens in the first 0.2 s, then a 1.8 s stall, then 10 more. At 20 tok/s with 1 s allowance,
    # token 41 is due at 1 + 40/20 = 3.0 s; it arrives at 2.0 s, so the reader never waits.
    smooth = SmoothGoodputSpec(alpha=5.0, reading_speed_tps=20.0, ttft_allow_s=1.0)
    times = np.concatenate([np.linspace(0.1, 0.2, 40), 2.0 + 0.01 * np.arange(10)])
    r = rec(chunks=times)
    assert np.diff(times).max() == pytest.approx(1.8)  # a TBT view sees a bad stall
    assert idle_latency_s(r, smooth) == 0.0
    assert benefit(r, smooth) == pytest.approx(50.0)


def paced_release(times: np.ndarray, gap_s: float) -> np.ndarray:
    """The output-delay trick (paper 003 sec. 3.4): buffer tokens and release them so that no two are more
    than gap_s apart, never before they were generated: t'_i = max_{j >= i} (t_j - (j - i) * gap_s)."""
    idx = np.arange(len(times))
    shifted = times - (len(times) - 1 - idx) * gap_s  # t_j - (n-1-j) gap, then a suffix max
    suffix_max = np.maximum.accumulate(shifted[::-1])[::-1]
    return suffix_max + (len(times) - 1 - idx) * gap_s


def test_output_delay_trick_improves_tbt_but_never_smooth_goodput() -> None:
    smooth = SmoothGoodputSpec(alpha=5.0, reading_speed_tps=20.0, ttft_allow_s=1.0)
    # 20 tokens every 20 ms from 0.3 s, a 2.5 s stall, then 30 tokens every 20 ms.
    times = np.concatenate([0.3 + 0.02 * np.arange(20), 3.2 + 0.02 * np.arange(30)])
    delayed = paced_release(times, gap_s=0.1)
    assert np.all(delayed >= times) and delayed[-1] == pytest.approx(times[-1])
    original, buffered = rec(0, chunks=times), rec(1, chunks=delayed)

    before = summarize([original], slo=SLOSpec(tpot_s=0.1), smooth=smooth, window_s=4.0)
    after = summarize([buffered], slo=SLOSpec(tpot_s=0.1), smooth=smooth, window_s=4.0)
    # A max-TBT view rewards the trick: the 2.5 s stall is gone, every gap is now <= 0.1 s.
    assert np.diff(times).max() > 2.0
    assert np.diff(delayed).max() <= 0.1 + 1e-9
    assert after.itl_p99_s < before.itl_p99_s
    assert after.p50_s == pytest.approx(before.p50_s)  # same e2e: the trick costs nothing there
    # The reader does not gain: tokens arrive no earlier, so idle latency cannot shrink.
    assert idle_latency_s(buffered, smooth) >= idle_latency_s(original, smooth) > 0
    assert after.smooth_goodput <= before.smooth_goodput


def test_delaying_any_tokens_never_raises_benefit() -> None:
    rng = np.random.default_rng(7)
    smooth = SmoothGoodputSpec(alpha=5.0, reading_speed_tps=10.0, ttft_allow_s=0.5)
    for _ in range(200):
        n = int(rng.integers(1, 60))
        times = np.sort(rng.uniform(0.0, 8.0, n))
        # Delay a random subset, keeping the stream in order (a buffer releases in order).
        delays = np.where(rng.random(n) < 0.3, rng.exponential(1.0, n), 0.0)
        delayed = np.maximum.accumulate(times + delays)
        assert benefit(rec(chunks=delayed), smooth) <= benefit(rec(chunks=times), smooth) + 1e-9


def test_chunk_start_shortcut_equals_the_per_token_definition() -> None:
    rng = np.random.default_rng(3)
    smooth = SmoothGoodputSpec(alpha=3.0, reading_speed_tps=15.0, ttft_allow_s=0.8)
    records = []
    for i in range(300):
        chunks = int(rng.integers(1, 30))
        arrival = float(rng.uniform(0, 5))
        times = arrival + np.sort(rng.uniform(0.05, 6.0, chunks))
        tokens = rng.integers(1, 5, chunks) if i % 2 else None
        records.append(rec(i, arrival=arrival, chunks=times, tokens=None if tokens is None else list(tokens)))
    got = compute_outcomes(records, fallback_slo=NO_SLO, smooth=smooth).idle_s
    for r, idle in zip(records, got, strict=True):
        t = r.token_times()
        deadlines = r.arrival_s + smooth.ttft_allow_s + np.arange(len(t)) / smooth.reading_speed_tps
        assert idle == pytest.approx(max(0.0, float(np.max(t - deadlines))))


def test_batching_of_chunk_arrays_does_not_change_results(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    records = []
    for i in range(50):
        chunks = int(rng.integers(1, 12))
        times = float(i) + np.sort(rng.uniform(0.05, 3.0, chunks))
        tokens = list(rng.integers(1, 4, chunks)) if i % 3 == 0 else None
        status = Status.ERROR if i % 7 == 0 else Status.OK
        records.append(rec(i, arrival=float(i), chunks=times, tokens=tokens, status=status, end=times[-1]))
    whole = summarize(records, slo=SLOSpec(e2e_s=2.0), smooth=SMOOTH).to_dict()
    monkeypatch.setattr(outcomes, "_CHUNK_BATCH", 7)
    batched = summarize(records, slo=SLOSpec(e2e_s=2.0), smooth=SMOOTH).to_dict()
    assert_close(batched, whole)


def assert_close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in got.items():
        if isinstance(value, dict):
            assert_close(value, want[key])
        elif isinstance(value, float):
            assert value == pytest.approx(want[key]), key
        else:
            assert value == want[key], key


def test_failed_requests_in_smooth_goodput() -> None:
    smooth = SmoothGoodputSpec(alpha=2.0, reading_speed_tps=2.0, ttft_allow_s=1.0)
    # Rejected at once: the reader waited for nothing, no tokens, no benefit.
    rejected = rec(0, arrival=0.0, chunks=None, end=0.0, status=Status.REJECTED)
    assert benefit(rejected, smooth) == 0.0
    # Timed out after 5 s with no token: waited for token 1 (due 1.0) until 5.0, idle 4 s.
    timeout = rec(1, arrival=0.0, chunks=None, end=5.0, status=Status.TIMEOUT)
    assert idle_latency_s(timeout, smooth) == pytest.approx(4.0)
    assert benefit(timeout, smooth) == pytest.approx(-8.0)
    # Broke after delivering 3 on-time tokens (due 1.0, 1.5, 2.0); token 4 was due 2.5, error at 3.0.
    broken = rec(2, arrival=0.0, chunks=[0.5, 1.0, 1.5], end=3.0, status=Status.ERROR, output_tokens=3)
    assert idle_latency_s(broken, smooth) == pytest.approx(0.5)
    assert benefit(broken, smooth) == pytest.approx(3 - 2 * 0.5)
    # A failure that never ended (no end time, no token): nothing to judge.
    lost = rec(3, arrival=0.0, chunks=None, end=None, status=Status.CANCELLED)
    assert math.isnan(idle_latency_s(lost, smooth))
    assert benefit(lost, smooth) == 0.0
    s = summarize([rejected, timeout, broken, lost], slo=NO_SLO, smooth=smooth, window_s=10.0)
    assert s.smooth_goodput == pytest.approx((0 - 8 + 2 + 0) / 10)
    assert s.mean_idle_latency_s == pytest.approx((0 + 4 + 0.5) / 3)


def test_dropping_a_late_request_is_not_better_than_finishing_it_at_the_same_moment() -> None:
    # Paper 003 sec. 4.1: plain goodput rewards abandoning requests that already missed their SLO.
    smooth = SmoothGoodputSpec(alpha=5.0, reading_speed_tps=20.0, ttft_allow_s=1.0)
    finished = rec(0, arrival=0.0, chunks=4.0 + 0.01 * np.arange(20))
    dropped = rec(1, arrival=0.0, chunks=None, end=4.0, status=Status.TIMEOUT)
    assert benefit(finished, smooth) > benefit(dropped, smooth)


def test_unknown_penalty_is_refused() -> None:
    with pytest.raises(ValueError, match="penalty"):
        smooth_goodput.penalty(np.array([1.0]), "cubic")


# ---------------------------------------------------------------- output shape and speed


def test_to_dict_has_unit_suffixed_keys_and_is_json_ready() -> None:
    s = summarize([hand_record()], slo=SLOSpec(e2e_s=5.0), smooth=HAND)
    d = s.to_dict()
    for key in (
        "requests",
        "completed",
        "failed",
        "failed_by_status",
        "window_s",
        "p50_s",
        "p99_s",
        "mean_s",
        "ttft_p99_s",
        "tpot_p99_s",
        "itl_p99_s",
        "goodput_rps",
        "slo_attainment",
        "token_goodput_tps",
        "smooth_goodput",
        "smooth_alpha",
        "smooth_reading_speed_tps",
        "smooth_ttft_allow_s",
        "smooth_penalty",
        "throughput_rps",
        "output_tps",
        "cv_completion_over_slo",
        "mean_idle_latency_s",
        "per_task",
    ):
        assert key in d, key
    assert set(d["per_task"]["default"]) >= {"requests", "p99_s", "slo_attainment", "goodput_rps"}
    json.dumps(d, allow_nan=False)


def test_summarize_100k_simulator_like_records_smoke() -> None:
    """Speed smoke, not a timing assert: 100k records x 200 chunks held as views of one buffer."""
    n, k = 100_000, 200
    rng = np.random.default_rng(0)
    arrivals = np.arange(n) * 0.01
    buffer = arrivals[:, None] + np.cumsum(rng.exponential(0.01, size=(n, k)), axis=1)
    slo = RequestSLO()
    records = [
        RequestRecord(
            request_id=i,
            task="chat" if i % 3 else "code",
            slo=slo,
            prompt_tokens=100,
            max_tokens=k,
            scheduled_s=float(arrivals[i]),
            arrival_s=float(arrivals[i]),
            end_s=float(buffer[i, -1]),
            output_tokens=k,
            chunk_times=buffer[i],
        )
        for i in range(n)
    ]
    start = time.perf_counter()
    s = summarize(records, slo=SLOSpec(e2e_s=2.5), smooth=SMOOTH)
    elapsed = time.perf_counter() - start
    print(f"summarize: {n} records x {k} chunks in {elapsed:.2f} s")
    assert s.completed == n
    assert s.itl_mean_s == pytest.approx(0.01, rel=0.01)
    assert s.tpot_mean_s == pytest.approx(0.01, rel=0.01)


@pytest.mark.parametrize("kind", ["linear", "quadratic", "log1p"])
def test_idle_and_benefit_all_ok_shortcut_equals_the_general_rules_to_the_bit(kind: str) -> None:
    # compute_outcomes passes all_ok=True for a batch where every request completed (the usual live-window
    # batch); the shortcut must give the general path's doubles, NaN lateness (no token seen) included.
    rng = np.random.default_rng(7)
    n = 300
    max_late = rng.normal(0.0, 2.0, n)
    max_late[rng.random(n) < 0.1] = math.nan
    arrival = rng.random(n) * 10.0
    end = arrival + rng.random(n) * 5.0
    out_tok = rng.integers(0, 50, n)
    delivered = out_tok.copy()
    ok = np.ones(n, dtype=bool)
    spec = SmoothGoodputSpec(alpha=1.5, penalty=kind)
    general = smooth_goodput.idle_and_benefit(max_late, ok, arrival, end, out_tok, delivered, spec)
    shortcut = smooth_goodput.idle_and_benefit(max_late, ok, arrival, end, out_tok, delivered, spec, all_ok=True)
    for a, b in zip(general, shortcut, strict=True):
        assert a.dtype == b.dtype
        assert a.tobytes() == b.tobytes()


def test_a_batch_mixing_records_with_and_without_chunks_and_slos_is_judged_as_one_by_one() -> None:
    # compute_outcomes takes shortcuts when every record has chunks, all completed or one SLO applies; a mixed
    # batch must give each record the columns it gets judged alone.
    slo_a = RequestSLO(e2e_s=2.0)
    records = [
        RequestRecord(0, "a", slo_a, 5, 8, 0.0, 0.0, end_s=1.5, output_tokens=3, chunk_times=np.array([0.5, 1.0, 1.5])),
        RequestRecord(1, "b", RequestSLO(), 5, 8, 0.1, 0.1, Status.ERROR, end_s=0.9, output_tokens=0),
        RequestRecord(2, "a", slo_a, 5, 8, 0.2, 0.2, end_s=3.0, output_tokens=4),
        RequestRecord(3, "b", RequestSLO(ttft_s=0.1), 5, 8, 0.3, 0.3, Status.TIMEOUT),
        RequestRecord(4, "a", slo_a, 5, 8, 0.4, 0.4, end_s=1.0, output_tokens=2, chunk_times=np.array([0.6, 1.0])),
    ]
    slo = SLOSpec(e2e_s=1.0, ttft_s=0.5)
    whole = compute_outcomes(records, fallback_slo=slo, smooth=SMOOTH)
    for i, rec in enumerate(records):
        alone = compute_outcomes([rec], fallback_slo=slo, smooth=SMOOTH)
        for name in outcomes._PER_REQUEST_COLUMNS:
            assert getattr(whole, name)[i : i + 1].tobytes() == getattr(alone, name).tobytes(), name
        assert whole.task_names[whole.task_code[i]] == alone.task_names[alone.task_code[0]]
