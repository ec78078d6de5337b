"""Read a vLLM server's Prometheus `/metrics` into a typed snapshot.

The text is parsed with prometheus_client's own parser. Samples are indexed by their wire name
(`vllm:generation_tokens_total`, `vllm:e2e_request_latency_seconds_bucket`, ...) rather than by family
name, because the parser renames counter families (it strips `_total`) and vLLM declares some counters
with the suffix in the TYPE line and some without.

vLLM labels every series with `model_name` and `engine` (one per data-parallel engine); a snapshot sums
over label sets so it describes the whole server. Any metric the server does not expose is None: older
vLLMs, servers without speculative decoding and non-vLLM OpenAI servers all differ.

Counters and histograms are cumulative since the server started; use `VllmMetrics.since(earlier)` to get
what happened during a run (for example to compare the client's measured latencies with the server's own
histograms on the same requests).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass, replace

import httpx
from prometheus_client.parser import text_string_to_metric_families

from core.backend_api import EngineSample

# Wire names. Each tuple lists the current name first, then names older vLLMs used for the same thing.
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREEMPTIONS = ("vllm:num_preemptions_total",)
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
SPEC_DRAFTS = ("vllm:spec_decode_num_drafts_total",)
SPEC_DRAFT_TOKENS = ("vllm:spec_decode_num_draft_tokens_total",)
SPEC_ACCEPTED_TOKENS = ("vllm:spec_decode_num_accepted_tokens_total",)
E2E_LATENCY = ("vllm:e2e_request_latency_seconds",)
TTFT = ("vllm:time_to_first_token_seconds",)
INTER_TOKEN_LATENCY = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")

_GAUGES_AND_COUNTERS = (
    *RUNNING,
    *WAITING,
    *KV_USAGE,
    *PREEMPTIONS,
    *GENERATION_TOKENS,
    *PROMPT_TOKENS,
    *SPEC_DRAFTS,
    *SPEC_DRAFT_TOKENS,
    *SPEC_ACCEPTED_TOKENS,
)
_HISTOGRAMS = (*E2E_LATENCY, *TTFT, *INTER_TOKEN_LATENCY)
KNOWN_SAMPLE_NAMES = frozenset(
    [*_GAUGES_AND_COUNTERS] + [f"{name}{suffix}" for name in _HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")]
)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram: cumulative bucket counts by upper bound, plus sum and count.

    `upper_bounds` is sorted and ends with +inf; `cumulative_counts[i]` counts observations <= bound i.
    """

    upper_bounds: tuple[float, ...]
    cumulative_counts: tuple[float, ...]
    sum: float
    count: float

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def since(self, earlier: Histogram | None) -> Histogram:
        """Observations made after `earlier` was taken (same server, same buckets)."""
        if earlier is None:
            return self
        if earlier.upper_bounds != self.upper_bounds:
            raise ValueError("histograms have different buckets; were they read from the same server?")
        counts = tuple(a - b for a, b in zip(self.cumulative_counts, earlier.cumulative_counts, strict=True))
        return Histogram(self.upper_bounds, counts, self.sum - earlier.sum, self.count - earlier.count)

    def count_at_most(self, value: float) -> float:
        """Observations <= the smallest bucket bound that is >= value (exact only at bucket bounds)."""
        index = bisect.bisect_left(self.upper_bounds, value)
        return self.cumulative_counts[min(index, len(self.upper_bounds) - 1)]

    def bucket_of(self, value: float) -> tuple[float, float]:
        """(lower, upper] bounds of the bucket a value falls in: the histogram's resolution there."""
        index = min(bisect.bisect_left(self.upper_bounds, value), len(self.upper_bounds) - 1)
        lower = self.upper_bounds[index - 1] if index > 0 else 0.0
        return lower, self.upper_bounds[index]

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear interpolation inside the bucket holding the quantile."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        total = self.cumulative_counts[-1] if self.cumulative_counts else 0.0
        if total <= 0:
            return None
        rank = q * total
        index = bisect.bisect_left(self.cumulative_counts, rank)
        index = min(index, len(self.upper_bounds) - 1)
        upper = self.upper_bounds[index]
        lower = self.upper_bounds[index - 1] if index > 0 else 0.0
        if math.isinf(upper):
            return lower  # like Prometheus: the +Inf bucket has no width to interpolate in
        below = self.cumulative_counts[index - 1] if index > 0 else 0.0
        in_bucket = self.cumulative_counts[index] - below
        if in_bucket <= 0:
            return upper
        return lower + (upper - lower) * (rank - below) / in_bucket


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    """One /metrics snapshot. Gauges are current values; counters and histograms are cumulative."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None  # 0..1
    preemptions_total: float | None = None
    generation_tokens_total: float | None = None
    prompt_tokens_total: float | None = None
    spec_drafts_total: float | None = None
    spec_draft_tokens_total: float | None = None
    spec_accepted_tokens_total: float | None = None
    e2e_latency_s: Histogram | None = None
    ttft_s: Histogram | None = None
    inter_token_latency_s: Histogram | None = None

    @property
    def spec_acceptance_rate(self) -> float | None:
        """Accepted draft tokens / proposed draft tokens."""
        if not self.spec_draft_tokens_total or self.spec_accepted_tokens_total is None:
            return None
        return self.spec_accepted_tokens_total / self.spec_draft_tokens_total

    @property
    def spec_mean_acceptance_length(self) -> float | None:
        """Tokens produced per verification step: 1 + accepted / drafts (vLLM's own definition)."""
        if not self.spec_drafts_total or self.spec_accepted_tokens_total is None:
            return None
        return 1.0 + self.spec_accepted_tokens_total / self.spec_drafts_total

    def since(self, earlier: VllmMetrics) -> VllmMetrics:
        """Counters and histograms as increments since `earlier`; gauges stay as they are now."""

        def delta(now: float | None, then: float | None) -> float | None:
            if now is None:
                return None
            return now - (then or 0.0)

        def hist_delta(now: Histogram | None, then: Histogram | None) -> Histogram | None:
            return None if now is None else now.since(then)

        return replace(
            self,
            preemptions_total=delta(self.preemptions_total, earlier.preemptions_total),
            generation_tokens_total=delta(self.generation_tokens_total, earlier.generation_tokens_total),
            prompt_tokens_total=delta(self.prompt_tokens_total, earlier.prompt_tokens_total),
            spec_drafts_total=delta(self.spec_drafts_total, earlier.spec_drafts_total),
            spec_draft_tokens_total=delta(self.spec_draft_tokens_total, earlier.spec_draft_tokens_total),
            spec_accepted_tokens_total=delta(self.spec_accepted_tokens_total, earlier.spec_accepted_tokens_total),
            e2e_latency_s=hist_delta(self.e2e_latency_s, earlier.e2e_latency_s),
            ttft_s=hist_delta(self.ttft_s, earlier.ttft_s),
            inter_token_latency_s=hist_delta(self.inter_token_latency_s, earlier.inter_token_latency_s),
        )

    def to_engine_sample(self, time_s: float) -> EngineSample:
        extra: dict[str, float] = {}
        optional = {
            "prompt_tokens_total": self.prompt_tokens_total,
            "spec_drafts_total": self.spec_drafts_total,
            "spec_acceptance_rate": self.spec_acceptance_rate,
            "spec_mean_acceptance_length": self.spec_mean_acceptance_length,
        }
        extra.update({key: value for key, value in optional.items() if value is not None})
        return EngineSample(
            time_s=time_s,
            running=int(self.running or 0),
            waiting=int(self.waiting or 0),
            kv_usage=float(self.kv_usage or 0.0),
            preemptions_total=int(self.preemptions_total or 0),
            generated_tokens_total=int(self.generation_tokens_total or 0),
            spec_draft_tokens_total=_int_or_none(self.spec_draft_tokens_total),
            spec_accepted_tokens_total=_int_or_none(self.spec_accepted_tokens_total),
            extra=extra,
        )


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


class _SampleIndex:
    """Sample values by wire name, summed (or averaged) over label sets; histogram buckets by bound."""

    def __init__(self, text: str) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.series: dict[str, int] = defaultdict(int)
        self.buckets: dict[str, dict[float, float]] = defaultdict(lambda: defaultdict(float))
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not math.isfinite(sample.value):
                    continue  # NaN (the exposition format's "no value") or an infinity counts nothing
                if sample.name.endswith("_bucket") and "le" in sample.labels:
                    base = sample.name[: -len("_bucket")]
                    bound = float(sample.labels["le"])  # ValueError for a bound that is no number
                    if math.isnan(bound):
                        raise ValueError(f"{sample.name} has the bucket bound le=NaN")
                    self.buckets[base][bound] += sample.value
                else:
                    self.sums[sample.name] += sample.value
                    self.series[sample.name] += 1

    def total(self, names: tuple[str, ...]) -> float | None:
        """The sum over label sets; None when absent or past the float range (no count to report)."""
        for name in names:
            if name in self.sums:
                return self.sums[name] if math.isfinite(self.sums[name]) else None
        return None

    def mean(self, names: tuple[str, ...]) -> float | None:
        total = self.total(names)
        name = next((name for name in names if name in self.sums), None)
        return None if total is None or name is None else total / self.series[name]

    def histogram(self, names: tuple[str, ...]) -> Histogram | None:
        for name in names:
            buckets = self.buckets.get(name)
            if not buckets:
                continue
            bounds = tuple(sorted(buckets))
            return Histogram(
                upper_bounds=bounds,
                cumulative_counts=tuple(buckets[bound] for bound in bounds),
                sum=self.sums.get(f"{name}_sum", 0.0),
                count=self.sums.get(f"{name}_count", buckets[bounds[-1]]),
            )
        return None


def _known_lines(text: str) -> str:
    """Only the sample lines this module reads.

    vLLM exposes about 50 kB of metrics; prometheus_client's parser takes ~20 ms for all of it (~4 ms for
    what we keep), time the load driver's event loop loses from its send schedule at every sample.
    Without HELP/TYPE lines the parser types every sample `unknown`, which is fine: we index by name.
    """
    kept = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        end = len(line)
        for stop in ("{", " "):
            position = line.find(stop)
            if position != -1:
                end = min(end, position)
        if line[:end] in KNOWN_SAMPLE_NAMES:
            kept.append(line)
    kept.append("")
    return "\n".join(kept)


def parse_metrics(text: str) -> VllmMetrics:
    """Parse Prometheus exposition text from a vLLM server. Raises ValueError on unparsable text."""
    index = _SampleIndex(_known_lines(text))
    return VllmMetrics(
        running=index.total(RUNNING),
        waiting=index.total(WAITING),
        # A usage fraction summed over engines could exceed 1; each data-parallel engine has a pool of
        # the same size, so the mean is the server's usage.
        kv_usage=index.mean(KV_USAGE),
        preemptions_total=index.total(PREEMPTIONS),
        generation_tokens_total=index.total(GENERATION_TOKENS),
        prompt_tokens_total=index.total(PROMPT_TOKENS),
        spec_drafts_total=index.total(SPEC_DRAFTS),
        spec_draft_tokens_total=index.total(SPEC_DRAFT_TOKENS),
        spec_accepted_tokens_total=index.total(SPEC_ACCEPTED_TOKENS),
        e2e_latency_s=index.histogram(E2E_LATENCY),
        ttft_s=index.histogram(TTFT),
        inter_token_latency_s=index.histogram(INTER_TOKEN_LATENCY),
    )


class MetricsUnavailable(RuntimeError):
    """The server has no usable /metrics (not a vLLM, metrics disabled, or unreachable)."""


async def fetch_metrics(client: httpx.AsyncClient, base_url: str, timeout_s: float = 5.0) -> VllmMetrics:
    """GET {base_url}/metrics and parse it. Raises MetricsUnavailable with the cause."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        response = await client.get(url, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise MetricsUnavailable(f"cannot read {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200:
        raise MetricsUnavailable(f"{url} answered HTTP {response.status_code}")
    try:
        return parse_metrics(response.text)
    except ValueError as exc:
        raise MetricsUnavailable(f"{url} is not Prometheus text: {exc}") from exc
