"""A token-level model of speculation for the simulator: draft trees, SLO-customized selection, verification.

The model (ours; the paper runs real models). At every step each decoding request's next tokens have a
local predictability a in (0, 1): the text's true acceptance rate there. Children of every node are ranked
by the draft, and the true probability of the rank-j child is a (1 - a)^(j-1): the top candidate is right
with probability a, siblings' probabilities fall off geometrically and sum to 1 (paper 002, App. A). A node
at depth k whose ranks sum to k + m therefore has true path probability f = a^k (1 - a)^m.

- Per-step randomness: a is drawn each step from a Beta around the request's mean acceptance (its task's
  `acceptance`), with the calibration's concentration; which path the verifier takes is drawn too. Both
  make accepted tokens vary step to step (the tail cost of speculation, paper 000).
- Draft mismatch: the draft ranks children as the truth does, but it only estimates a. Its estimate is
  â = sigmoid(logit(a) + overconfidence + mismatch * N(0, 1)), so its approximated path probabilities
  f̂ = â^k (1 - â)^m (eq. 7) are off from f by a controllable amount; mismatch = 0 is a perfect drafter.
  The truth is drawn first and the draft's error on top, so mismatch never changes what is accepted on
  average, only how well AdaServe knows it.

Because every node's conditionals share one a per request per step, the candidate tree of a depth-d,
width-w beam search has the same shape at every step (which rank sums survive the beam does not depend on
a), so it is tabulated once per (d, w) and a whole batch is selected and verified with a few array
operations: the selection rule is Algorithm 2's (trees.select_trees, tested equal), and the accepted depth
is drawn from its exact distribution: P(depth >= k) = sum of f over the selected nodes at depth k (the
walk reaches at most one node per depth, so those events are disjoint).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.pickling import reduce_by_fields

EPS = 1e-9


@dataclass(frozen=True, slots=True)
class CandidateShape:
    """The candidate tree of a depth-d, width-w beam search under the ranked-geometric draft, level by level.

    Node i sits at `depth[i]` (1..d), its ranks along the path sum to depth[i] + offset[i], and `parent[i]`
    is its parent's index (-1 below the root), so f̂ = â^depth (1 - â)^offset."""

    depth_limit: int
    width: int
    depth: np.ndarray  # (N,) int
    offset: np.ndarray  # (N,) int
    parent: np.ndarray  # (N,) int
    rank: np.ndarray  # (N,) int, 1-based rank among its parent's children
    level_onehot: np.ndarray  # (N, d) float: column k-1 marks the nodes at depth k
    exponents: tuple[np.ndarray, np.ndarray]  # (N,) float each: depth and offset, the exponents of a and 1 - a
    size: int  # N
    # The distinct (depth, offset) pairs (U of them, in order of first appearance), as `exponents` is, and the
    # pair of each node ((N,) int): nodes sharing a pair share their path probability bit for bit (the same
    # operations on the same numbers), so path_probabilities computes each pair once (a (3, 8) tree: 15 of 24).
    distinct_exponents: tuple[np.ndarray, np.ndarray]
    distinct_of: np.ndarray

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


@functools.lru_cache(maxsize=256)
def candidate_shape(depth: int, width: int) -> CandidateShape:
    """Beam search (sec. 4.3, step 1) on rank sums: at each level keep the `width` children (ranks 1..width
    of each beam node) with the smallest offset, ties to the earlier parent then the lower rank, exactly as
    trees.beam_search orders equal probabilities."""
    depths: list[int] = []
    offsets: list[int] = []
    parents: list[int] = []
    ranks: list[int] = []
    beam: list[tuple[int, int]] = [(-1, 0)]  # (node index, offset)
    for level in range(1, depth + 1):
        expanded = [
            (offset + rank - 1, order, rank, index)
            for order, (index, offset) in enumerate(beam)
            for rank in range(1, width + 1)
        ]
        expanded.sort(key=lambda item: (item[0], item[1], item[2]))
        beam = []
        for offset, _, rank, parent in expanded[:width]:
            beam.append((len(depths), offset))
            depths.append(level)
            offsets.append(offset)
            parents.append(parent)
            ranks.append(rank)
    depth_arr = np.array(depths, dtype=np.int64)
    pairs: dict[tuple[int, int], int] = {}
    distinct_of = [pairs.setdefault((level, offset), len(pairs)) for level, offset in zip(depths, offsets, strict=True)]
    onehot = np.zeros((len(depths), depth))
    onehot[np.arange(len(depths)), depth_arr - 1] = 1.0
    return CandidateShape(
        depth_limit=depth,
        width=width,
        depth=depth_arr,
        offset=np.array(offsets, dtype=np.int64),
        parent=np.array(parents, dtype=np.int64),
        rank=np.array(ranks, dtype=np.int64),
        level_onehot=onehot,
        exponents=(np.array(depths, dtype=float), np.array(offsets, dtype=float)),
        size=len(depths),
        distinct_exponents=(
            np.array([level for level, _ in pairs], dtype=float),
            np.array([offset for _, offset in pairs], dtype=float),
        ),
        distinct_of=np.array(distinct_of, dtype=np.intp),
    )


def clip_acceptance(acceptance: np.ndarray) -> np.ndarray:
    """Acceptance rates kept inside (0, 1), where their logarithms are finite."""
    return np.minimum(np.maximum(acceptance, EPS), 1.0 - EPS)


def path_probabilities(
    shape: CandidateShape, acceptance: np.ndarray, *, clipped: bool = False, shared: bool = True
) -> np.ndarray:
    """(n, N) path probabilities a^depth (1 - a)^offset of every candidate node for each request's a
    (`clipped`: the caller already passed `acceptance` through clip_acceptance). `shared`: the exponents tiled
    once per row count and kept (a step's row counts are few); False for one-off row counts (a stretch's K
    steps), which multiply each row by the exponents broadcast instead: the same products."""
    a = acceptance if clipped else clip_acceptance(acceptance)
    rows = len(a)
    depth, offset = shape.distinct_exponents
    size = len(depth)  # U: each distinct (depth, offset) pair once, then copied to the nodes that share it
    if shared:
        depth, offset = _tiled_exponents(shape.depth_limit, shape.width, rows)
    # Row i of the outer products log(a) x depth and log1p(-a) x offset, flattened: a[i]'s logarithm repeated
    # once per pair times the exponents tiled once per row, the same products (and the same sum and exp)
    # elementwise in one-dimensional calls, which numpy runs far cheaper than a broadcast outer product.
    logs = np.log(a).repeat(size)
    tail = np.log1p(-a).repeat(size)
    if not shared:  # (the (rows, U) views of the same products: each row times the exponents, broadcast)
        logs, tail = logs.reshape(rows, size), tail.reshape(rows, size)
    logs *= depth
    tail *= offset
    logs += tail
    np.exp(logs, out=logs)
    if size == shape.size:  # (every pair distinct: distinct_of is the identity)
        return logs.reshape(rows, size)
    # Node j's value is its pair's, computed by the same operations on the same numbers: the same bits as
    # computing it for every node (the exp, about 60 instructions an element, is the step's costliest call).
    return logs.reshape(rows, size).take(shape.distinct_of, axis=1)


@functools.lru_cache(maxsize=1024)
def _tiled_exponents(depth: int, width: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """candidate_shape(depth, width).distinct_exponents, each tiled `rows` times (read-only: shared between
    calls)."""
    tiled = tuple(np.tile(exponent, rows) for exponent in candidate_shape(depth, width).distinct_exponents)
    for exponent in tiled:
        exponent.flags.writeable = False
    return tiled  # type: ignore[return-value]


def draft_estimate(
    true_acceptance: np.ndarray,
    mismatch: float,
    overconfidence: float,
    rng: np.random.Generator,
    *,
    clipped: bool = False,
):
    """The draft's estimate â of each request's local acceptance (module docstring); `clipped`: the caller
    already passed `true_acceptance` through clip_acceptance."""
    a = true_acceptance if clipped else clip_acceptance(true_acceptance)
    if mismatch == 0.0 and overconfidence == 0.0:
        return a
    # Each operation in place where it can be (once per request: the same elementwise values, fewer arrays).
    logit = np.log(a)
    logit -= np.log1p(-a)
    if overconfidence:  # (x + 0.0 is x: a difference of logarithms is never -0.0)
        logit += overconfidence
    if mismatch:
        noise = rng.standard_normal(len(a))
        noise *= mismatch
        logit += noise
    # 1 / (1 + exp(-logit))
    np.negative(logit, out=logit)
    np.exp(logit, out=logit)
    logit += 1.0
    return np.divide(1.0, logit, out=logit)


@dataclass(slots=True)
class Selection:
    """Algorithm 2's outcome for a batch: request i verifies its root plus the candidates marked in
    `selected[i]`, its `counts[i]` most probable by the draft's estimate (a connected subtree)."""

    counts: np.ndarray  # (n,) int: draft tokens per request
    slo_counts: np.ndarray  # (n,) int: of which chosen in the SLO-customized phase
    selected: np.ndarray  # (n, N) bool
    slo_total: int = 0  # slo_counts.sum()
    behind: int = 0  # requests behind their TPOT SLO (need > 0) that the SLO-customized phase served
    beyond_tree: int = 0  # of which needing more than the tree's depth of accepted drafts (A(r) > d + 1)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    @property
    def verified_tokens(self) -> int:
        return int(self.counts.sum()) + len(self.counts)


def full_selection(n: int, size: int) -> Selection:
    """Every candidate of every request (the budget holds them all)."""
    return Selection(counts=np.full(n, size), slo_counts=np.zeros(n, dtype=np.int64), selected=every_candidate(n, size))


@functools.lru_cache(maxsize=1024)
def every_candidate(n: int, size: int) -> np.ndarray:
    """The (n, size) mask with every candidate selected (read-only: shared between calls; a request's full-tree
    draws ask it every few steps)."""
    mask = np.ones((n, size), dtype=bool)
    mask.flags.writeable = False
    return mask


def select(approx: np.ndarray, need: np.ndarray, budget: int, depth: int, n_max: int) -> Selection:
    """Algorithm 2 lines 9-23 for a whole batch (the vectorised twin of trees.select_trees).

    Within one request both phases always take its most probable remaining candidate, so each request ends
    up with a prefix of its candidates sorted by f̂. Only requests behind their SLO (need > 0) are sorted,
    for the SLO-customized phase; the throughput phase is one partition of everything left. A child is always
    less probable than its parent, so any top set is a connected tree."""
    n, size = approx.shape
    remaining = budget - n
    if remaining >= n * size:  # every candidate fits: whatever the phases pick, they pick everything
        return full_selection(n, size)
    slo_counts = np.zeros(n, dtype=np.int64)
    selected = np.zeros((n, size), dtype=bool)
    slo_total = served = beyond = 0
    if remaining <= 0:  # no room for a draft token: neither phase selects anything
        return Selection(counts=np.zeros(n, dtype=np.int64), slo_counts=slo_counts, selected=selected)
    behind = np.flatnonzero(need > 0.0)
    if len(behind):
        # SLO-customized phase: the largest need first, each request whole until the budget runs out.
        behind_need = need[behind]
        order_of_rows = np.argsort(-behind_need, kind="stable")
        rows = behind[order_of_rows]
        approx_rows = approx[rows]
        order = np.argsort(-approx_rows, axis=1, kind="stable")
        ranked = approx_rows[row_index(len(rows)), order]
        cap = np.minimum(behind_need[order_of_rows], float(depth))
        wanted = (np.cumsum(ranked, axis=1) < cap[:, None]).sum(axis=1) + 1
        # n_max: the most tokens the phase adds to one tree (Algorithm 2's inputs; its line 12 compares the
        # tree's size with the root, one fewer: we follow the stated meaning). A_cap = min(A(r), d + 1) is
        # `cap` here in draft tokens (need = A(r) - 1, the root counted as accepted, line 6).
        np.minimum(wanted, min(size, n_max), out=wanted)
        granted = np.minimum(np.maximum(remaining - (np.cumsum(wanted) - wanted), 0), wanted)
        slo_counts[rows] = granted
        selected[rows[:, None], order] = _positions(size) < granted[:, None]
        slo_total = int(granted.sum())
        remaining -= slo_total
        served = int(np.count_nonzero(granted))
        beyond = int(np.count_nonzero(behind_need[order_of_rows][granted > 0] > depth))
    # Throughput-optimized phase: the globally most probable of what is left.
    if remaining > 0:
        available = n * size - slo_total
        if remaining >= available:
            selected[:] = True
        else:
            # Nothing chosen yet: the estimates themselves (argpartition does not modify its input).
            selected |= most_probable(np.where(selected, -1.0, approx) if slo_total else approx, remaining)
    return Selection(
        counts=selected_counts(selected),
        slo_counts=slo_counts,
        selected=selected,
        slo_total=slo_total,
        behind=served,
        beyond_tree=beyond,
    )


def selected_counts(selected: np.ndarray, plus: int = 0) -> np.ndarray:
    """Candidates selected per request (the row sums of an (n, N) mask), plus `plus` each (the reduction's
    initial value: the roots counted without an array of its own)."""
    return _row_sums(selected, axis=1, initial=plus)


def most_probable(approx: np.ndarray, count: int) -> np.ndarray:
    """(n, N) bool: the `count` largest entries of `approx` (0 < count < its size), as select's throughput
    phase takes them (one argpartition of the flattened array; ties fall as argpartition leaves them)."""
    flat = approx.ravel()
    cut = flat.size - count
    chosen = np.zeros(flat.size, dtype=bool)
    chosen[flat.argpartition(cut)[cut:]] = True  # np.argpartition's own call, without its wrapper
    return chosen.reshape(approx.shape)


@functools.lru_cache(maxsize=64)
def _positions(size: int) -> np.ndarray:
    """0..size-1 (read-only: shared between calls)."""
    positions = np.arange(size)
    positions.flags.writeable = False
    return positions


@functools.lru_cache(maxsize=1024)
def row_index(rows: int) -> np.ndarray:
    """A (rows, 1) column 0..rows-1 for row-wise fancy indexing (read-only: shared between calls)."""
    index = np.arange(rows)[:, None]
    index.flags.writeable = False
    return index


@functools.lru_cache(maxsize=1024)
def row_starts(rows: int, width: int) -> np.ndarray:
    """A (rows, 1) column of each row's first flat index in a C-ordered (rows, width) array (read-only: shared
    between calls)."""
    starts = (np.arange(rows) * width)[:, None]
    starts.flags.writeable = False
    return starts


def accepted_draft_tokens(
    shape: CandidateShape, selection: Selection, true_probs: np.ndarray, uniforms: np.ndarray
) -> np.ndarray:
    """Draft tokens the verifier accepts per request: the depth its true path reaches inside the selected
    tree, drawn from P(depth >= k) = sum of true f over selected nodes at depth k with one uniform each."""
    return accepted_depths(shape, selection.selected, true_probs, uniforms)


def accepted_depths(
    shape: CandidateShape, selected: np.ndarray, true_probs: np.ndarray, uniforms: np.ndarray, plus: int = 0
) -> np.ndarray:
    """accepted_draft_tokens on the (n, N) selected mask itself, plus `plus` each (the reduction's initial
    value: the verifier's own token counted without an array of its own)."""
    reach = (true_probs * selected) @ shape.level_onehot  # (n, d): P(accepted depth >= k)
    # (d, n) against the uniforms along its rows (the transpose is a view; no (n, 1) column to index).
    return _row_sums(uniforms < reach.T, axis=0, initial=plus)


# ndarray.sum of booleans without its Python wrapper (integer counts: no rounding to differ).
_row_sums = np.add.reduce


def chain_selection(n: int, width: int) -> Selection:
    """Static sequence speculation (vLLM-Spec(k), the paper's baseline): every request verifies a chain of
    the draft's top choice, `width` deep, whatever its SLO. On a width-1 candidate shape of depth `width`."""
    counts = np.full(n, width, dtype=np.int64)
    return Selection(counts=counts, slo_counts=np.zeros(n, dtype=np.int64), selected=np.ones((n, width), bool))
