"""/metrics reader, on text captured from a real vLLM 0.32 CPU server (tiny model, self-draft speculation).

tests/data/vllm_metrics.txt was captured after ~80 streamed requests of 64 tokens with
`--speculative-config '{"model": <the target itself>, "num_speculative_tokens": 4}'`.
"""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import pytest

from core.serve.prom import Histogram, MetricsUnavailable, fetch_metrics, parse_metrics
from tests.fakeserver import FakeOpenAIServer

CAPTURED = (Path(__file__).parent / "data" / "vllm_metrics.txt").read_text()


def wire_value(text: str, line_start: str) -> float:
    """The value of the first sample line that starts with `line_start` (an independent reading)."""
    line = next(line for line in text.splitlines() if line.startswith(line_start))
    return float(line.rsplit(" ", 1)[1])


def test_captured_vllm_metrics_parse_into_the_snapshot() -> None:
    metrics = parse_metrics(CAPTURED)

    assert metrics.running == wire_value(CAPTURED, "vllm:num_requests_running{")
    assert metrics.waiting == wire_value(CAPTURED, "vllm:num_requests_waiting{")
    assert metrics.kv_usage == wire_value(CAPTURED, "vllm:kv_cache_usage_perc{")
    assert metrics.preemptions_total == wire_value(CAPTURED, "vllm:num_preemptions_total{")
    assert metrics.generation_tokens_total == wire_value(CAPTURED, "vllm:generation_tokens_total{")
    assert metrics.prompt_tokens_total == wire_value(CAPTURED, "vllm:prompt_tokens_total{")
    assert metrics.generation_tokens_total and metrics.generation_tokens_total > 0


def test_speculative_decoding_acceptance_from_captured_counters() -> None:
    metrics = parse_metrics(CAPTURED)
    drafts = wire_value(CAPTURED, "vllm:spec_decode_num_drafts_total{")
    draft_tokens = wire_value(CAPTURED, "vllm:spec_decode_num_draft_tokens_total{")
    accepted = wire_value(CAPTURED, "vllm:spec_decode_num_accepted_tokens_total{")

    assert metrics.spec_drafts_total == drafts
    assert metrics.spec_draft_tokens_total == draft_tokens == 4 * drafts  # num_speculative_tokens 4
    assert metrics.spec_accepted_tokens_total == accepted  # not the per-position counter
    assert metrics.spec_acceptance_rate == pytest.approx(accepted / draft_tokens)
    assert metrics.spec_mean_acceptance_length == pytest.approx(1 + accepted / drafts)
    assert 1.0 <= metrics.spec_mean_acceptance_length <= 5.0


def test_captured_histograms_have_buckets_sum_and_count() -> None:
    metrics = parse_metrics(CAPTURED)
    for histogram, name in (
        (metrics.e2e_latency_s, "vllm:e2e_request_latency_seconds"),
        (metrics.ttft_s, "vllm:time_to_first_token_seconds"),
        (metrics.inter_token_latency_s, "vllm:inter_token_latency_seconds"),
    ):
        assert histogram is not None
        assert math.isinf(histogram.upper_bounds[-1])
        assert list(histogram.upper_bounds) == sorted(histogram.upper_bounds)
        assert list(histogram.cumulative_counts) == sorted(histogram.cumulative_counts)
        assert histogram.count == wire_value(CAPTURED, f"{name}_count{{")
        assert histogram.sum == wire_value(CAPTURED, f"{name}_sum{{")
        assert histogram.cumulative_counts[-1] == histogram.count
    assert metrics.ttft_s is not None and 0.001 in metrics.ttft_s.upper_bounds
    assert metrics.e2e_latency_s is not None and metrics.e2e_latency_s.mean is not None


def test_series_are_summed_over_engines_and_models() -> None:
    two_engines = """\
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.7
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="1",model_name="m"} 50.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="1.0",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 3.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 2.5
vllm:e2e_request_latency_seconds_sum{engine="1",model_name="m"} 1.5
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_count{engine="1",model_name="m"} 3.0
"""
    metrics = parse_metrics(two_engines)

    assert metrics.running == 5
    assert metrics.generation_tokens_total == 150
    assert metrics.kv_usage == pytest.approx(0.6)  # a fraction: the engines' mean, not their sum
    assert metrics.e2e_latency_s == Histogram((1.0, math.inf), (4.0, 5.0), 4.0, 5.0)


def test_legacy_gpu_cache_usage_name_is_read() -> None:
    assert parse_metrics('vllm:gpu_cache_usage_perc{model_name="m"} 0.25\n').kv_usage == 0.25


def test_missing_metrics_are_none() -> None:
    metrics = parse_metrics("# a server with other metrics only\nprocess_cpu_seconds_total 12.0\n")

    assert metrics.running is None and metrics.kv_usage is None
    assert metrics.spec_drafts_total is None
    assert metrics.spec_acceptance_rate is None and metrics.spec_mean_acceptance_length is None
    assert metrics.e2e_latency_s is None and metrics.ttft_s is None
    sample = metrics.to_engine_sample(1.5)
    assert (sample.time_s, sample.running, sample.waiting, sample.kv_usage) == (1.5, 0, 0, 0.0)
    assert sample.spec_draft_tokens_total is None


def test_engine_sample_carries_counters_and_acceptance() -> None:
    metrics = parse_metrics(CAPTURED)
    sample = metrics.to_engine_sample(2.0)

    assert sample.time_s == 2.0
    assert sample.generated_tokens_total == int(metrics.generation_tokens_total or 0)
    assert sample.spec_draft_tokens_total == int(metrics.spec_draft_tokens_total or 0)
    assert sample.spec_accepted_tokens_total == int(metrics.spec_accepted_tokens_total or 0)
    assert sample.extra is not None
    assert sample.extra["spec_mean_acceptance_length"] == pytest.approx(metrics.spec_mean_acceptance_length)


def test_since_gives_what_happened_between_two_snapshots() -> None:
    before = parse_metrics(
        'vllm:generation_tokens_total{model_name="m"} 100\nvllm:num_requests_running{model_name="m"} 4\n'
        'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 1\n'
        'vllm:time_to_first_token_seconds_sum{model_name="m"} 0.05\n'
        'vllm:time_to_first_token_seconds_count{model_name="m"} 1\n'
    )
    after = parse_metrics(
        'vllm:generation_tokens_total{model_name="m"} 164\nvllm:num_requests_running{model_name="m"} 1\n'
        'vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 2\n'
        'vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4\n'
        'vllm:time_to_first_token_seconds_sum{model_name="m"} 1.05\n'
        'vllm:time_to_first_token_seconds_count{model_name="m"} 4\n'
    )
    during = after.since(before)

    assert during.generation_tokens_total == 64
    assert during.running == 1  # gauges are not differenced
    assert during.ttft_s == Histogram((0.1, math.inf), (1.0, 3.0), pytest.approx(1.0), 3.0)


def test_histogram_quantile_and_bucket_resolution() -> None:
    histogram = Histogram(upper_bounds=(0.1, 0.2, 0.5, math.inf), cumulative_counts=(0, 4, 8, 10), sum=3.0, count=10)

    assert histogram.quantile(0.2) == pytest.approx(0.15)  # 2 of the 4 in (0.1, 0.2]: half-way
    assert histogram.quantile(0.5) == pytest.approx(0.275)
    assert histogram.quantile(1.0) == 0.5  # the +Inf bucket reports its lower bound, as Prometheus does
    assert histogram.count_at_most(0.2) == 4
    assert histogram.bucket_of(0.15) == (0.1, 0.2)
    assert histogram.bucket_of(0.2) == (0.1, 0.2)
    assert histogram.bucket_of(9.0) == (0.5, math.inf)
    assert histogram.mean == pytest.approx(0.3)
    assert Histogram((math.inf,), (0,), 0.0, 0).quantile(0.5) is None
    with pytest.raises(ValueError, match="different buckets"):
        histogram.since(Histogram((1.0, math.inf), (0, 0), 0.0, 0))


async def test_fetch_metrics_reads_a_server_and_reports_absence() -> None:
    async with FakeOpenAIServer(metrics_text=CAPTURED) as server, httpx.AsyncClient() as http:
        metrics = await fetch_metrics(http, server.base_url)
    assert metrics == parse_metrics(CAPTURED)

    async with FakeOpenAIServer(metrics_text=None) as server, httpx.AsyncClient() as http:
        with pytest.raises(MetricsUnavailable, match="HTTP 404"):
            await fetch_metrics(http, server.base_url)
        url = server.base_url
    async with httpx.AsyncClient() as http:
        with pytest.raises(MetricsUnavailable, match=r"cannot read .*ConnectError"):
            await fetch_metrics(http, url)
