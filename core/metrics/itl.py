"""The run's inter-token latency (ITL) summary, exact, without holding every gap at once.

An ITL gap is the time between two consecutive chunks of one ok request (vllm bench serve's ITL). A 100k-request
run has about 21M of them, and one array of them was the largest thing a summary held (168 MB at 100k, 1.7 GB at
1M). Here the gaps are generated block by block from the records' chunk times, in the order the array had, and
the summary is the same to the bit as numpy's over that array:

- the mean is `np.mean(gaps)`: numpy sums a contiguous float64 array pairwise (split at n/2 rounded down to a
  multiple of 8, down to blocks of 128); `_pairwise_sum` follows the same splits down to blocks of at most
  `_LEAF` gaps and lets numpy sum each block, which is exactly the subtree numpy would have summed there;
- the percentiles are `np.percentile(gaps, q, method="linear")`: the two order statistics around each virtual
  index (q * (n - 1)) are found by selection (a histogram of the values' leading bits over all gaps, then the
  exact rank among the few values that share the wanted bins), and interpolated with numpy's formula (`_lerp`).

tests/test_metrics_itl.py holds both equal to numpy's over the materialised array.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from core.records import RequestRecord

NAN = float("nan")
_FLOAT64 = np.dtype(np.float64)

# Gaps materialised at once: at most 1 MB of float64 per block (a few such temporaries live at once; the run's peak
# is elsewhere). Each block costs ~0.1 ms besides its gaps (a concatenation of ~100 records' views, ~20 numpy
# calls): 2^15 made a 100k bench-chat run's mean pass 1024 blocks (190-270 ms, pure), 2^17 makes it 256 (120-140 ms).
# At least numpy's pairwise block (128): below it numpy no longer splits (it sums with eight accumulators), so a
# smaller leaf would not be one of its subtrees.
_LEAF = 1 << 17
# Histogram bins: the top 20 bits of a value's order-preserving integer key (sign, exponent, 8 mantissa bits),
# so one bin spans 1/256 of a binade and holds few of the gaps. Only the span of bins the values reach is
# counted (a few thousand for latencies; 2^20, 8 MB, at the very most).
_BIN_SHIFT = 44
# Up to this many gaps (8 MB) the series is materialised once and partitioned at the wanted ranks: the same
# order statistics without the histogram's two passes, which cost more than they save on a short run (a tune
# segment's 1,600 requests).
_MATERIALISE = 1 << 20
# Step gaps priced at once when a multiset's pieces are made (64 kB per temporary).
_PIECE = 1 << 13


class GapSeries:
    """The ITL gaps of ok records, in record order, as a virtual array readable in blocks."""

    def __init__(self, records: Sequence[RequestRecord], ok: np.ndarray) -> None:
        self._times = [
            times
            for rec, is_ok in zip(records, ok.tolist(), strict=True)
            if is_ok and (times := rec.chunk_times) is not None and len(times) > 1
        ]
        # Gaps of each record, and where each record's gaps end in the virtual array.
        self._ends = np.cumsum(np.fromiter((len(t) - 1 for t in self._times), dtype=np.int64, count=len(self._times)))

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def shared_blocks(self) -> tuple[list[np.ndarray], list[int]] | None:
        """The 1-D float64 blocks whose views the records' chunk times are, and each record's block (its index
        there, -1: not such a view); None when the records that are not hold more than 1/16 of the gaps.

        A simulated record's chunk times are a view of its replica's step-time block (core/sim/replica.py
        `_complete`), so every request decoding across a step has the same gap there: a 100k bench-chat run's
        21M gaps are 0.86M step gaps, each repeated by the requests decoding across it (`multiset`)."""
        blocks: list[np.ndarray] = []
        block_of: list[int] = []
        last_base: object = None
        last_block = -1
        for view in self._times:
            base = view.base
            if base is not last_base:  # records in completion order: runs of one replica's block
                last_base = base
                last_block = _block_index(blocks, base)
            block_of.append(last_block if view.dtype is _FLOAT64 else -1)
        loose = np.array(block_of, dtype=np.int32) < 0
        if int(np.diff(self._ends, prepend=0)[loose].sum()) * 16 > len(self):
            return None
        return blocks, block_of

    def multiset(
        self, shared: tuple[list[np.ndarray], list[int]], chunk_ends: tuple[np.ndarray, np.ndarray]
    ) -> GapMultiset | None:
        """The series' gaps as step gaps with counts, given `shared_blocks` and each record's first and last
        chunk times (`blocks(chunk_ends)` fills them); None if the records counted gap by gap would hold more
        than 1/16 of the gaps, or a gap is not positive (the order statistics of positive values are their
        values, whatever their order; zeros of both signs or NaN would not be).

        A view's place in its block is found by value: a block's times rise strictly up to the last step run
        (past it np.empty's bytes may lie), and a view of n chunks whose first and last times sit there, n - 1
        places apart, is that slice (any other stride or place would end at another time)."""
        blocks, block_of = shared
        firsts, lasts = chunk_ends
        block_ids = np.array(block_of, dtype=np.int32)
        chunks = np.diff(self._ends, prepend=0) + 1
        loose = block_ids < 0
        steps: list[SharedSteps] = []
        for index, block in enumerate(blocks):
            members = np.flatnonzero(block_ids == index)
            found, sliced = _shared_steps(block, firsts[members], lasts[members], chunks[members])
            if found is not None:
                steps.append(found)
            loose[members[~sliced]] = True
        if int(chunks[loose].sum() - np.count_nonzero(loose)) * 16 > len(self):
            return None
        own_records = np.flatnonzero(loose).tolist()
        own = [_own_gaps([self._times[k] for k in own_records[i : i + 64]]) for i in range(0, len(own_records), 64)]
        if not all(bool(np.all(gaps > 0)) for gaps in own):
            return None
        return GapMultiset(len(self), steps, own)

    def block(self, lo: int, hi: int, chunk_ends: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """Gaps [lo, hi) of the virtual array. `chunk_ends`: (first, last) chunk time of each record, filled
        for the records the block reads."""
        ends = self._ends
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(ends, hi, side="left")) + 1  # records first..last-1 hold the range
        times = self._times[first:last]
        counts = np.fromiter(map(len, times), dtype=np.int64, count=len(times))
        flat = np.concatenate(times).astype(float, copy=False)
        last_chunks = np.cumsum(counts) - 1  # where each record's last chunk sits in `flat`
        if chunk_ends is not None:
            chunk_ends[0][first:last] = flat[last_chunks - counts + 1]
            chunk_ends[1][first:last] = flat[last_chunks]
        gaps = np.diff(flat)
        # Gap j joins chunk j to chunk j + 1; the seams between two records are not gaps.
        keep = np.ones(len(gaps), dtype=bool)
        keep[last_chunks[:-1]] = False
        gaps = gaps[keep]
        offset = lo - (int(ends[first - 1]) if first else 0)
        return gaps[offset : offset + (hi - lo)]

    def unordered_blocks(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every gap once, for a pass that does not care about their order or their blocks' bounds (the
        selection): (gaps, seams) for groups of whole records of about _LEAF gaps, where `seams` are the
        positions that join one record to the next. Those are not gaps: each holds a copy of the gap before
        it (its record's last), so that every value in the array is a gap, and the caller drops them. That
        spares `block`'s mask and compaction of each block."""
        ends = self._ends
        times = self._times
        start = 0
        while start < len(times):
            base = int(ends[start - 1]) if start else 0
            stop = max(int(np.searchsorted(ends, base + _LEAF, side="right")), start + 1)
            gaps = np.diff(np.concatenate(times[start:stop]).astype(float, copy=False))
            # Record j's last chunk sits at (its gaps up to it) + (j + 1 chunks of the records so far) - 1.
            seams = ends[start : stop - 1] - base + np.arange(start, stop - 1) - (start - 1) - 1
            gaps[seams] = gaps[seams - 1]
            yield gaps, seams
            start = stop

    def blocks(self, chunk_ends: tuple[np.ndarray, np.ndarray] | None = None) -> Iterator[np.ndarray]:
        """The whole series, in blocks of at most _LEAF gaps laid out as `_pairwise_sum` splits it (see `block`
        for `chunk_ends`)."""
        for lo, n in _leaves(0, len(self)):
            yield self.block(lo, lo + n, chunk_ends)

    def chunk_ends(self) -> tuple[np.ndarray, np.ndarray]:
        """Room for each record's first and last chunk time (`blocks` fills it)."""
        return np.empty(len(self._times)), np.empty(len(self._times))


def _block_index(blocks: list[np.ndarray], base: Any) -> int:
    """`base`'s index in `blocks` (appended if new), or -1 if it is no 1-D float64 array. (`base` is Any, not
    object: `pip install .` type-checks this module where numpy is not installed yet, and there the `type(base)
    is np.ndarray` test narrows nothing.)"""
    if type(base) is not np.ndarray or base.ndim != 1 or base.dtype is not _FLOAT64:
        return -1
    for index, block in enumerate(blocks):
        if block is base:
            return index
    blocks.append(base)
    return len(blocks) - 1


class SharedSteps:
    """Views of one step-time block that rises strictly over its first `rising` times: view k covers the
    block's step gaps starts[k] .. ends[k] - 1 (gap j runs from time j to time j + 1)."""

    def __init__(self, block: np.ndarray, rising: int, starts: np.ndarray, ends: np.ndarray) -> None:
        self.block = block
        self.rising = rising
        self.starts = starts
        self.ends = ends

    def pieces(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(step gaps, how many views cover each) of the covered gaps, a few thousand steps at a time."""
        steps = self.rising - 1
        # Views that start at or before each step, less those that ended at or before it.
        cover = np.cumsum(
            np.bincount(self.starts, minlength=steps + 1)[:steps] - np.bincount(self.ends, minlength=steps + 1)[:steps]
        )
        for lo in range(int(self.starts.min()), int(self.ends.max()), _PIECE):
            top = min(lo + _PIECE, steps)
            counts = cover[lo:top]
            used = counts > 0
            yield np.diff(self.block[lo : top + 1])[used], counts[used]


def _shared_steps(
    block: np.ndarray, firsts: np.ndarray, lasts: np.ndarray, chunks: np.ndarray
) -> tuple[SharedSteps | None, np.ndarray]:
    """The views of `block` (given by their first and last times and lengths) that are slices of its strictly
    rising start, and which of them are (a mask)."""
    rising = len(block)
    if rising > 1:
        falls = np.flatnonzero(~(np.diff(block) > 0))  # NaN too
        if len(falls):
            rising = int(falls[0]) + 1  # block[:rising] rises strictly
    starts = np.searchsorted(block[:rising], firsts)
    ends = starts + chunks - 1  # where the last time is if the view is the slice that starts there
    sliced = (ends < rising) & (block[np.minimum(starts, rising - 1)] == firsts)
    sliced &= block[np.minimum(ends, rising - 1)] == lasts
    if rising < 2 or not sliced.any():
        return None, np.zeros_like(sliced)
    return SharedSteps(block, rising, starts[sliced], ends[sliced]), sliced


def _own_gaps(views: list[np.ndarray]) -> np.ndarray:
    """The gaps of the given records' chunk times, record after record."""
    flat = np.diff(np.concatenate(views).astype(float, copy=False))
    counts = np.fromiter(map(len, views), dtype=np.int64, count=len(views))
    return np.delete(flat, np.cumsum(counts[:-1]) - 1)  # the joins between records are no gaps


class GapMultiset:
    """A series' gaps as (value, count) pieces: the shared step gaps and the records' own gaps (count 1)."""

    def __init__(self, n: int, shared: list[SharedSteps], own: list[np.ndarray]) -> None:
        self.n = n
        self.shared = shared
        self.own = own

    def pieces(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for steps in self.shared:
            yield from steps.pieces()
        for gaps in self.own:
            yield gaps, np.ones(len(gaps), dtype=np.int64)

    def order_stats(self, ranks: list[int]) -> dict[int, float]:
        """The values at the given ranks (0-based, ascending) of the multiset: a histogram of the values' bins
        weighted by their counts, then the values and counts of the bins that hold those ranks, sorted."""
        histogram = _BinCounts()
        for values, counts in self.pieces():
            histogram.add(_bins(values), counts)
        if int(histogram.counts.sum()) != self.n:
            raise AssertionError(f"the gap multiset counts {int(histogram.counts.sum())} gaps of {self.n}")
        up_to = np.cumsum(histogram.counts)
        position_of = {rank: int(np.searchsorted(up_to, rank, side="right")) for rank in ranks}
        positions = sorted(set(position_of.values()))
        slot_of_bin = np.full(len(histogram.counts), -1, dtype=np.int32)
        slot_of_bin[positions] = np.arange(len(positions))
        found_values: list[list[np.ndarray]] = [[] for _ in positions]
        found_counts: list[list[np.ndarray]] = [[] for _ in positions]
        for values, counts in self.pieces():
            slot = slot_of_bin[_bins(values) - histogram.first]
            wanted = np.flatnonzero(slot >= 0)
            values, counts, slot = values[wanted], counts[wanted], slot[wanted]
            for j in range(len(positions)):
                here = slot == j
                found_values[j].append(values[here])
                found_counts[j].append(counts[here])
        result = {}
        for j, p in enumerate(positions):
            values = np.concatenate(found_values[j])
            order = np.argsort(values)
            up_to_here = np.cumsum(np.concatenate(found_counts[j])[order])
            below = int(up_to[p] - histogram.counts[p])  # values in the bins before this one
            for rank, q in position_of.items():
                if q == p:
                    result[rank] = float(values[order[int(np.searchsorted(up_to_here, rank - below, side="right"))]])
        return result


def _leaves(lo: int, n: int) -> Iterator[tuple[int, int]]:
    """numpy's pairwise-summation splits of [lo, lo + n), down to ranges of at most _LEAF (left to right)."""
    if n <= _LEAF:
        yield lo, n
        return
    half = n // 2
    half -= half % 8
    yield from _leaves(lo, half)
    yield from _leaves(lo + half, n - half)


def _pairwise_sum(leaf_sums: Iterator[float], lo: int, n: int) -> float:
    """numpy's pairwise sum of [lo, lo + n) given the sums of its leaves in order (see `_leaves`)."""
    if n <= _LEAF:
        return next(leaf_sums)
    half = n // 2
    half -= half % 8
    left = _pairwise_sum(leaf_sums, lo, half)
    return left + _pairwise_sum(leaf_sums, lo + half, n - half)


def _order_key(values: np.ndarray) -> np.ndarray:
    """int64 keys in the order of the float64 values (negative values' magnitude bits flipped)."""
    bits = values.view(np.int64)
    if bits.min(initial=0) >= 0:
        # No sign bit set (latency gaps, the usual case): the keys are the bits themselves, and the three
        # passes that flip negative values' bits would change nothing.
        return bits
    return bits ^ ((bits >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))


def _bins(values: np.ndarray) -> np.ndarray:
    return _order_key(values) >> _BIN_SHIFT


class _BinCounts:
    """How many values fall in each bin, over the span of bins seen so far (bin `first` is counts[0])."""

    def __init__(self) -> None:
        self.first = 0
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, bins: np.ndarray, weights: np.ndarray | None = None) -> None:
        if not len(bins):
            return
        lo, hi = int(bins.min()), int(bins.max())
        if not len(self.counts):
            self.first, self.counts = lo, np.zeros(hi - lo + 1, dtype=np.int64)
        last = self.first + len(self.counts) - 1
        if lo < self.first or hi > last:
            first = min(lo, self.first)
            grown = np.zeros(max(hi, last) - first + 1, dtype=np.int64)
            grown[self.first - first : self.first - first + len(self.counts)] = self.counts
            self.first, self.counts = first, grown
        if weights is None:
            self.counts += np.bincount(bins - self.first, minlength=len(self.counts))
        else:  # float64 sums of integer counts: exact below 2**53
            self.counts += np.bincount(bins - self.first, weights, len(self.counts)).astype(np.int64)


def linear_percentiles(
    n: int, qs: Sequence[float], order_stats: Callable[[list[int]], dict[int, float]]
) -> list[float]:
    """np.percentile(values, qs, method="linear") of n values given their order statistics (rank -> value)."""
    quantiles = np.true_divide(np.asarray(qs, dtype=float), 100)
    virtual = ((n - 1) * quantiles).tolist()
    ranks: list[tuple[int, int, float]] = []
    for v in virtual:
        below = math.floor(v)
        if v >= n - 1:
            ranks.append((n - 1, n - 1, v - below))
        else:
            ranks.append((below, below + 1, v - below))
    found = order_stats(sorted({r for pair in ranks for r in pair[:2]}))
    result = []
    for below, above, gamma in ranks:
        a, b = found[below], found[above]
        diff = b - a
        result.append(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)
    return result


def itl_summary(series: GapSeries, qs: Sequence[float]) -> tuple[float, tuple[float, ...]]:
    """(mean, percentiles at qs) of the series' gaps, as numpy gives them over the whole array; NaN if empty."""
    n = len(series)
    if n == 0:
        return NAN, tuple(NAN for _ in qs)
    if n <= _MATERIALISE:
        return _small_summary(series.block(0, n), qs)
    shared = series.shared_blocks()
    if shared is not None:
        # The simulator's series: the mean along numpy's leaves, the order statistics from the multiset.
        chunk_ends = series.chunk_ends()
        sums = [float(np.add.reduce(gaps)) for gaps in series.blocks(chunk_ends)]
        multiset = series.multiset(shared, chunk_ends)
        if multiset is not None:  # every gap positive: no NaN
            return float(_pairwise_sum(iter(sums), 0, n) / n), tuple(linear_percentiles(n, qs, multiset.order_stats))
    counts = _BinCounts()
    has_nan = False
    leaf_sums: list[float] = []
    for gaps in series.blocks():
        leaf_sums.append(np.add.reduce(gaps))
        if math.isnan(leaf_sums[-1]):  # a NaN gap, or infinities of both signs
            has_nan = has_nan or bool(np.isnan(gaps).any())
        counts.add(_bins(gaps))
    mean = float(_pairwise_sum(iter(leaf_sums), 0, n) / n)
    if has_nan:
        # numpy's percentiles of an array holding a NaN are NaN.
        return mean, tuple(NAN for _ in qs)
    return mean, tuple(linear_percentiles(n, qs, lambda ranks: _select(series, counts, ranks)))


def _small_summary(gaps: np.ndarray, qs: Sequence[float]) -> tuple[float, tuple[float, ...]]:
    """itl_summary of a materialised series: the mean summed along the same leaves, the order statistics by
    partitioning the array in place."""
    n = len(gaps)
    mean = float(_pairwise_sum((np.add.reduce(gaps[lo : lo + k]) for lo, k in _leaves(0, n)), 0, n) / n)
    if math.isnan(mean) and np.isnan(gaps).any():
        return mean, tuple(NAN for _ in qs)  # numpy's percentiles of an array holding a NaN are NaN

    def order_stats(ranks: list[int]) -> dict[int, float]:
        gaps.partition(ranks)
        return {rank: float(gaps[rank]) for rank in ranks}

    return mean, tuple(linear_percentiles(n, qs, order_stats))


def _select(series: GapSeries, histogram: _BinCounts, ranks: list[int]) -> dict[int, float]:
    """The values at the given ranks (0-based, ascending order) of the series, given its bin histogram: the
    values of the bins that hold those ranks are gathered (into arrays of the size the histogram gives) and
    partitioned in place."""
    up_to = np.cumsum(histogram.counts)  # values in bins up to each bin
    position_of = {rank: int(np.searchsorted(up_to, rank, side="right")) for rank in ranks}  # in the histogram
    positions = sorted(set(position_of.values()))
    # Which gathered bin each histogram bin is (-1: none), looked up by each gap's bin.
    slot_of_bin = np.full(len(histogram.counts), -1, dtype=np.int32)
    slot_of_bin[positions] = np.arange(len(positions))
    members = [np.empty(int(histogram.counts[p])) for p in positions]
    filled = [0] * len(positions)
    for gaps, seams in series.unordered_blocks():
        slot = slot_of_bin[_bins(gaps) - histogram.first]
        slot[seams] = -1  # the joins between records are no gaps
        # The few gaps in a wanted bin first (one pass over the block: their positions, then two gathers of a
        # few percent of it, where two boolean masks would each pass over all of it), then each bin's among them.
        wanted = np.flatnonzero(slot >= 0)
        gaps, slot = gaps[wanted], slot[wanted]
        for j in range(len(positions)):
            found = gaps[slot == j]
            members[j][filled[j] : filled[j] + len(found)] = found
            filled[j] += len(found)
    result = {}
    for j, p in enumerate(positions):
        below = int(up_to[p] - histogram.counts[p])  # values in the bins before this one
        ks = sorted(rank - below for rank, q in position_of.items() if q == p)
        members[j].partition(ks)
        result.update({below + k: float(members[j][k]) for k in ks})
    return result
