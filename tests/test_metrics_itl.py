"""The streamed ITL summary (core/metrics/itl.py) equals numpy's over the materialised gap array, to the bit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from core.metrics import itl
from core.metrics.summary import PERCENTILES
from core.records import RequestRecord, Status
from tests.test_metrics import rec


def _records(rng: np.random.Generator, n: int, draw_gap) -> list[RequestRecord]:
    out = []
    for i in range(n):
        chunks = int(rng.integers(0, 60))
        times = None if chunks == 0 else np.cumsum(draw_gap(chunks))
        status = Status.ERROR if rng.random() < 0.1 else Status.OK
        out.append(rec(i, chunks=times, status=status))
    return out


def _materialised(records: list[RequestRecord]) -> np.ndarray:
    parts = [np.diff(r.chunk_times) for r in records if r.ok and r.chunk_times is not None]
    return np.concatenate(parts) if parts else np.empty(0)


def _numpy_summary(records: list[RequestRecord]) -> tuple[float, tuple[float, ...]]:
    gaps = _materialised(records)
    if not len(gaps):
        return math.nan, tuple(math.nan for _ in PERCENTILES)
    return float(np.mean(gaps)), tuple(float(v) for v in np.percentile(gaps, PERCENTILES))


def _streamed(records: list[RequestRecord]) -> tuple[float, tuple[float, ...]]:
    ok = np.array([r.ok for r in records], dtype=bool)
    return itl.itl_summary(itl.GapSeries(records, ok), PERCENTILES)


def _same(a: tuple[float, tuple[float, ...]], b: tuple[float, tuple[float, ...]]) -> bool:
    flat_a, flat_b = [a[0], *a[1]], [b[0], *b[1]]
    return all(
        (x == y and math.copysign(1, x) == math.copysign(1, y)) or (math.isnan(x) and math.isnan(y))
        for x, y in zip(flat_a, flat_b, strict=True)
    )


GAP_DRAWS = {
    "lognormal": lambda rng: lambda k: rng.lognormal(-3.5, 0.6, k),
    # The simulator's case: few distinct step durations, each repeated by every request decoding across it.
    "repeated": lambda rng: lambda k: rng.choice(rng.lognormal(-3.5, 0.3, 7), k),
    "signed": lambda rng: lambda k: rng.normal(0.0, 1.0, k),  # negative gaps and times going back
    "integers": lambda rng: lambda k: rng.integers(0, 3, k).astype(float),  # exact zeros, ties at the ranks
    # Mostly positive with a rare negative or -0.0: some blocks have a sign bit set and others not.
    "rarely signed": lambda rng: (
        lambda k: rng.lognormal(-3.5, 0.6, k) * rng.choice([1.0, -1.0, -0.0], k, p=[0.998, 0.001, 0.001])
    ),
}


@pytest.mark.parametrize("draw", sorted(GAP_DRAWS))
@pytest.mark.parametrize(("leaf", "bin_shift"), [(128, 44), (200, 60), (1 << 15, 44)])
@pytest.mark.parametrize("materialise", [0, 1 << 20])  # 0: every series through the histogram
def test_streamed_summary_equals_numpy_over_the_whole_array(
    draw: str, leaf: int, bin_shift: int, materialise: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Small leaves (numpy's 128-element block is the least) walk numpy's pairwise splits many levels deep; a
    # coarse histogram puts many values per bin.
    monkeypatch.setattr(itl, "_LEAF", leaf)
    monkeypatch.setattr(itl, "_BIN_SHIFT", bin_shift)
    monkeypatch.setattr(itl, "_MATERIALISE", materialise)
    for seed in range(4):
        rng = np.random.default_rng(seed)
        records = _records(rng, int(rng.integers(1, 400)), GAP_DRAWS[draw](rng))
        assert _same(_streamed(records), _numpy_summary(records)), (draw, seed)


@pytest.mark.parametrize("materialise", [0, 1 << 20])
def test_a_million_gaps_sum_like_numpy(materialise: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past numpy's 128-element blocks and several real leaves: the pairwise splits must line up."""
    monkeypatch.setattr(itl, "_MATERIALISE", materialise)
    rng = np.random.default_rng(7)
    records = [rec(i, chunks=np.cumsum(rng.lognormal(-3.5, 0.6, 1 + int(rng.integers(1, 400))))) for i in range(6000)]
    assert len(_materialised(records)) > 4 * itl._LEAF
    assert _same(_streamed(records), _numpy_summary(records))


def test_order_keys_sort_as_the_values() -> None:
    # The keys as they are taken (the bits themselves where no sign bit is set) against the general formula.
    rng = np.random.default_rng(5)
    for values in (rng.lognormal(0.0, 3.0, 5000), rng.normal(0.0, 1.0, 5000), np.array([0.0, -0.0, 1e-300, -1e-300])):
        bits = values.view(np.int64)
        assert np.array_equal(itl._order_key(values), bits ^ ((bits >> 63) & np.int64(0x7FFFFFFFFFFFFFFF)))
        assert np.all(np.diff(values[np.argsort(itl._order_key(values), kind="stable")]) >= 0)


def test_linear_percentiles_follow_numpy_for_every_size() -> None:
    rng = np.random.default_rng(3)
    qs = (0.0, 1.0, 12.5, 33.3, 50.0, 66.7, 90.0, 95.0, 99.0, 99.9, 100.0)
    for n in [*range(1, 300), 1021, 65537, 999_983]:
        values = np.sort(rng.lognormal(0.0, 2.0, n))
        got = itl.linear_percentiles(n, qs, lambda ranks, v=values: {r: float(v[r]) for r in ranks})
        assert got == [float(x) for x in np.percentile(values, qs)], n


@pytest.mark.parametrize("materialise", [0, 1 << 20])
def test_nan_gap_gives_nan_percentiles_as_numpy(materialise: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(itl, "_MATERIALISE", materialise)
    records = [rec(0, chunks=[0.0, 0.1, math.nan, 0.4]), rec(1, chunks=[1.0, 1.5])]
    streamed = _streamed(records)
    assert _same(streamed, _numpy_summary(records))
    assert all(math.isnan(v) for v in streamed[1])


def test_no_gaps() -> None:
    records = [rec(0, chunks=[0.3]), rec(1), rec(2, chunks=[1.0, 2.0], status=Status.ERROR)]
    mean, ps = _streamed(records)
    assert math.isnan(mean) and all(math.isnan(v) for v in ps)


@pytest.mark.parametrize("draw", sorted(GAP_DRAWS))
@pytest.mark.parametrize("leaf", [128, 200, 1 << 15])
def test_unordered_blocks_hold_every_gap_once(draw: str, leaf: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The selection's blocks: every gap of the series once (in record order, here), and each seam a copy of
    the gap before it, so that its value is one of the gaps (its order key keeps a block's sign test)."""
    monkeypatch.setattr(itl, "_LEAF", leaf)
    records = _records(np.random.default_rng(7), 800, GAP_DRAWS[draw](np.random.default_rng(8)))
    series = itl.GapSeries(records, np.array([r.ok for r in records], dtype=bool))
    kept = []
    for gaps, seams in series.unordered_blocks():
        assert np.array_equal(gaps[seams], gaps[seams - 1], equal_nan=True)
        keep = np.ones(len(gaps), dtype=bool)
        keep[seams] = False
        kept.append(gaps[keep])
    assert np.array_equal(np.concatenate(kept).view(np.int64), _materialised(records).view(np.int64))


def _shared_block_records(rng: np.random.Generator, *, loose: bool = True) -> list[RequestRecord]:
    """Records as the simulator makes them: chunk times that are views of step-time blocks whose end times rise
    strictly up to the last step run (few distinct step durations), then hold np.empty's leftovers; plus, with
    `loose`, records the multiset counts gap by gap (a copy, a strided view, a view of another dtype's base)."""
    records: list[RequestRecord] = []
    blocks = []
    for b in range(int(rng.integers(1, 4))):
        run = int(rng.integers(50, 3000))
        block = np.empty(run + 400)
        block[:run] = 100.0 * b + np.cumsum(rng.choice(rng.lognormal(-3.5, 0.3, 9), run))
        block[run:] = rng.choice([np.nan, -1.0, 1e9]) if b % 2 else block[run - 1] + np.cumsum(rng.random(400))
        blocks.append((block, run))
        for _ in range(int(rng.integers(1, 500))):
            first = int(rng.integers(0, run - 1))
            last = int(rng.integers(first + 1, min(first + 300, run)))
            status = Status.ERROR if rng.random() < 0.05 else Status.OK
            records.append(rec(len(records), chunks=block[first : last + 1], status=status))
    if loose:
        block, run = blocks[0]
        records.append(rec(len(records), chunks=block[: min(run, 40)].copy()))
        records.append(rec(len(records), chunks=block[0:run:3]))
        records.append(rec(len(records), chunks=np.cumsum(rng.lognormal(-3.5, 0.3, 30)).astype(np.float32)))
    order = rng.permutation(len(records))
    return [records[i] for i in order]


def _multiset(records: list[RequestRecord]) -> itl.GapMultiset | None:
    series = itl.GapSeries(records, np.array([r.ok for r in records], dtype=bool))
    shared = series.shared_blocks()
    if shared is None:
        return None
    chunk_ends = series.chunk_ends()
    for _ in series.blocks(chunk_ends):
        pass
    return series.multiset(shared, chunk_ends)


@pytest.mark.parametrize("piece", [3, 1 << 13])
@pytest.mark.parametrize("bin_shift", [44, 60])
@pytest.mark.parametrize("loose", [False, True])
def test_shared_step_blocks_give_numpys_summary(
    piece: int, bin_shift: int, loose: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The simulator's case, counted as a multiset of step gaps: the same mean and percentiles as numpy's over
    the materialised array, and the multiset is what was used."""
    monkeypatch.setattr(itl, "_MATERIALISE", 0)
    monkeypatch.setattr(itl, "_PIECE", piece)
    monkeypatch.setattr(itl, "_BIN_SHIFT", bin_shift)
    monkeypatch.setattr(itl, "_select", None)  # the multiset's own selection, not the histogram's second pass
    for seed in range(4):
        records = _shared_block_records(np.random.default_rng(seed), loose=loose)
        multiset = _multiset(records)
        assert multiset is not None and sum(len(s.starts) for s in multiset.shared) > 0.9 * len(records), seed
        assert _same(_streamed(records), _numpy_summary(records)), seed


def test_multiset_declined_when_gaps_are_not_all_positive_or_mostly_loose(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(itl, "_MATERIALISE", 0)
    rng = np.random.default_rng(11)
    block = np.empty(600)
    block[:500] = np.cumsum(rng.choice(rng.lognormal(-3.5, 0.3, 9), 500))
    for leftover in (np.nan, -1.0):
        block[500:] = leftover
        records = [rec(i, chunks=block[i : i + 200]) for i in range(250)]
        # A view reaching into the block's leftovers is counted gap by gap: a gap that is not positive (a fall,
        # NaN) sends the whole series to the histogram, which gives numpy's answer.
        records.append(rec(250, chunks=block[495:505]))
        assert _multiset(records) is None
        assert _same(_streamed(records), _numpy_summary(records))
        assert _multiset(records[:-1]) is not None
    # Mostly records of their own (a live run's): no multiset.
    own = _records(rng, 300, GAP_DRAWS["lognormal"](rng))
    assert itl.GapSeries(own, np.array([r.ok for r in own], dtype=bool)).shared_blocks() is None
