"""Per-request outcomes for many records at once: latencies, SLO verdicts, idle latency and benefit.

This is the one place where a `RequestRecord` is turned into numbers. `summarize` (whole run) and
`WindowedAggregator` (live panels) both call `compute_outcomes`, so a request is judged the same way in
the final summary and on the live screen.

Speed: the simulator hands out 100k records of a few hundred chunks each. A Python loop over records
reads the scalar fields (cheap); everything that grows with tokens is done on concatenated chunk arrays,
in batches so memory stays bounded, with segment reductions (`np.maximum.reduceat`, `np.add.reduceat`).

Choices for cases the papers leave open (also listed in docs/metrics.md):
- A record whose own SLO has every field None takes the run's SLO (`fallback_slo`); a record with any
  field set uses its own SLO as is (the workload has already resolved task SLOs against the profile).
- TPOT is defined for n > 1 only; for the SLO verdict a request with n <= 1 passes its TPOT SLO, as
  `vllm bench serve` does for goodput (it sets TPOT to 0 there).
- A completed request with no chunk times but output tokens was not streamed: its whole response arrives
  at its end, so TTFT = e2e and its tokens form one chunk at end_s.
- Failed requests never meet an SLO. How they count in smooth goodput: core/metrics/smooth_goodput.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from struct import pack_into
from typing import Any, cast

import numpy as np

from core.metrics.smooth_goodput import chunk_due_s, idle_and_benefit
from core.pickling import reduce_by_fields
from core.profile import SLOSpec, SmoothGoodputSpec
from core.records import RequestRecord, RequestSLO, Status

NAN = float("nan")

# Status codes in outcome arrays: index into this tuple.
STATUSES: tuple[Status, ...] = tuple(Status)
_STATUS_CODE: dict[str, int] = {status.value: code for code, status in enumerate(STATUSES)}
OK_CODE = _STATUS_CODE[Status.OK.value]

# SLO verdicts are "latency <= objective", inclusive. Latencies are differences of timestamps, so a
# latency exactly at the objective can come out a few ulps above it (3.2 - 2.0 > 1.2); 1 ns, below any
# clock's resolution here, keeps such a request on the side of the line it is really on.
SLO_TOLERANCE_S = 1e-9

# Chunk elements processed per batch: about 2 MB per float64 working array, so a batch's temporaries stay
# small (results do not depend on the batching, tests/test_metrics.py).
_CHUNK_BATCH = 1 << 18


def _slo_tuple(slo: RequestSLO | SLOSpec) -> tuple[float, float, float]:
    def value(v: float | None) -> float:
        return NAN if v is None else float(v)

    return value(slo.e2e_s), value(slo.ttft_s), value(slo.tpot_s)


@dataclass(slots=True)
class RequestOutcomes:
    """Column arrays, one entry per record (in the order given). NaN marks an undefined value."""

    arrival_s: np.ndarray
    end_s: np.ndarray
    status_code: np.ndarray  # index into STATUSES
    ok: np.ndarray
    task_code: np.ndarray  # index into task_names
    task_names: list[str]
    output_tokens: np.ndarray  # as reported by the record (vllm bench uses the server's usage count)
    e2e_s: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    slo_e2e_s: np.ndarray  # NaN: no e2e SLO applies
    slo_ttft_s: np.ndarray
    slo_tpot_s: np.ndarray
    good: np.ndarray  # counts toward goodput (paper 000 eq. 1)
    attained: np.ndarray  # met every SLO that applies
    idle_s: np.ndarray  # user idle latency (paper 003 eq. 6); NaN when nothing can be said
    benefit: np.ndarray  # paper 003 eq. 7; 0 where idle_s is NaN

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    def __len__(self) -> int:
        return len(self.arrival_s)


# 0.0, 1.0, 2.0, ... in float64, as long as the largest batch of chunks judged so far (a window batch of 250
# records: about 50k, 0.4 MB): each batch reads its chunk positions here instead of filling an arange anew (8
# instructions a chunk, 21M chunks in a 100k-request run).
_positions = np.empty(0)


def _chunk_positions(n: int) -> np.ndarray:
    """[0.0, 1.0, ..., n - 1.0] (a read-only view: exact integers, the same doubles as an arange)."""
    global _positions
    if len(_positions) < n:
        _positions = np.arange(n, dtype=np.float64)
        _positions.flags.writeable = False
    return _positions[:n]


def _chunk_pass(
    times_list: list[np.ndarray],
    tokens_list: list[np.ndarray | None],
    arrival: np.ndarray,
    smooth: SmoothGoodputSpec,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First-chunk time, delivered tokens and max lateness per request (ITL gaps: core/metrics/itl.py).

    Lateness of token i is t_i - d_i with d_i = a + first + (i - 1)/V, where first = 1/V gives paper 003's
    eq. 4 (d_i = a + i/V) and a first-token allowance, if the profile sets one, replaces it. Inside one
    chunk t is constant and d grows with i, so the maximum over a chunk's tokens is at its first token:
    only chunk starts are evaluated.
    """
    n = len(times_list)
    first = np.empty(n)
    delivered = np.empty(n, dtype=np.int64)
    max_late = np.empty(n)
    if n == 0:
        return first, delivered, max_late
    counts_all = np.fromiter(map(len, times_list), dtype=np.int64, count=n)
    ends_all = np.cumsum(counts_all)
    lo = 0
    while lo < n:
        # Take records until the batch holds about _CHUNK_BATCH chunks (at least one record).
        base = ends_all[lo - 1] if lo else 0
        hi = int(np.searchsorted(ends_all, base + _CHUNK_BATCH, side="right"))
        hi = max(hi, lo + 1)
        counts = counts_all[lo:hi]
        m = hi - lo
        flat_t = np.concatenate(times_list[lo:hi]).astype(float, copy=False)
        starts = np.zeros(m, dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        # Per-record values spread over their chunks with np.repeat (the same values as indexing by each
        # chunk's record, in fewer passes over the chunks).
        batch_tokens = tokens_list[lo:hi]
        if any(tk is not None for tk in batch_tokens):
            tok = np.ones(len(flat_t), dtype=np.int64)
            for j, tk in enumerate(batch_tokens):
                if tk is not None:
                    tok[starts[j] : starts[j] + counts[j]] = tk
            before_int = np.cumsum(tok) - tok  # tokens before each chunk, counted from the batch start
            before_int -= np.repeat(before_int[starts], counts)  # ... now from the request's start
            before = before_int.astype(np.float64)  # exact (counts below 2**53), as token_due_s's division casts
            delivered[lo:hi] = np.add.reduceat(tok, starts)
        else:
            # One token per chunk: chunk k of the batch has k - start of its request before it (in floats,
            # exact for counts below 2**53, so the same as the integers cast).
            before = np.repeat(starts.astype(np.float64), counts)  # floats: no cast per chunk below
            np.subtract(_chunk_positions(len(flat_t)), before, out=before)
            delivered[lo:hi] = counts
        late = chunk_due_s(arrival[lo:hi], counts, before, smooth)
        np.subtract(flat_t, late, out=late)  # lateness of each chunk's first token
        max_late[lo:hi] = np.maximum.reduceat(late, starts)
        first[lo:hi] = flat_t[starts]
        lo = hi
    return first, delivered, max_late


def compute_outcomes(
    records: Sequence[RequestRecord],
    *,
    fallback_slo: SLOSpec | RequestSLO,
    smooth: SmoothGoodputSpec,
) -> RequestOutcomes:
    """Judge every record given (the caller has already dropped warm-up records)."""
    fallback = _slo_tuple(fallback_slo)
    # By identity: records share a few SLO objects, and hashing a frozen dataclass per record was most of
    # this loop's cost. Equal SLOs that are different objects resolve to equal tuples, so nothing changes.
    slo_cache: dict[int, int] = {}  # id(slo) -> its row in slo_rows
    task_codes: dict[str, int] = {}

    n = len(records)
    # One loop over the records (compiled, the fields are native reads) into a list per column; the float
    # columns become one array and the int columns another, cut into column views. Consecutive records mostly
    # share their status, task and SLO objects: an identity test with the previous record's skips the dict
    # lookups (a Status key compares slowly against the str keys).
    times_flat: list[float] = []  # arrivals
    ends: list[float] = []  # NaN: never ended
    codes: list[int] = []  # status codes
    task_col: list[int] = []
    tokens_col: list[int] = []
    slo_rows: list[tuple[float, float, float]] = []
    slo_row_of: list[int] = []
    chunk_rows: list[int] = []
    times_list: list[np.ndarray] = []
    tokens_list: list[np.ndarray | None] = []
    last_status: object = None
    last_status_code = -1
    last_task: object = None
    last_task_code = -1
    last_slo: object = None
    last_slo_row = -1
    completed = 0
    ok_code = OK_CODE  # a local: a module global is a dict lookup per read in compiled code
    for i, rec in enumerate(records):
        times_flat.append(rec.arrival_s)
        end_s = rec.end_s
        ends.append(NAN if end_s is None else end_s)
        status = rec.status
        if status is not last_status:
            last_status = status
            last_status_code = _STATUS_CODE[status]
        codes.append(last_status_code)
        task = rec.task
        if task is not last_task:
            last_task = task
            found = task_codes.get(task)
            if found is None:
                found = task_codes[task] = len(task_codes)
            last_task_code = found
        task_col.append(last_task_code)
        out_tokens = rec.output_tokens
        tokens_col.append(out_tokens)
        slo = rec.slo
        if slo is not last_slo:
            last_slo = slo
            row = slo_cache.get(id(slo))
            if row is None:
                own = _slo_tuple(slo)
                row = slo_cache[id(slo)] = len(slo_rows)
                slo_rows.append(fallback if all(math.isnan(v) for v in own) else own)
            last_slo_row = row
        slo_row_of.append(last_slo_row)
        is_ok = last_status_code == ok_code
        if is_ok:
            completed += 1
        times = rec.chunk_times
        if times is not None and len(times):
            chunk_rows.append(i)
            times_list.append(times)
            tokens_list.append(rec.chunk_tokens)
        elif is_ok and end_s is not None and out_tokens > 0:
            # Not streamed: the whole response arrives at the end, as one chunk.
            chunk_rows.append(i)
            times_list.append(np.array([end_s]))
            tokens_list.append(np.array([out_tokens]))
    # The columns written into their arrays by struct: the same doubles and int64s as np.array of the lists
    # gives (None was NaN there too), for about a third of its per-element cost.
    both = np.empty(2 * n)
    pack_into(f"{2 * n}d", cast(Any, both), 0, *times_flat, *ends)  # (typeshed: an ndarray is no Buffer)
    arrival_a, end_a = both[:n], both[n:]
    ints = np.empty(3 * n, dtype=np.int64)
    pack_into(f"{3 * n}q", cast(Any, ints), 0, *codes, *task_col, *tokens_col)
    status_a, task_a, out_tok = ints[:n], ints[n : 2 * n], ints[2 * n :]
    all_ok = completed == n
    ok = np.ones(n, dtype=bool) if all_ok else status_a == OK_CODE
    if len(slo_rows) == 1:  # one SLO for the whole batch: its row in every row
        slo_a = np.empty((n, 3))
        slo_a[:] = slo_rows[0]
    else:
        slo_index = np.empty(n, dtype=np.int64)
        pack_into(f"{n}q", cast(Any, slo_index), 0, *slo_row_of)
        slo_a = np.array(slo_rows, dtype=float).reshape(-1, 3)[slo_index]
    slo_e2e, slo_ttft, slo_tpot = slo_a[:, 0], slo_a[:, 1], slo_a[:, 2]

    if len(chunk_rows) == n:
        # Every record has chunks (the usual batch): the chunk pass's columns are the records' columns.
        first, delivered, max_late = _chunk_pass(times_list, tokens_list, arrival_a, smooth)
    else:
        rows = np.array(chunk_rows, dtype=np.int64)
        first_c, delivered_c, late_c = _chunk_pass(times_list, tokens_list, arrival_a[rows], smooth)
        first = np.full(n, NAN)
        first[rows] = first_c
        delivered = np.zeros(n, dtype=np.int64)
        delivered[rows] = delivered_c
        max_late = np.full(n, NAN)
        max_late[rows] = late_c

    # ---- latencies (vllm bench serve definitions), ok requests only
    if all_ok:  # np.where(ok, x, NAN) is x itself
        e2e = end_a - arrival_a
        ttft = first - arrival_a
    else:
        e2e = np.where(ok, end_a - arrival_a, NAN)
        ttft = np.where(ok, first - arrival_a, NAN)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(ok & (out_tok > 1), (end_a - first) / (out_tok - 1), NAN)

    # ---- SLO verdicts. A comparison with NaN is False, so an undefined latency fails an applicable SLO.
    e2e_met = np.isnan(slo_e2e) | (e2e <= slo_e2e + SLO_TOLERANCE_S)
    ttft_met = np.isnan(slo_ttft) | (ttft <= slo_ttft + SLO_TOLERANCE_S)
    tpot_for_slo = np.where(ok & (out_tok <= 1), 0.0, tpot)  # n <= 1 passes, as vllm bench
    tpot_met = np.isnan(slo_tpot) | (tpot_for_slo <= slo_tpot + SLO_TOLERANCE_S)
    attained = ok & e2e_met & ttft_met & tpot_met
    # Goodput (paper 000 eq. 1, `vllm bench serve --goodput`): a request counts when it completed and every
    # SLO given for it holds (e2e, TTFT, TPOT); one with no SLO at all counts as good.
    good = attained

    # ---- user idle latency and benefit (paper 003 eqs. 6-7)
    idle, benefit = idle_and_benefit(max_late, ok, arrival_a, end_a, out_tok, delivered, smooth, all_ok=all_ok)

    return RequestOutcomes(
        arrival_s=arrival_a,
        end_s=end_a,
        status_code=status_a,
        ok=ok,
        task_code=task_a,
        task_names=list(task_codes),
        output_tokens=out_tok,
        e2e_s=e2e,
        ttft_s=ttft,
        tpot_s=tpot,
        slo_e2e_s=slo_e2e,
        slo_ttft_s=slo_ttft,
        slo_tpot_s=slo_tpot,
        good=good,
        attained=attained,
        idle_s=idle,
        benefit=benefit,
    )


class OutcomeStore:
    """Outcomes judged in batches, appended into growing columns in the order the batches came: what the live
    window keeps so that the run's summary takes them without judging the records again. Columns are filled in
    place (capacity doubles), so handing them over copies nothing."""

    def __init__(self) -> None:
        self._columns: dict[str, np.ndarray] = {}
        self._n = 0
        self._task_codes: dict[str, int] = {}  # across batches, by first appearance

    def __len__(self) -> int:
        return self._n

    def append(self, part: RequestOutcomes) -> None:
        to_global = np.array(
            [self._task_codes.setdefault(name, len(self._task_codes)) for name in part.task_names], dtype=np.int64
        )
        values = {name: getattr(part, name) for name in _PER_REQUEST_COLUMNS}
        values["task_code"] = to_global[part.task_code] if len(to_global) else part.task_code
        m, n = len(part), self._n
        capacity = len(self._columns["task_code"]) if self._columns else 0
        if n + m > capacity:
            capacity = max(2 * capacity, n + m, 1024)
            for name, value in values.items():
                grown = np.empty(capacity, dtype=value.dtype)
                if name in self._columns:
                    grown[:n] = self._columns[name][:n]
                self._columns[name] = grown
        for name, value in values.items():
            self._columns[name][n : n + m] = value
        self._n = n + m

    def gather(self, order: np.ndarray | None) -> RequestOutcomes:
        """The outcomes taken in `order` (positions in the store; None: as stored, as views): the columns
        `compute_outcomes` gives for the records in that order, task codes by first appearance as there."""
        n = self._n

        def column(name: str) -> np.ndarray:
            stored = self._columns[name][:n]
            return stored if order is None else stored[order]

        global_code = column("task_code")
        present, first_seen = np.unique(global_code, return_index=True)
        by_appearance = present[np.argsort(first_seen)]
        recode = np.empty(len(self._task_codes), dtype=np.int64)
        recode[by_appearance] = np.arange(len(by_appearance))
        global_names = list(self._task_codes)
        return RequestOutcomes(
            **{name: column(name) for name in _PER_REQUEST_COLUMNS},
            task_code=recode[global_code],
            task_names=[global_names[code] for code in by_appearance],
        )


_PER_REQUEST_COLUMNS = tuple(
    name for name in (f.name for f in fields(RequestOutcomes)) if name not in ("task_code", "task_names")
)


def idle_latency_s(record: RequestRecord, smooth: SmoothGoodputSpec) -> float:
    """User idle latency of one record (paper 003 eq. 6), with the same rules as the summaries."""
    return float(compute_outcomes([record], fallback_slo=RequestSLO(), smooth=smooth).idle_s[0])


def benefit(record: RequestRecord, smooth: SmoothGoodputSpec) -> float:
    """Benefit of one record in tokens (paper 003 eq. 7)."""
    return float(compute_outcomes([record], fallback_slo=RequestSLO(), smooth=smooth).benefit[0])
