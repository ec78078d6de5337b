"""`summarize`: a whole run's records -> one `Summary` (latency percentiles, goodput, attainment, ...).

Definitions follow docs/metrics.md, which matches `vllm bench serve` where the two overlap (TTFT, TPOT,
ITL, E2EL, request goodput) and cites the papers for the rest. Every rate is per second of one measurement
window T:
- `window_s` given: T = window_s (the caller knows the segment it measured, e.g. a tuner segment).
- otherwise: T runs from the earliest arrival to the latest end among measured requests, failures
  included (a timeout's end is when it was given up). That is the span in which the server was serving
  the measured requests, the reading of T in SLO-Tuner eq. 1 and paper 003 eq. 8.
If T is not positive (no request, or all ended at the instant they arrived), every rate is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from core.metrics.itl import GapSeries, itl_summary, linear_percentiles
from core.metrics.outcomes import NAN, STATUSES, RequestOutcomes, compute_outcomes
from core.profile import SLOSpec, SmoothGoodputSpec
from core.records import RequestRecord

PERCENTILES = (50.0, 90.0, 95.0, 99.0)


def percentiles(
    values: np.ndarray, qs: Sequence[float] = PERCENTILES, *, overwrite_input: bool = False
) -> tuple[float, ...]:
    """numpy's default ("linear") percentiles, as `vllm bench serve`; NaN for no values.

    `overwrite_input` lets numpy partition `values` in place (saves a copy of a 20M-gap ITL array)."""
    if len(values) == 0:
        return tuple(NAN for _ in qs)
    if len(values) <= _SMALL:
        # The live window's few dozen values, three times per progress event: sorting them and interpolating
        # with numpy's formula (linear_percentiles) gives numpy's numbers without np.percentile's overhead.
        ordered = np.sort(values)
        if math.isnan(ordered[-1]):  # NaN sorts last; numpy's percentiles of an array holding one are NaN
            return tuple(NAN for _ in qs)
        return tuple(linear_percentiles(len(ordered), qs, lambda ranks: {r: float(ordered[r]) for r in ranks}))
    if values.dtype != np.float64:
        found = np.percentile(values, qs, method="linear", overwrite_input=overwrite_input)
        return tuple(float(v) for v in found)
    # Larger float arrays: partitioned at the ranks numpy reads, as np.percentile does, and interpolated with
    # its formula, without its per-call machinery (and the numpy.ma import its first call costs). The last
    # rank too: NaN partitions last, and numpy's percentiles of an array holding one are NaN.
    n = len(values)
    holds_nan = False

    def order_stats(ranks: list[int]) -> dict[int, float]:
        nonlocal holds_nan
        kth = sorted({*ranks, n - 1})
        if overwrite_input:
            values.partition(kth)
            ordered = values
        else:
            ordered = np.partition(values, kth)
        holds_nan = math.isnan(ordered[n - 1])
        return {r: float(ordered[r]) for r in ranks}

    found = linear_percentiles(n, qs, order_stats)
    return tuple(NAN for _ in qs) if holds_nan else tuple(found)


# Up to this many values, percentiles sort them (see `percentiles`); above it they are partitioned.
_SMALL = 1024


def _mean(values: np.ndarray) -> float:
    return float(np.mean(values)) if len(values) else NAN


def _defined(values: np.ndarray) -> np.ndarray:
    return values[~np.isnan(values)]


def _rate(amount: float, window_s: float) -> float:
    return amount / window_s if window_s > 0 else NAN


def _json_ready(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN: null reads as "undefined" (e.g. p99 of zero requests)
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    return value


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """The per-task cut of a summary. Rates use the run's window T, so they add up to the run's rates."""

    requests: int
    completed: int
    failed: int
    p50_s: float
    p99_s: float
    slo_attainment: float
    goodput_rps: float
    token_goodput_tps: float
    smooth_goodput: float
    # The p99s a task's own TTFT and TPOT SLOs are checked on (core/metrics/verdict.py).
    ttft_p99_s: float = NAN
    tpot_p99_s: float = NAN

    def to_dict(self) -> dict[str, Any]:
        return _json_ready(asdict(self))


@dataclass(frozen=True, slots=True)
class Summary:
    """Metrics of one run or segment. Field names carry their unit; NaN means undefined."""

    requests: int  # measured (warm-up dropped), failures included
    completed: int
    failed: int
    failed_by_status: dict[str, int]
    window_s: float
    # end-to-end latency of completed requests (vllm bench "E2EL")
    p50_s: float
    p90_s: float
    p95_s: float
    p99_s: float
    mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p95_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p95_s: float
    tpot_p99_s: float
    tpot_mean_s: float
    itl_p50_s: float
    itl_p90_s: float
    itl_p95_s: float
    itl_p99_s: float
    itl_mean_s: float
    goodput_rps: float
    slo_attainment: float  # fraction 0..1 of all measured requests
    token_goodput_tps: float
    smooth_goodput: float  # benefit tokens per second
    smooth_alpha: float
    smooth_reading_speed_tps: float
    smooth_ttft_allow_s: float | None  # None: token i due at a + i/V (paper 003 eq. 4)
    smooth_penalty: str
    throughput_rps: float
    output_tps: float
    output_tokens: int  # of completed requests
    cv_completion_over_slo: float
    mean_idle_latency_s: float
    per_task: dict[str, TaskSummary] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the fields by name (unit-suffixed), NaN as None, per_task nested by task."""
        flat = {name: getattr(self, name) for name in self.__dataclass_fields__ if name != "per_task"}
        flat["failed_by_status"] = dict(self.failed_by_status)
        flat["per_task"] = {task: ts.to_dict() for task, ts in self.per_task.items()}
        return _json_ready(flat)


def _task_summary(out: RequestOutcomes, mask: np.ndarray, window_s: float) -> TaskSummary:
    ok = out.ok & mask
    requests = int(mask.sum())
    completed = int(ok.sum())
    p50, p99 = percentiles(_defined(out.e2e_s[ok]), (50.0, 99.0))
    attained = out.attained & mask
    return TaskSummary(
        requests=requests,
        completed=completed,
        failed=requests - completed,
        p50_s=p50,
        p99_s=p99,
        slo_attainment=int(attained.sum()) / requests if requests else NAN,
        goodput_rps=_rate(int((out.good & mask).sum()), window_s),
        token_goodput_tps=_rate(int(out.output_tokens[attained].sum()), window_s),
        smooth_goodput=_rate(float(out.benefit[mask].sum()), window_s),
        ttft_p99_s=percentiles(_defined(out.ttft_s[ok]), (99.0,))[0],
        tpot_p99_s=percentiles(_defined(out.tpot_s[ok]), (99.0,))[0],
    )


def cv_completion_over_slo(out: RequestOutcomes) -> float:
    """SABER's stability metric (paper 001 eq. 1): std/mean of e2e / e2e-SLO over completed requests
    that have an e2e SLO. Population std (ddof=0); NaN with fewer than two such requests, where a spread
    says nothing."""
    mask = out.ok & ~np.isnan(out.slo_e2e_s) & ~np.isnan(out.e2e_s)
    ratios = out.e2e_s[mask] / out.slo_e2e_s[mask]
    if len(ratios) < 2:
        return NAN
    mean = float(np.mean(ratios))
    return float(np.std(ratios)) / mean if mean > 0 else NAN


def measurement_window_s(out: RequestOutcomes) -> float:
    """Earliest arrival to latest end among the given requests (see the module docstring)."""
    if len(out) == 0 or np.all(np.isnan(out.end_s)):
        return NAN
    return float(np.nanmax(out.end_s) - np.min(out.arrival_s))


def summarize(
    records: Sequence[RequestRecord],
    *,
    slo: SLOSpec,
    smooth: SmoothGoodputSpec,
    window_s: float | None = None,
    judged: Callable[[Sequence[RequestRecord], SLOSpec, SmoothGoodputSpec], RequestOutcomes | None] | None = None,
) -> Summary:
    """Summarise a run. Warm-up records are dropped; `slo` applies to records without an SLO of their own.

    `judged` (a `WindowedAggregator(keep_outcomes=True).judged`) gives the measured records' outcomes as the
    live window already computed them (the same `compute_outcomes`, so the same numbers); None from it, or no
    `judged`, judges them here."""
    if window_s is not None and not window_s > 0:
        raise ValueError(f"window_s must be > 0 seconds (got {window_s!r}); omit it to use the run's span")
    measured = [rec for rec in records if not rec.warmup]
    out = judged(measured, slo, smooth) if judged is not None else None
    if out is None:
        out = compute_outcomes(measured, fallback_slo=slo, smooth=smooth)
    window = float(window_s) if window_s is not None else measurement_window_s(out)

    ok = out.ok
    # First, while no other per-request temporaries are alive: the ITL blocks are the summary's peak.
    itl_mean, itl_p = itl_summary(GapSeries(measured, ok), PERCENTILES)
    requests = len(out)
    completed = int(ok.sum())
    status_counts = np.bincount(out.status_code[~ok], minlength=len(STATUSES))
    failed_by_status = {STATUSES[code].value: int(count) for code, count in enumerate(status_counts) if count}

    e2e = _defined(out.e2e_s[ok])
    ttft = _defined(out.ttft_s[ok])
    tpot = _defined(out.tpot_s[ok])
    e2e_p = percentiles(e2e)
    ttft_p = percentiles(ttft)
    tpot_p = percentiles(tpot)
    output_tokens = int(out.output_tokens[ok].sum())
    defined_idle = _defined(out.idle_s)

    per_task = {name: _task_summary(out, out.task_code == code, window) for code, name in enumerate(out.task_names)}
    return Summary(
        requests=requests,
        completed=completed,
        failed=requests - completed,
        failed_by_status=failed_by_status,
        window_s=window,
        p50_s=e2e_p[0],
        p90_s=e2e_p[1],
        p95_s=e2e_p[2],
        p99_s=e2e_p[3],
        mean_s=_mean(e2e),
        ttft_p50_s=ttft_p[0],
        ttft_p90_s=ttft_p[1],
        ttft_p95_s=ttft_p[2],
        ttft_p99_s=ttft_p[3],
        ttft_mean_s=_mean(ttft),
        tpot_p50_s=tpot_p[0],
        tpot_p90_s=tpot_p[1],
        tpot_p95_s=tpot_p[2],
        tpot_p99_s=tpot_p[3],
        tpot_mean_s=_mean(tpot),
        itl_p50_s=itl_p[0],
        itl_p90_s=itl_p[1],
        itl_p95_s=itl_p[2],
        itl_p99_s=itl_p[3],
        itl_mean_s=itl_mean,
        goodput_rps=_rate(int(out.good.sum()), window),
        slo_attainment=int(out.attained.sum()) / requests if requests else NAN,
        token_goodput_tps=_rate(int(out.output_tokens[out.attained].sum()), window),
        smooth_goodput=_rate(float(out.benefit.sum()), window),
        smooth_alpha=smooth.alpha,
        smooth_reading_speed_tps=smooth.reading_speed_tps,
        smooth_ttft_allow_s=smooth.ttft_allow_s,
        smooth_penalty=smooth.penalty,
        throughput_rps=_rate(completed, window),
        output_tps=_rate(output_tokens, window),
        output_tokens=output_tokens,
        cv_completion_over_slo=cv_completion_over_slo(out),
        mean_idle_latency_s=_mean(defined_idle),
        per_task=per_task,
    )
