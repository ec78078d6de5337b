"""The profiling sweep: what to measure on a server, and how request records become step observations.

The simulator (core/sim/engine.py) charges each engine step `step_time(batched_tokens, context_tokens,
spec_steps, sequences)`. The sweep measures those same steps from the client side, with `ignore_eos` and a
fixed output length so every request decodes exactly as long as asked:

- decode: closed-loop clients at several concurrencies with `max_num_seqs` above all of them, short and long
  prompts. Every gap between two streamed chunks of a request is one engine step (or `tokens` steps when
  the server coalesced tokens into one chunk). For each gap the sweep reconstructs, from all records of the
  run, how many requests were decoding at that moment (the batch), the KV context they held (block-rounded
  prompt plus tokens generated so far, as the simulator counts it), and whether another request finished
  its prefill inside the gap (such gaps are mixed steps and are left out). Gaps are grouped by batch size;
  a group's median is one decode observation.
- prefill: concurrency 1, several prompt lengths, 4 output tokens: the median TTFT per length is one
  prefill step plus the per-request latency outside the engine (fit.py separates the two).
- speculation (when the profile names a draft model or method): the decode sweep again with
  `num_speculative_tokens` = k, which prices the draft's k sequential passes per step (`spec_steps`), and
  the server's /metrics acceptance counters, which give the calibration's default acceptance.

Timing source. The simulator models the engine, so the fit wants engine steps. When the server exposes
vLLM's /metrics, each point is timed by the engine itself: the increments over the point of
`inter_token_latency_seconds` (engine-core timestamps between a request's consecutive outputs: the step
period, one sample per decoding request per step), `iteration_tokens_total` (tokens per engine step; its
count is the number of steps) and `request_prefill_time_seconds` (engine time from scheduling to the first
token). Their sums and counts are exact even though the buckets are coarse. The client's chunk gaps are
the fallback (the simulator target, or servers without /metrics): on a CPU shared by the engine, its
worker and the client, vLLM's API server can be starved and deliver a whole stream in one burst, so gaps
then measure delivery, not steps (seen on the 2-core development machine: ~15 us gaps, TTFT close to e2e).

A target is what is measured: a vLLM this process starts (`VllmTarget`, restarted per knob setting), a
running server (`UrlTarget`, its knobs as they are), or the simulator itself (`SimTarget`, which lets the
tests check that a sweep of a known calibration recovers it).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from core.backends.base import LoadPlan, RunOutcome
from core.calibrate.fit import StepObservation, robust_cv
from core.events import EventSink, make_event
from core.profile import Calibration, KnobsSpec
from core.records import RequestRecord, RequestSpec, Status

PointKind = Literal["decode", "prefill"]
Timing = Literal["e2e", "steps"]
# A group of gaps at one batch size becomes an observation only with this many gaps behind its median.
MIN_GAPS_PER_GROUP = 30
# Another request's first token within this share of a gap after the gap's end still came from the same
# engine step (the server streams one step's chunks to different clients a few ms apart).
PREFILL_MARGIN = 0.3


@dataclass(frozen=True, slots=True)
class SweepSettings:
    """What the sweep measures. `full()` takes about 2-4 minutes of load on a 2-core CPU plus one or two
    server starts; `reduced()` about a minute of load (for the integration test)."""

    max_num_seqs: int = 32  # above every decode concurrency, so the batch is the clients in flight
    output_tokens: int = 64
    decode_concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    decode_prompt_tokens: int = 32
    # Decode again at a long prompt: KV context then varies independently of the batch (per_ctx_token_s).
    long_prompt_tokens: int = 512
    long_prompt_concurrency: tuple[int, ...] = (4, 8)
    requests_per_client: int = 6
    prefill_prompt_tokens: tuple[int, ...] = (16, 128, 256, 512, 768)
    prefill_requests: int = 8
    prefill_output_tokens: int = 4
    spec_width: int = 4
    spec_concurrency: tuple[int, ...] = (1, 4, 8)
    spec_requests_per_client: int = 3
    point_max_s: float = 30.0  # no new sends after this long in one point (a slow server still ends)
    # Each decode point is measured this many times and the repeat with the median client e2e is kept: a
    # few seconds in which another process takes the shared CPU spoil one repeat, not the point.
    decode_repeats: int = 3

    @classmethod
    def full(cls) -> SweepSettings:
        return cls()

    @classmethod
    def reduced(cls) -> SweepSettings:
        return cls(
            decode_concurrency=(1, 4, 8),
            long_prompt_concurrency=(4,),
            requests_per_client=4,
            prefill_prompt_tokens=(16, 256, 768),
            prefill_requests=5,
            spec_width=0,
            point_max_s=15.0,
        )


@dataclass(frozen=True, slots=True)
class SweepPoint:
    label: str
    kind: PointKind
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    requests: int
    spec_width: int = 0


@dataclass(frozen=True, slots=True)
class ServerFacts:
    kv_capacity_tokens: int | None
    block_size: int | None
    max_model_len: int | None
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class DecodeSamples:
    """Per engine step, from client chunk gaps: step time, batch, context, and whether it was mixed."""

    step_s: np.ndarray
    batch: np.ndarray
    context_tokens: np.ndarray
    mixed: np.ndarray  # another request finished its prefill in this gap: not a pure decode step


ENGINE_SERIES = {
    "itl": "vllm:inter_token_latency_seconds",
    "iteration_tokens": "vllm:iteration_tokens_total",
    "prefill_time": "vllm:request_prefill_time_seconds",
    "decode_time": "vllm:request_decode_time_seconds",
    "ttft": "vllm:time_to_first_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """Sums and counts of vLLM's engine-timed histograms (summed over label sets), plus token counters."""

    sums: dict[str, float]
    counts: dict[str, float]
    prompt_tokens: float = 0.0

    @classmethod
    def parse(cls, text: str) -> EngineCounters:
        wanted = {
            f"{name}{suffix}": (key, suffix) for key, name in ENGINE_SERIES.items() for suffix in ("_sum", "_count")
        }
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        prompt = 0.0
        for line in text.splitlines():
            if not line or line[0] == "#":
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            value = float(line.rsplit(" ", 1)[1]) if name in wanted or name == "vllm:prompt_tokens_total" else None
            if value is None:
                continue
            if name == "vllm:prompt_tokens_total":
                prompt += value
                continue
            key, suffix = wanted[name]
            target = sums if suffix == "_sum" else counts
            target[key] = target.get(key, 0.0) + value
        return cls(sums, counts, prompt)

    def since(self, earlier: EngineCounters) -> EngineCounters:
        return EngineCounters(
            {k: v - earlier.sums.get(k, 0.0) for k, v in self.sums.items()},
            {k: v - earlier.counts.get(k, 0.0) for k, v in self.counts.items()},
            self.prompt_tokens - earlier.prompt_tokens,
        )

    def mean(self, key: str) -> float | None:
        count = self.counts.get(key, 0.0)
        return self.sums.get(key, 0.0) / count if count > 0 else None

    def count(self, key: str) -> float:
        return self.counts.get(key, 0.0)


@dataclass(slots=True)
class PointResult:
    point: SweepPoint
    completed: int
    failed: int
    wall_s: float
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    ttft_p50_s: float | None
    itl_p50_s: float | None  # median per-step gap over pure decode steps
    throughput_rps: float | None
    samples: DecodeSamples | None = None
    mean_acceptance_length: float | None = None  # speculation: server /metrics (else chunk sizes)
    observations: list[StepObservation] = field(default_factory=list)  # engine-timed, else chunk gaps
    # Decode only: the effective step that reproduces the client's median e2e at this concurrency.
    e2e_observation: StepObservation | None = None
    timing: str = "client chunk gaps"  # or "engine /metrics"
    repeat_e2e_p50_s: list[float] = field(default_factory=list)  # every repeat's median e2e (decode points)
    engine_step_s: float | None = None  # engine-timed mean step (decode) or prefill time (prefill)
    engine_batch: float | None = None  # mean decoding requests per step, from the engine's counters
    client_ttfts: list[float] = field(default_factory=list)
    client_e2es: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.point.label,
            "kind": self.point.kind,
            "concurrency": self.point.concurrency,
            "prompt_tokens": self.point.prompt_tokens,
            "output_tokens": self.point.output_tokens,
            "spec_width": self.point.spec_width,
            "completed": self.completed,
            "failed": self.failed,
            "wall_s": self.wall_s,
            "e2e_p50_s": self.e2e_p50_s,
            "e2e_p99_s": self.e2e_p99_s,
            "ttft_p50_s": self.ttft_p50_s,
            "itl_p50_s": self.itl_p50_s,
            "throughput_rps": self.throughput_rps,
            "timing": self.timing,
            "engine_step_s": self.engine_step_s,
            "engine_batch": self.engine_batch,
            "mean_acceptance_length": self.mean_acceptance_length,
            "observations": len(self.observations),
            "repeat_e2e_p50_s": self.repeat_e2e_p50_s,
        }


@dataclass(slots=True)
class SweepResult:
    settings: SweepSettings
    facts: ServerFacts
    points: list[PointResult]
    description: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False

    def observations(self, timing: Timing = "e2e") -> list[StepObservation]:
        """The fit's input. "steps": engine-timed steps (else chunk gaps). "e2e": decode points as the
        effective step that reproduces the client's median e2e (prefill points as with "steps")."""
        chosen = []
        for p in self.points:
            if timing == "e2e" and p.point.kind == "decode" and p.e2e_observation is not None:
                chosen.append(p.e2e_observation)
            else:
                chosen += p.observations
        return chosen

    def decode_points(self, spec: bool = False) -> list[PointResult]:
        return [p for p in self.points if p.point.kind == "decode" and (p.point.spec_width > 0) == spec]


# ---------------------------------------------------------------- targets


class SweepTarget(Protocol):
    name: str
    can_change_knobs: bool

    async def use(self, knobs: KnobsSpec) -> None: ...

    async def run(self, plan: LoadPlan) -> RunOutcome: ...

    async def facts(self) -> ServerFacts: ...

    async def metrics_text(self) -> str | None: ...

    def describe(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


_KV_LOG_LINE = re.compile(r"KV cache size:\s*([\d,]+)\s*tokens", re.IGNORECASE)


def cache_facts_from_metrics(text: str) -> tuple[int | None, int | None]:
    """(KV capacity in tokens, block size) from vLLM's `vllm:cache_config_info` labels, if exposed."""
    line = next((ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info")), None)
    if line is None:
        return None, None
    labels: dict[str, str] = {}
    for family in text_string_to_metric_families(line + "\n"):
        for sample in family.samples:
            labels = dict(sample.labels)

    def number(key: str) -> int | None:
        value = labels.get(key, "None")
        try:
            return int(float(value))
        except ValueError:
            return None

    block = number("block_size")
    tokens = number("kv_cache_size_tokens")
    if tokens is None and block is not None:
        blocks = number("num_gpu_blocks") or number("num_cpu_blocks")
        tokens = None if blocks is None else blocks * block
    return tokens, block


def kv_tokens_from_log(lines: list[str]) -> int | None:
    """vLLM logs `... KV cache size: 1,048,576 tokens` at start-up."""
    for line in reversed(lines):
        match = _KV_LOG_LINE.search(line)
        if match:
            return int(match.group(1).replace(",", ""))
    return None


async def _server_facts(base_url: str, log_lines: list[str] | None = None) -> ServerFacts:
    kv_tokens = block = max_len = None
    sources: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
        try:
            response = await http.get(base_url + "/metrics")
            if response.status_code == 200:
                kv_tokens, block = cache_facts_from_metrics(response.text)
                if kv_tokens is not None:
                    sources["kv_capacity_tokens"] = "/metrics vllm:cache_config_info"
                if block is not None:
                    sources["block_size"] = "/metrics vllm:cache_config_info"
        except httpx.HTTPError:
            pass
        try:
            models = (await http.get(base_url + "/v1/models")).json().get("data", [])
            lengths = [m.get("max_model_len") for m in models if isinstance(m, dict) and m.get("max_model_len")]
            if lengths:
                max_len = int(lengths[0])
                sources["max_model_len"] = "/v1/models"
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
    if kv_tokens is None and log_lines:
        kv_tokens = kv_tokens_from_log(log_lines)
        if kv_tokens is not None:
            sources["kv_capacity_tokens"] = "vLLM log (KV cache size)"
    return ServerFacts(kv_tokens, block, max_len, sources)


async def _metrics_text(base_url: str) -> str | None:
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
        try:
            response = await http.get(base_url + "/metrics")
        except httpx.HTTPError:
            return None
    return response.text if response.status_code == 200 else None


class UrlTarget:
    """A running server (`--backend url`): measured with the knobs it was started with."""

    name = "url"
    can_change_knobs = False

    def __init__(self, backend: Any) -> None:  # core.backends.live.UrlBackend
        self.backend = backend

    async def use(self, knobs: KnobsSpec) -> None:
        return None  # its knobs are whatever it was started with

    async def run(self, plan: LoadPlan) -> RunOutcome:
        return await self.backend.run(plan)

    async def facts(self) -> ServerFacts:
        return await _server_facts(self.backend.base_url)

    async def metrics_text(self) -> str | None:
        return await _metrics_text(self.backend.base_url)

    def describe(self) -> dict[str, Any]:
        return self.backend.describe()

    async def close(self) -> None:
        await self.backend.close()


class VllmTarget(UrlTarget):
    """A vLLM this process starts and restarts with the sweep's knobs (`--backend vllm`); `backend` is a
    core.backends.vllm.VllmBackend. Running, /metrics, describe and close are the UrlTarget's."""

    name = "vllm"
    can_change_knobs = True

    async def use(self, knobs: KnobsSpec) -> None:
        from core.serve.process import ServerState

        process = self.backend.server.process
        if process is not None and process.state is ServerState.READY and self.backend.knobs == knobs:
            return
        if process is None:
            await self.backend.start(knobs)
        else:
            await self.backend.restart(knobs)

    async def facts(self) -> ServerFacts:
        from core.serve.server_log import read_log_tail
        from core.serve.vllm_server import option_value

        process = self.backend.server.process
        log_lines = read_log_tail(process.log_path, 400) if process is not None else []
        facts = await _server_facts(self.backend.base_url, log_lines)
        if facts.max_model_len is None and process is not None:
            value = option_value(process.argv or [], "--max-model-len")
            if value and value.isdigit():
                facts.sources["max_model_len"] = "server argv --max-model-len"
                return ServerFacts(facts.kv_capacity_tokens, facts.block_size, int(value), facts.sources)
        return facts


class SimTarget:
    """The simulator with a known calibration: a sweep of it should give that calibration back."""

    name = "sim"
    can_change_knobs = True

    def __init__(self, calibration: Calibration, knobs: KnobsSpec | None = None, seed: int = 0) -> None:
        self.calibration = calibration
        self.knobs = knobs or KnobsSpec()
        self.seed = seed
        self.runs = 0

    async def use(self, knobs: KnobsSpec) -> None:
        self.knobs = knobs

    async def run(self, plan: LoadPlan) -> RunOutcome:
        from core.backends.sim import SimBackend

        self.runs += 1
        return await SimBackend(self.calibration, self.knobs, seed=self.seed + self.runs).run(plan)

    async def facts(self) -> ServerFacts:
        cal = self.calibration
        return ServerFacts(cal.kv_capacity_tokens, cal.block_size, cal.max_model_len, {"all": "the calibration"})

    async def metrics_text(self) -> str | None:
        return None  # no /metrics: the simulator's chunk gaps are its steps

    def describe(self) -> dict[str, Any]:
        return {"backend": "sim", "engine": "simulator", "calibration": self.calibration.name}

    async def close(self) -> None:
        return None


# ---------------------------------------------------------------- from records to steps


def _blocks(tokens: np.ndarray, block: int) -> np.ndarray:
    return -(-tokens // block) * block


def decode_step_samples(records: list[RequestRecord], block_size: int, spec_width: int = 0) -> DecodeSamples:
    """One sample per chunk gap of every measured (ok, non-warm-up) request, with the batch it ran in.

    Activity is reconstructed from all records with a first token, warm-up ones included (they were on the
    server too). A request is decoding from its first chunk to its last. At a gap's midpoint m:
      batch   = #(first < m) - #(last < m)
      context = sum over decoding requests of roundup(prompt + 1, block) + (tokens so far - 1),
    which is how the simulator's KV total grows (admission reserves the block-rounded prompt, each decode
    step adds the tokens it emitted).
    """
    timed = [r for r in records if r.chunk_times is not None and len(r.chunk_times) > 0]
    if not timed:
        empty = np.empty(0)
        return DecodeSamples(empty, empty, empty, np.empty(0, dtype=bool))
    first = np.array([float(r.chunk_times[0]) for r in timed])  # type: ignore[index]
    last = np.array([float(r.chunk_times[-1]) for r in timed])  # type: ignore[index]
    reserved = _blocks(np.array([r.prompt_tokens + 1 for r in timed]), block_size).astype(float)
    emitted = np.array([float(len(r.token_times())) for r in timed])
    order_first = np.argsort(first)
    order_last = np.argsort(last)
    first_sorted, last_sorted = first[order_first], last[order_last]
    reserved_started = np.concatenate([[0.0], np.cumsum(reserved[order_first])])
    reserved_ended = np.concatenate([[0.0], np.cumsum(reserved[order_last])])
    emitted_ended = np.concatenate([[0.0], np.cumsum(emitted[order_last])])
    all_token_times = np.sort(np.concatenate([r.token_times() for r in timed]))

    steps, mids, starts, ends = [], [], [], []
    for record in timed:
        if record.warmup or record.status is not Status.OK or len(record.chunk_times) < 2:  # type: ignore[arg-type]
            continue
        times = np.asarray(record.chunk_times, dtype=float)
        sizes = np.ones(len(times) - 1) if record.chunk_tokens is None else np.asarray(record.chunk_tokens[1:], float)
        gaps = np.diff(times)
        # A chunk of n tokens spans n steps without speculation; with it, one verification step emits up
        # to k + 1 tokens.
        n_steps = sizes if spec_width == 0 else np.maximum(1.0, np.ceil(sizes / (spec_width + 1)))
        steps.append(gaps / n_steps)
        mids.append((times[:-1] + times[1:]) / 2.0)
        starts.append(times[:-1])
        ends.append(times[1:])
    if not steps:
        empty = np.empty(0)
        return DecodeSamples(empty, empty, empty, np.empty(0, dtype=bool))
    step_s, mid, start, end = (np.concatenate(a) for a in (steps, mids, starts, ends))
    started = np.searchsorted(first_sorted, mid, side="left")
    ended = np.searchsorted(last_sorted, mid, side="left")
    batch = started - ended
    tokens_so_far = np.searchsorted(all_token_times, mid, side="left") - emitted_ended[ended]
    context = reserved_started[started] - reserved_ended[ended] + tokens_so_far - batch
    margin = PREFILL_MARGIN * (end - start)
    prefills_in_gap = np.searchsorted(first_sorted, end + margin, side="right") - np.searchsorted(
        first_sorted, start + margin, side="right"
    )
    return DecodeSamples(step_s, batch.astype(float), np.maximum(context, 0.0), prefills_in_gap > 0)


def decode_observations(
    samples: DecodeSamples, spec_width: int, label: str, min_gaps: int = MIN_GAPS_PER_GROUP
) -> list[StepObservation]:
    """Pure decode steps grouped by batch size; each group's median is one observation."""
    pure = ~samples.mixed & (samples.batch >= 1)
    observations = []
    for batch in np.unique(samples.batch[pure]):
        chosen = pure & (samples.batch == batch)
        if chosen.sum() < min_gaps:
            continue
        b = float(batch)
        observations.append(
            StepObservation(
                step_s=float(np.median(samples.step_s[chosen])),
                batched_tokens=b * (spec_width + 1),
                context_tokens=float(np.median(samples.context_tokens[chosen])),
                spec_steps=float(spec_width),
                sequences=b,
                kind="decode",
                label=f"{label} batch {int(b)}",
            )
        )
    return observations


def prefill_observation(point: SweepPoint, ttfts: list[float], block_size: int) -> StepObservation | None:
    if not ttfts:
        return None
    prompt = point.prompt_tokens
    return StepObservation(
        step_s=float(np.median(ttfts)),
        batched_tokens=float(prompt),
        context_tokens=float(_blocks(np.array([prompt + 1]), block_size)[0]),
        sequences=1.0,
        kind="prefill",
        with_overhead=True,
        label=f"{point.label} (client TTFT)",
    )


def _streams_steps(result: PointResult) -> bool:
    """Whether the client's chunk gaps show engine steps (not a burst delivered by a starved API server)."""
    if result.itl_p50_s is None:
        return False
    return result.engine_step_s is None or result.itl_p50_s >= 0.5 * result.engine_step_s


def noise_cv(points: list[PointResult]) -> float:
    """Step-time noise for the simulator (i.i.d. lognormal per step with this CV).

    From client chunk gaps where they show steps: the median robust CV of pure decode steps at one batch
    size. Where they do not (bursty delivery), from the spread of e2e at the lowest decode concurrency:
    a request's decode sums n - 1 steps, so CV(step) ~ CV(e2e) x sqrt(n - 1); that also takes in
    correlated stalls of a shared CPU, which is what the simulator's noise has to stand for there.
    """
    cvs = []
    for result in points:
        samples = result.samples
        if samples is None or result.point.spec_width or not _streams_steps(result):
            continue
        pure = ~samples.mixed & (samples.batch >= 1)
        for batch in np.unique(samples.batch[pure]):
            chosen = pure & (samples.batch == batch)
            if chosen.sum() >= MIN_GAPS_PER_GROUP:
                cvs.append(robust_cv(samples.step_s[chosen]))
    if cvs:
        return float(np.median(cvs))
    decodes = sorted(
        (p for p in points if p.point.kind == "decode" and not p.point.spec_width and len(p.client_e2es) >= 3),
        key=lambda p: p.point.concurrency,
    )
    if decodes:
        lowest = decodes[0]
        return min(0.5, robust_cv(lowest.client_e2es) * math.sqrt(max(lowest.point.output_tokens - 1, 1)))
    return 0.05


def client_overhead_s(points: list[PointResult]) -> float | None:
    """Median over prefill points of client TTFT minus the engine's prefill time: the per-request latency
    outside engine steps (HTTP, tokenisation, hand-off between API server and engine)."""
    gaps = [
        float(np.median(p.client_ttfts)) - p.engine_step_s
        for p in points
        if p.point.kind == "prefill" and p.engine_step_s is not None and p.client_ttfts
    ]
    return float(np.median(gaps)) if gaps else None


# ---------------------------------------------------------------- the sweep


def plan_points(settings: SweepSettings, with_spec: bool) -> list[SweepPoint]:
    s = settings
    points = [
        SweepPoint(f"decode c{c} p{s.decode_prompt_tokens}", "decode", c, s.decode_prompt_tokens, s.output_tokens,
                   c * s.requests_per_client)
        for c in s.decode_concurrency
    ]  # fmt: skip
    points += [
        SweepPoint(f"decode c{c} p{s.long_prompt_tokens}", "decode", c, s.long_prompt_tokens, s.output_tokens,
                   c * s.requests_per_client)
        for c in s.long_prompt_concurrency
    ]  # fmt: skip
    points += [
        SweepPoint(f"prefill p{p}", "prefill", 1, p, s.prefill_output_tokens, s.prefill_requests)
        for p in s.prefill_prompt_tokens
    ]
    if with_spec and s.spec_width > 0:
        points += [
            SweepPoint(f"spec k{s.spec_width} c{c} p{s.decode_prompt_tokens}", "decode", c, s.decode_prompt_tokens,
                       s.output_tokens, c * s.spec_requests_per_client, spec_width=s.spec_width)
            for c in s.spec_concurrency
        ]  # fmt: skip
    return points


class _RequestIds:
    """Request ids unique over the whole sweep: the client salts each prompt with its id, so a repeated id
    would let vLLM's prefix cache skip a prefill the sweep means to measure."""

    def __init__(self) -> None:
        self.next = 0

    def specs(self, point: SweepPoint) -> Iterator[RequestSpec]:
        while True:
            self.next += 1
            yield RequestSpec(
                request_id=self.next, prompt_tokens=point.prompt_tokens, output_tokens=point.output_tokens
            )


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _mean_chunk_tokens(records: list[RequestRecord]) -> float | None:
    """Tokens per verification step from the chunk sizes (decode chunks only): the simulator's view, and a
    fallback for servers without speculation counters in /metrics."""
    sizes = [np.asarray(r.chunk_tokens[1:], float) for r in records if r.ok and r.chunk_tokens is not None]
    sizes = [s for s in sizes if len(s)]
    return float(np.concatenate(sizes).mean()) if sizes else None


def engine_decode_observation(point: SweepPoint, counters: EngineCounters, block_size: int) -> StepObservation | None:
    """A point's decode steps as the engine timed them: the mean step over the point, at the mean batch.

    The mean of a linear step model is the model at the mean inputs, so the mean step time pairs with the
    mean tokens per step (decodes plus the prompts prefilled in between, as the simulator's mixed steps
    also carry them) and the mean decoding batch (inter-token samples per step).
    """
    samples, steps = counters.count("itl"), counters.count("iteration_tokens")
    step_s = counters.mean("itl")
    if step_s is None or samples < MIN_GAPS_PER_GROUP or steps <= 0:
        return None
    batch = samples / steps
    width = point.spec_width
    tokens = batch * (width + 1) + counters.prompt_tokens / steps
    per_request = float(_blocks(np.array([point.prompt_tokens + 1]), block_size)[0]) + (point.output_tokens - 1) / 2
    return StepObservation(
        step_s=step_s,
        batched_tokens=tokens,
        context_tokens=batch * per_request,
        spec_steps=float(width),
        sequences=batch,
        kind="decode",
        label=f"{point.label} (engine)",
    )


def summarize_point(
    point: SweepPoint, outcome: RunOutcome, wall_s: float, block_size: int, counters: EngineCounters | None = None
) -> PointResult:
    measured = [r for r in outcome.records if not r.warmup]
    ok = [r for r in measured if r.ok]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    ends = [r.end_s for r in ok if r.end_s is not None]
    starts = [r.arrival_s for r in ok]
    span = (max(ends) - min(starts)) if ok else 0.0
    result = PointResult(
        point=point,
        completed=len(ok),
        failed=len(measured) - len(ok),
        wall_s=wall_s,
        e2e_p50_s=_percentile(e2e, 50),
        e2e_p99_s=_percentile(e2e, 99),
        ttft_p50_s=_percentile(ttft, 50),
        itl_p50_s=None,
        throughput_rps=len(ok) / span if span > 0 else None,
        client_ttfts=ttft,
        client_e2es=e2e,
    )
    if point.kind == "prefill":
        engine_prefill = counters.mean("prefill_time") if counters is not None else None
        if engine_prefill is not None:
            result.timing, result.engine_step_s = "engine /metrics", engine_prefill
            result.observations = [
                StepObservation(
                    step_s=engine_prefill,
                    batched_tokens=float(point.prompt_tokens),
                    context_tokens=float(_blocks(np.array([point.prompt_tokens + 1]), block_size)[0]),
                    kind="prefill",
                    label=f"{point.label} (engine)",
                )
            ]
        else:
            observation = prefill_observation(point, ttft, block_size)
            result.observations = [observation] if observation is not None else []
        return result
    samples = decode_step_samples(outcome.records, block_size, point.spec_width)
    result.samples = samples
    pure = ~samples.mixed & (samples.batch >= 1)
    if pure.any():
        result.itl_p50_s = float(np.median(samples.step_s[pure]))
    engine = engine_decode_observation(point, counters, block_size) if counters is not None else None
    if engine is not None:
        result.timing, result.engine_step_s, result.engine_batch = "engine /metrics", engine.step_s, engine.sequences
        result.observations = [engine]
    else:
        result.observations = decode_observations(samples, point.spec_width, point.label)
    if point.spec_width:
        server = outcome.notes.get("server", {})
        result.mean_acceptance_length = server.get("spec_mean_acceptance_length") or _mean_chunk_tokens(ok)
    result.e2e_observation = e2e_decode_observation(point, e2e, block_size, result.mean_acceptance_length)
    return result


def e2e_decode_observation(
    point: SweepPoint, e2es: list[float], block_size: int, acceptance_length: float | None = None
) -> StepObservation | None:
    """The step time at which the simulator's closed loop reproduces the client's median e2e.

    In the simulator, C closed-loop clients with max_num_seqs >= C decode as one batch of C; a request
    takes one prefill step and (n - 1) / L decode steps (L tokens per step with speculation), each step
    carrying C decodes plus, on average, C x prompt / steps of new prompts. So e2e ~ steps x step(C). On a
    server whose API process, not its engine, limits the rate (the 2-core CPU: the engine decodes 1.4
    requests at a time when 4 clients wait), this effective step is what the simulator must charge to
    predict what clients see; the engine-timed step would underpredict their latency.
    """
    if len(e2es) < 3:
        return None
    n = point.output_tokens
    per_step = acceptance_length if point.spec_width and acceptance_length else 1.0
    steps = 1.0 + (n - 1) / per_step
    clients = float(point.concurrency)
    width = point.spec_width
    reserved = float(_blocks(np.array([point.prompt_tokens + 1]), block_size)[0])
    return StepObservation(
        step_s=float(np.median(e2es)) / steps,
        batched_tokens=clients * (width + 1) + clients * point.prompt_tokens / steps,
        context_tokens=clients * (reserved + (n - 1) / 2),
        spec_steps=float(width),
        sequences=clients,
        kind="decode",
        label=f"{point.label} (client e2e)",
    )


async def run_sweep(
    target: SweepTarget,
    settings: SweepSettings,
    base_knobs: KnobsSpec,
    *,
    with_spec: bool,
    sink: EventSink | None = None,
) -> SweepResult:
    """Measure every point of the sweep on `target`. Starts (or restarts) the server at most twice: once
    without speculation, once with it. Cancellation returns what was measured (`interrupted`)."""
    emit = sink or (lambda _event: None)
    points = plan_points(settings, with_spec and target.can_change_knobs)
    notes: list[str] = []
    if with_spec and not target.can_change_knobs:
        notes.append("speculation not measured: the server's knobs cannot be changed from here")
    longest = max(p.prompt_tokens for p in points)
    plain = base_knobs.model_copy(
        update={
            "max_num_seqs": settings.max_num_seqs,
            "spec_on": False,
            "spec_width": 0,
            "max_num_batched_tokens": max(base_knobs.max_num_batched_tokens, longest + settings.max_num_seqs),
            "concurrency": None,
        }
    )
    spec_knobs = plain.model_copy(update={"spec_on": True, "spec_width": settings.spec_width})
    ids = _RequestIds()
    results: list[PointResult] = []
    facts = ServerFacts(None, None, None)
    interrupted = False
    try:
        current: KnobsSpec | None = None
        for point in points:
            knobs = spec_knobs if point.spec_width else plain
            if knobs != current:
                emit(
                    make_event(
                        "calibrate_server",
                        knobs=knobs.model_dump(),
                        target=target.name,
                        knobs_applied=target.can_change_knobs,  # a --url server keeps its own
                    )
                )
                await target.use(knobs)
                current = knobs
                if facts.block_size is None:
                    facts = await target.facts()
            block = facts.block_size or 16
            repeats = max(1, settings.decode_repeats) if point.kind == "decode" else 1
            measured: list[PointResult] = []
            for _ in range(repeats):
                result, interrupted = await _measure_point(target, point, ids, settings, block)
                measured.append(result)
                if interrupted:
                    break
            result = _median_repeat(measured)
            results.append(result)
            emit(make_event("calibrate_point", **result.to_dict()))
            if interrupted:
                break
    except asyncio.CancelledError:
        interrupted = True
    description = target.describe()
    return SweepResult(settings, facts, results, description, notes, interrupted)


async def _measure_point(
    target: SweepTarget, point: SweepPoint, ids: _RequestIds, settings: SweepSettings, block: int
) -> tuple[PointResult, bool]:
    """One measurement of a point: (its result, whether the run was interrupted)."""
    plan = LoadPlan(
        requests=ids.specs(point),
        mode="closed",
        concurrency=point.concurrency,
        # One request per client first, discarded: connection set-up and cold paths after a start.
        warmup_requests=point.concurrency,
        max_requests=point.requests + point.concurrency,
        duration_s=settings.point_max_s,
    )
    before = await target.metrics_text()
    started = time.perf_counter()
    outcome = await target.run(plan)
    wall_s = time.perf_counter() - started
    after = await target.metrics_text() if before is not None else None
    counters = None
    if before is not None and after is not None:
        counters = EngineCounters.parse(after).since(EngineCounters.parse(before))
    return summarize_point(point, outcome, wall_s, block, counters), outcome.interrupted


def _median_repeat(results: list[PointResult]) -> PointResult:
    """The repeat whose median client e2e is the median of the repeats' (the lower middle one of an even
    count); it keeps its own records, counters and observations, so everything about it stays consistent."""
    timed = [r for r in results if r.e2e_p50_s is not None]
    if not timed:
        return results[-1]
    timed.sort(key=lambda r: r.e2e_p50_s or 0.0)
    chosen = timed[(len(timed) - 1) // 2]
    chosen.repeat_e2e_p50_s = [r.e2e_p50_s for r in results if r.e2e_p50_s is not None]
    return chosen


def measured_decode_steps(result: SweepResult, timing: Timing = "e2e") -> list[tuple[StepObservation, float]]:
    """(observation, measured step) of every decode observation without speculation: the yardstick the
    fitted model is checked against."""
    decode = {id(o) for p in result.decode_points(spec=False) for o in [*p.observations, p.e2e_observation]}
    return [(o, o.step_s) for o in result.observations(timing) if id(o) in decode]


def median_itl(result: SweepResult, timing: Timing = "e2e") -> float | None:
    """Median measured decode step over the points without speculation."""
    steps = [step for _, step in measured_decode_steps(result, timing)]
    return float(np.median(steps)) if steps else None


def finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
