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
from dataclasses import dataclass

import numpy as np

from core.metrics.smooth_goodput import idle_and_benefit, token_due_s
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

# Chunk elements processed per batch: about 2 MB per float64 working array (a batch's temporaries stay
# small beside the ITL array itself; results do not depend on the batching, tests/test_metrics.py).
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
    itl_s: np.ndarray  # all gaps between chunks of ok requests (empty unless collect_itl)

    def __len__(self) -> int:
        return len(self.arrival_s)


def _chunk_pass(
    times_list: list[np.ndarray],
    tokens_list: list[np.ndarray | None],
    arrival: np.ndarray,
    ok: np.ndarray,
    smooth: SmoothGoodputSpec,
    collect_itl: bool,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """First-chunk time, delivered tokens and max lateness per request, plus ITL gaps of ok requests.

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
        return first, delivered, max_late, np.empty(0)
    counts_all = np.fromiter(map(len, times_list), dtype=np.int64, count=n)
    # The gaps fill one array sized up front (each ok request has one gap fewer than chunks): collecting
    # parts and concatenating them held every gap twice at the peak.
    itl = np.empty(int((counts_all[ok] - 1).sum()) if collect_itl else 0)
    itl_filled = 0
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
        seg = np.repeat(np.arange(m), counts)
        batch_tokens = tokens_list[lo:hi]
        if any(tk is not None for tk in batch_tokens):
            tok = np.ones(len(flat_t), dtype=np.int64)
            for j, tk in enumerate(batch_tokens):
                if tk is not None:
                    tok[starts[j] : starts[j] + counts[j]] = tk
            before = np.cumsum(tok) - tok  # tokens before each chunk, counted from the batch start
            before -= before[starts][seg]  # ... now from the request's start
            delivered[lo:hi] = np.add.reduceat(tok, starts)
        else:
            before = np.arange(len(flat_t)) - starts[seg]
            delivered[lo:hi] = counts
        deadline = token_due_s(arrival[lo:hi][seg], before, smooth)
        max_late[lo:hi] = np.maximum.reduceat(flat_t - deadline, starts)
        first[lo:hi] = flat_t[starts]
        if collect_itl:
            itl_filled = _fill_gaps(itl, itl_filled, flat_t, starts, counts, ok[lo:hi])
        lo = hi
    return first, delivered, max_late, itl


def _fill_gaps(
    itl: np.ndarray, filled: int, flat_t: np.ndarray, starts: np.ndarray, counts: np.ndarray, batch_ok: np.ndarray
) -> int:
    """Write the ITL gaps of a batch of concatenated chunk times into itl[filled:]; returns the new fill."""
    if len(flat_t) < 2:
        return filled
    gaps = np.diff(flat_t)
    # A gap counts only inside one request (not across the seam to the next) of an ok request.
    keep = np.ones(len(gaps), dtype=bool)
    keep[starts[1:] - 1] = False  # the seams: gap j joins chunk j to chunk j + 1 = the next start
    if not batch_ok.all():
        keep &= np.repeat(batch_ok, counts)[1:]
    kept = gaps[keep]
    itl[filled : filled + len(kept)] = kept
    return filled + len(kept)


def itl_gaps(records: Sequence[RequestRecord], ok: np.ndarray) -> np.ndarray:
    """The ITL gaps `compute_outcomes(records, collect_itl=True).itl_s` gives, in the same order, without
    judging the records again (`summarize` with outcomes the live window already computed). Only ok
    records with two chunks or more have gaps (a record that was not streamed has one chunk)."""
    times_list = [
        times
        for rec, is_ok in zip(records, ok.tolist(), strict=True)
        if is_ok and (times := rec.chunk_times) is not None and len(times) > 1
    ]
    n = len(times_list)
    counts_all = np.fromiter(map(len, times_list), dtype=np.int64, count=n)
    itl = np.empty(int((counts_all - 1).sum()))
    filled = 0
    ends_all = np.cumsum(counts_all)
    all_ok = np.ones(n, dtype=bool)
    lo = 0
    while lo < n:
        base = ends_all[lo - 1] if lo else 0
        hi = max(int(np.searchsorted(ends_all, base + _CHUNK_BATCH, side="right")), lo + 1)
        counts = counts_all[lo:hi]
        starts = np.zeros(hi - lo, dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        flat_t = np.concatenate(times_list[lo:hi]).astype(float, copy=False)
        filled = _fill_gaps(itl, filled, flat_t, starts, counts, all_ok[lo:hi])
        lo = hi
    return itl


def compute_outcomes(
    records: Sequence[RequestRecord],
    *,
    fallback_slo: SLOSpec | RequestSLO,
    smooth: SmoothGoodputSpec,
    collect_itl: bool = True,
) -> RequestOutcomes:
    """Judge every record given (the caller has already dropped warm-up records)."""
    fallback = _slo_tuple(fallback_slo)
    slo_cache: dict[RequestSLO, tuple[float, float, float]] = {}
    task_codes: dict[str, int] = {}

    n = len(records)
    arrival: list[float] = []
    end: list[float] = []
    status_code: list[int] = []
    task_code: list[int] = []
    output_tokens: list[int] = []
    slos: list[tuple[float, float, float]] = []
    chunk_rows: list[int] = []
    times_list: list[np.ndarray] = []
    tokens_list: list[np.ndarray | None] = []

    for i, rec in enumerate(records):
        arrival.append(rec.arrival_s)
        end_s = rec.end_s
        end.append(NAN if end_s is None else end_s)
        code = _STATUS_CODE[rec.status]
        status_code.append(code)
        task = rec.task
        tcode = task_codes.get(task)
        if tcode is None:
            tcode = task_codes[task] = len(task_codes)
        task_code.append(tcode)
        n_out = rec.output_tokens
        output_tokens.append(n_out)
        slo = rec.slo
        resolved = slo_cache.get(slo)
        if resolved is None:
            own = _slo_tuple(slo)
            resolved = fallback if all(math.isnan(v) for v in own) else own
            slo_cache[slo] = resolved
        slos.append(resolved)
        times = rec.chunk_times
        if times is not None and len(times):
            chunk_rows.append(i)
            times_list.append(times)
            tokens_list.append(rec.chunk_tokens)
        elif code == OK_CODE and end_s is not None and n_out > 0:
            # Not streamed: the whole response arrives at the end, as one chunk.
            chunk_rows.append(i)
            times_list.append(np.array([end_s]))
            tokens_list.append(np.array([n_out]))

    arrival_a = np.array(arrival, dtype=float)
    end_a = np.array(end, dtype=float)
    status_a = np.array(status_code, dtype=np.int64)
    ok = status_a == OK_CODE
    out_tok = np.array(output_tokens, dtype=np.int64)
    slo_a = np.array(slos, dtype=float).reshape(n, 3)
    slo_e2e, slo_ttft, slo_tpot = slo_a[:, 0], slo_a[:, 1], slo_a[:, 2]

    rows = np.array(chunk_rows, dtype=np.int64)
    first_c, delivered_c, late_c, itl = _chunk_pass(
        times_list, tokens_list, arrival_a[rows], ok[rows], smooth, collect_itl
    )
    first = np.full(n, NAN)
    first[rows] = first_c
    delivered = np.zeros(n, dtype=np.int64)
    delivered[rows] = delivered_c
    max_late = np.full(n, NAN)
    max_late[rows] = late_c

    # ---- latencies (vllm bench serve definitions), ok requests only
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
    idle, benefit = idle_and_benefit(max_late, ok, arrival_a, end_a, out_tok, delivered, smooth)

    return RequestOutcomes(
        arrival_s=arrival_a,
        end_s=end_a,
        status_code=status_a,
        ok=ok,
        task_code=np.array(task_code, dtype=np.int64),
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
        itl_s=itl,
    )


def gather_outcomes(parts: Sequence[RequestOutcomes], order: np.ndarray) -> RequestOutcomes:
    """Outcomes judged in parts, concatenated and taken in `order` (positions into the concatenation): the
    columns `compute_outcomes` gives for the records in that order, task codes by first appearance as there.
    No ITL gaps (`itl_gaps` gives them)."""
    names: dict[str, int] = {}
    codes = []
    for part in parts:
        to_global = np.array([names.setdefault(name, len(names)) for name in part.task_names], dtype=np.int64)
        codes.append(to_global[part.task_code] if len(to_global) else part.task_code)
    global_code = np.concatenate(codes)[order]
    present, first_seen = np.unique(global_code, return_index=True)
    by_appearance = present[np.argsort(first_seen)]
    recode = np.empty(len(names), dtype=np.int64)
    recode[by_appearance] = np.arange(len(by_appearance))
    global_names = list(names)

    def column(name: str) -> np.ndarray:
        return np.concatenate([getattr(part, name) for part in parts])[order]

    return RequestOutcomes(
        **{name: column(name) for name in _PER_REQUEST_COLUMNS},
        task_code=recode[global_code],
        task_names=[global_names[code] for code in by_appearance],
        itl_s=np.empty(0),
    )


_PER_REQUEST_COLUMNS = tuple(
    name for name in RequestOutcomes.__slots__ if name not in ("task_code", "task_names", "itl_s")
)


def idle_latency_s(record: RequestRecord, smooth: SmoothGoodputSpec) -> float:
    """User idle latency of one record (paper 003 eq. 6), with the same rules as the summaries."""
    return float(compute_outcomes([record], fallback_slo=RequestSLO(), smooth=smooth).idle_s[0])


def benefit(record: RequestRecord, smooth: SmoothGoodputSpec) -> float:
    """Benefit of one record in tokens (paper 003 eq. 7)."""
    return float(compute_outcomes([record], fallback_slo=RequestSLO(), smooth=smooth).benefit[0])
