"""A sliding-window view of the metrics for live panels, fed one record at a time.

`add` is O(1) amortised: records wait in a small pending list and are judged in batches by the same
`compute_outcomes` that `summarize` uses, so a request gets the same verdict live and in the final summary.
Only a compact row per request is kept in the window (not its token timeline), so a long run holds
O(requests in the window) memory.

A request belongs to the window by the time it ended (its arrival if it never ended): the window
[now - window_s, now] shows what finished in the last window_s seconds. Rates divide by window_s, or by
the time since the first arrival while the run is younger than one window, so the first seconds of a run
do not read as a slump.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from core.metrics.outcomes import OutcomeStore, RequestOutcomes, compute_outcomes
from core.metrics.summary import NAN, percentiles
from core.pickling import reduce_by_fields
from core.profile import SLOSpec, SmoothGoodputSpec
from core.records import RequestRecord

# Column layout of the window's rows.
_KEY, _OK, _E2E, _TTFT, _TPOT, _GOOD, _ATTAINED, _BENEFIT, _TOKENS = range(9)
_COLUMNS = 9


@dataclass(frozen=True, slots=True)
class WindowSnapshot:
    """Metrics over the requests that ended in (now_s - window_s, now_s]. NaN means undefined."""

    now_s: float
    window_s: float  # the T the rates divide by (shorter than the window while the run is young)
    requests: int
    completed: int
    failed: int
    p50_s: float
    p95_s: float
    p99_s: float
    ttft_p99_s: float
    tpot_p99_s: float
    goodput_rps: float
    smooth_goodput: float  # benefit tokens per second
    slo_attainment: float
    throughput_rps: float
    output_tps: float

    def to_dict(self) -> dict[str, Any]:
        # What _json_ready(asdict(self)) gives (the fields in order, a non-finite float as None), written out:
        # asdict's deep copy of each field cost most of a progress event's serialisation (one per 250 records).
        return {
            "now_s": _finite(self.now_s),
            "window_s": _finite(self.window_s),
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.failed,
            "p50_s": _finite(self.p50_s),
            "p95_s": _finite(self.p95_s),
            "p99_s": _finite(self.p99_s),
            "ttft_p99_s": _finite(self.ttft_p99_s),
            "tpot_p99_s": _finite(self.tpot_p99_s),
            "goodput_rps": _finite(self.goodput_rps),
            "smooth_goodput": _finite(self.smooth_goodput),
            "slo_attainment": _finite(self.slo_attainment),
            "throughput_rps": _finite(self.throughput_rps),
            "output_tps": _finite(self.output_tps),
        }

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


def _finite(value: float) -> float | None:
    """_json_ready of a float field: None for NaN and infinities (JSON has neither)."""
    return value if math.isfinite(value) else None


@dataclass(frozen=True, slots=True)
class WindowTotals:
    """Cumulative counts since the aggregator was created (warm-up records are counted apart)."""

    requests: int = 0
    completed: int = 0
    failed: int = 0
    good: int = 0  # counted toward goodput
    attained: int = 0
    output_tokens: int = 0
    benefit_tokens: float = 0.0
    warmup_skipped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


class WindowedAggregator:
    """Sliding-window metrics: `add(record)` as requests finish, `snapshot(now_s)` when a panel redraws."""

    def __init__(
        self,
        window_s: float,
        slo: SLOSpec,
        smooth: SmoothGoodputSpec,
        *,
        batch_size: int = 512,
        keep_outcomes: bool = False,
    ) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0 seconds (got {window_s!r})")
        self.window_s = float(window_s)
        self.slo = slo
        self.smooth = smooth
        self._batch_size = batch_size
        self._pending: list[RequestRecord] = []
        # The window's rows (one per judged request, the columns below), oldest first: a float64 table whose
        # leading rows are dropped as they leave the window, the same values and order a deque of tuples held.
        self._rows = np.empty((0, _COLUMNS))
        self._newest_key = -math.inf
        self._first_arrival_s = math.inf
        self._totals = WindowTotals()
        # keep_outcomes: every batch's outcomes and records, so that the run's summary reuses them (`judged`)
        # instead of judging every record a second time.
        self._keep = keep_outcomes
        self._kept = OutcomeStore()
        self._kept_records: list[RequestRecord] = []

    def add(self, record: RequestRecord) -> None:
        if record.warmup:
            self._totals = _replace_totals(self._totals, warmup_skipped=self._totals.warmup_skipped + 1)
            return
        self._pending.append(record)
        if len(self._pending) >= self._batch_size:
            self._flush()

    @property
    def totals(self) -> WindowTotals:
        self._flush()
        return self._totals

    def _flush(self) -> None:
        if not self._pending:
            return
        out = compute_outcomes(self._pending, fallback_slo=self.slo, smooth=self.smooth)
        if self._keep:
            self._kept.append(out)
            self._kept_records.extend(self._pending)
        self._pending = []
        key = np.where(np.isnan(out.end_s), out.arrival_s, out.end_s)
        columns = (
            key,
            out.ok,
            out.e2e_s,
            out.ttft_s,
            out.tpot_s,
            out.good,
            out.attained,
            out.benefit,
            out.output_tokens,
        )
        # The batch's rows: the columns (float64, bool, int64) cast to float64 in one concatenation and written
        # in as the rows' columns, the table np.column_stack(columns) gives, without its per-column calls.
        block = np.empty((len(key), _COLUMNS))
        block.T[:] = np.concatenate(columns).reshape(_COLUMNS, len(key))
        self._rows = np.concatenate((self._rows, block))
        self._newest_key = max(self._newest_key, float(key.max()))
        self._first_arrival_s = min(self._first_arrival_s, float(out.arrival_s.min()))
        completed = int(out.ok.sum())
        t = self._totals
        self._totals = WindowTotals(
            requests=t.requests + len(out),
            completed=t.completed + completed,
            failed=t.failed + len(out) - completed,
            good=t.good + int(out.good.sum()),
            attained=t.attained + int(out.attained.sum()),
            output_tokens=t.output_tokens + int(out.output_tokens[out.ok].sum()),
            benefit_tokens=t.benefit_tokens + float(out.benefit.sum()),
            warmup_skipped=t.warmup_skipped,
        )
        self._evict(self._newest_key)

    def judged(
        self, records: Sequence[RequestRecord], slo: SLOSpec, smooth: SmoothGoodputSpec
    ) -> RequestOutcomes | None:
        """The outcomes of `records` (in their order, without ITL gaps) as this window judged them, or None
        unless it kept its outcomes and judged exactly these records under the same SLO and smooth goodput."""
        self._flush()
        if not self._keep or not records or len(records) != len(self._kept_records):
            return None
        if slo != self.slo or smooth != self.smooth:
            return None
        if all(map(operator.is_, records, self._kept_records)):
            return self._kept.gather(None)  # the usual case: the records in the order they were added
        position = {id(rec): i for i, rec in enumerate(self._kept_records)}
        if len(position) != len(self._kept_records):
            return None  # a record added twice
        try:
            order = np.fromiter((position[id(rec)] for rec in records), dtype=np.int64, count=len(records))
        except KeyError:
            return None  # a record the window never saw (e.g. cancelled at Ctrl-C)
        return self._kept.gather(order)

    def _evict(self, now_s: float) -> None:
        # Rows arrive roughly in end order; one that is out of order lingers until those before it go,
        # and `snapshot` filters by time anyway, so this only bounds memory.
        horizon = now_s - self.window_s
        gone = self._rows[:, _KEY] <= horizon
        if gone.any():
            # The leading rows up to the first that stays (argmin: the first False), or all of them.
            self._rows = self._rows[int(gone.argmin()) :] if not gone.all() else self._rows[:0]

    def advance(self, now_s: float) -> None:
        """What `snapshot(now_s)` does to the window (the pending records judged, the rows before the window
        dropped), for a caller that does not read the figures."""
        self._flush()
        self._evict(now_s)

    def snapshot(self, now_s: float) -> WindowSnapshot:
        """Metrics of (now_s - window_s, now_s]. Time only moves forward: rows older than the newest
        end added minus the window are already dropped, so a snapshot of the past may miss them."""
        self.advance(now_s)
        span = min(self.window_s, now_s - self._first_arrival_s)
        if len(self._rows):
            table = self._rows
            key = table[:, _KEY]
            table = table[(key > now_s - self.window_s) & (key <= now_s)]
        else:
            table = np.empty((0, _COLUMNS))
        # A column's completed rows by a 1-D mask of the column view: the values table[ok, column] gives, without
        # numpy's mixed (boolean and integer) indexing, which cost several times as much per call.
        ok = table[:, _OK] > 0
        e2e = table[:, _E2E][ok]
        e2e = e2e[~np.isnan(e2e)]
        ttft = table[:, _TTFT][ok]
        tpot = table[:, _TPOT][ok]
        p50, p95, p99 = percentiles(e2e, (50.0, 95.0, 99.0))
        requests = len(table)
        completed = int(ok.sum())

        def rate(amount: float) -> float:
            return amount / span if span > 0 else NAN

        return WindowSnapshot(
            now_s=float(now_s),
            window_s=span if span > 0 else NAN,
            requests=requests,
            completed=completed,
            failed=requests - completed,
            p50_s=p50,
            p95_s=p95,
            p99_s=p99,
            ttft_p99_s=percentiles(ttft[~np.isnan(ttft)], (99.0,))[0],
            tpot_p99_s=percentiles(tpot[~np.isnan(tpot)], (99.0,))[0],
            goodput_rps=rate(float(table[:, _GOOD].sum())),
            smooth_goodput=rate(float(table[:, _BENEFIT].sum())),
            slo_attainment=float(table[:, _ATTAINED].sum()) / requests if requests else NAN,
            throughput_rps=rate(completed),
            output_tps=rate(float(table[:, _TOKENS][ok].sum())),
        )


def _replace_totals(totals: WindowTotals, **changes: Any) -> WindowTotals:
    return WindowTotals(**{**asdict(totals), **changes})
