"""From a sweep point's request records and engine counters to step observations for the fit: chunk gaps
to decode steps, TTFT to prefill steps, the engine-timed mean step, the client-e2e effective step, noise."""

from __future__ import annotations

import math

import numpy as np

from core.backend_api import RunOutcome
from core.calibrate.engine_counters import EngineCounters
from core.calibrate.fit import StepObservation, robust_cv
from core.calibrate.stalls import observe_stalls
from core.calibrate.sweep_points import DecodeSamples, PointResult, SweepPoint
from core.records import RequestRecord, Status

# A group of gaps at one batch size becomes an observation only with this many gaps behind its median.
MIN_GAPS_PER_GROUP = 30
# Another request's first token within this share of a gap after the gap's end still came from the same
# engine step (the server streams one step's chunks to different clients a few ms apart).
PREFILL_MARGIN = 0.3


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
    # Decode points only: a prefill point's lone short requests are mostly waiting for their first token,
    # which is the prefill the point measures, not a stall. The engine's step bounds the typical step from
    # below: with bursty delivery the chunk gaps are socket writes, not steps.
    result.stalls = observe_stalls(outcome.records, step_floor_s=result.engine_step_s)
    if point.spec_width:
        server = outcome.notes.get("server", {})
        result.mean_acceptance_length = server.get("spec_mean_acceptance_length") or _mean_chunk_tokens(ok)
    # The machine's stalls are taken out of each request's latency here and modelled on their own
    # (Calibration.stalls): left in, a stall that falls on half of one point's requests would move that
    # point's effective step by its whole length, and no one step model could fit the points (a CI run on a
    # loaded machine: decode c4 measured 5.9 ms against 2.6 ms fitted). The simulator adds them back.
    stall_free = [
        r.e2e_s - result.stalls.stalled_within(r.arrival_s, r.end_s)
        for r in ok
        if r.e2e_s is not None and r.end_s is not None
    ]
    result.e2e_observation = e2e_decode_observation(point, stall_free, block_size, result.mean_acceptance_length)
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
