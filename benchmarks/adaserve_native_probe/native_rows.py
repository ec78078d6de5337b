"""AdaServe's throughput-phase selection steps decided in plain loops, each decision checked against a guard band.

A throughput selection step (scheduler._throughput_phase: Algorithm 2's throughput-optimized phase, paper 002
sec. 4.3 step 3, then the verifier's draw) answers two integers per request: the positions it verifies and
the tokens it emits. The numpy computation of them costs ~25 numpy calls over arrays of a few hundred
elements, most of it per-call overhead. Here the same decisions are taken by loops over floats, and each
decision is checked to come out the same as numpy's whatever the last bits of the floats are: where any is
within a guard band of its threshold, the row is declined (None) and the caller computes it with numpy.

Why the decisions equal numpy's outside the band. Let v be a candidate's path probability f̂ = â^depth
(1 - â)^offset as computed here (products along the chain of levels and offsets: at most depth + offset
roundings, and 1 - â, exact for â >= 1/2, rounded once below) and v' numpy's exp(depth log â + offset
log1p(-â)) (speculation.path_probabilities). For values of at least TINY, |v - v'| <= ~1e-12 v (the exponent
of exp is at most ~745 in magnitude for a value that does not underflow, so a few ulps of it are ~3e-13 of
the value; the products' roundings are fewer than 600 ulps of 2^-53): far inside GUARD (1e-9).

- The selection: numpy marks the B - n largest of the n x N estimated values (one argpartition of the
  flattened (n, N) array; ties at the k-th value fall where its introselect leaves them). Nodes of one
  request sharing a (depth, offset) pair share their value bit for bit there (one exp per pair, copied) and
  here; call such a set a group. The k-th largest value here lies in one group; if no other group's value
  lies within GUARD of it, every group above the band is above numpy's k-th value too, every group below
  is below it, and numpy's k-th value is that group's: numpy takes the groups above whole and the rest of
  its B - n from that group. Which of the group's nodes it takes does not matter: they sit at one depth
  with one true probability, so each request's count and each level's reach are the same. Otherwise
  (another group in the band: a near tie across requests or pairs) the row is declined.
- The draw: request i accepts one more token per level k whose reach (the sum of the true path
  probabilities of its selected nodes at depth k, numpy: a BLAS matmul whose summation order is its own)
  is above its uniform. The reach here (each group's value times the nodes taken from it) is within
  ~1e-12 of numpy's (positive terms); a uniform within GUARD of a reach (or TINY of it) declines the row.

The caller (stretch.SelectionStretch.select) computes a declined row as the step alone would, with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

GUARD = 1e-9  # relative band around a threshold inside which a decision is left to numpy
TINY = 1e-280  # absolute band (values near the subnormal range, where relative bounds do not hold)


@dataclass(frozen=True, slots=True)
class NativeShape:
    """A candidate shape's distinct (depth, offset) pairs in order of first appearance (level by level,
    offsets rising within a level, as speculation.candidate_shape lists them), with the nodes sharing each."""

    depths: list[int]
    offsets: list[int]
    counts: list[int]  # nodes sharing each pair
    size: int  # N


def native_shape(depths: list[int], offsets: list[int], distinct_of: list[int], size: int) -> NativeShape:
    """The NativeShape of a candidate shape given as its distinct pairs and each node's pair."""
    counts = [0] * len(depths)
    for pair in distinct_of:
        counts[pair] += 1
    for position in range(1, len(depths)):  # (the chains of products below rely on this order)
        level, offset = depths[position], offsets[position]
        before_level, before_offset = depths[position - 1], offsets[position - 1]
        if level < before_level or (level == before_level and offset <= before_offset):
            raise ValueError("pairs out of order")
    return NativeShape(depths, offsets, counts, size)


def _chain(shape: NativeShape, a: float, out: list[float]) -> None:
    """a^depth (1 - a)^offset of every pair, appended to `out`: along the pairs' order, each value from the
    previous one of its level (or a^depth at a level's start) times (1 - a) once per offset step."""
    b = 1.0 - a
    depths = shape.depths
    offsets = shape.offsets
    lead = 1.0  # a^level
    level = 0
    value = 1.0
    offset = 0
    for p in range(len(depths)):
        d = depths[p]
        o = offsets[p]
        if d != level:
            while level < d:
                lead *= a
                level += 1
            value = lead
            offset = 0
        while offset < o:
            value *= b
            offset += 1
        out.append(value)


def throughput_row(
    shape: NativeShape,
    estimates: list[float],
    truths: list[float],
    uniforms: list[float],
    base: int,
    stride: int,
    n: int,
    take: int,
) -> tuple[list[int], list[int]] | None:
    """One selection step's (verified, emitted) per request (roots included), or None (declined: a decision
    within the guard band). Request i's estimate, truth and uniform are entry base + i * stride of each list;
    `take` = B - n candidates are selected beside the roots (0 < take < n * N)."""
    depths = shape.depths
    counts = shape.counts
    pairs = len(depths)
    values: list[float] = []
    for i in range(n):
        _chain(shape, estimates[base + i * stride], values)
    # The take-th largest value, over every node (a group's value once per node sharing it).
    nodes: list[float] = []
    for i in range(n):
        row = i * pairs
        for p in range(pairs):
            v = values[row + p]
            for _ in range(counts[p]):
                nodes.append(v)
    nodes.sort()
    cut = nodes[len(nodes) - take]
    if cut < TINY:
        return None
    low = cut - cut * GUARD
    high = cut + cut * GUARD
    above = 0  # nodes of the groups above the band
    band = -1  # the one group within it (flat index)
    for g in range(n * pairs):
        v = values[g]
        if v > high:
            above += counts[g % pairs]
        elif v >= low:
            if band >= 0:
                return None  # another group near the k-th value: numpy's tie placement decides
            band = g
    partial = take - above  # nodes taken from the band's group (1 .. its size)
    verified: list[int] = []
    emitted: list[int] = []
    truth_values: list[float] = []
    for i in range(n):
        at = base + i * stride
        truth_values.clear()
        _chain(shape, truths[at], truth_values)
        u = uniforms[at]
        row = i * pairs
        chosen = 0
        accepted = 0
        level = 1
        reach = 0.0
        for p in range(pairs):
            d = depths[p]
            if d != level:
                # Level `level` is complete: one more accepted token where its reach is above the uniform.
                if u - reach > reach * GUARD + TINY:
                    pass
                elif reach - u > reach * GUARD + TINY:
                    accepted += 1
                else:
                    return None
                level = d
                reach = 0.0
            g = row + p
            v = values[g]
            if v > high:
                taken = counts[p]
            elif g == band:
                taken = partial
            else:
                continue
            chosen += taken
            reach += truth_values[p] * taken
        if u - reach > reach * GUARD + TINY:
            pass
        elif reach - u > reach * GUARD + TINY:
            accepted += 1
        else:
            return None
        verified.append(chosen + 1)
        emitted.append(accepted + 1)
    return verified, emitted


def _kth_largest(values: list[float], counts: list[int], pairs: int, take: int) -> float:
    """The take-th largest node value (group g's value counted counts[g % pairs] times): a quickselect."""
    index = list(range(len(values)))
    need = take
    while True:
        pivot = values[index[len(index) >> 1]]
        higher: list[int] = []
        lower: list[int] = []
        weight_high = 0
        weight_equal = 0
        for g in index:
            v = values[g]
            if v > pivot:
                higher.append(g)
                weight_high += counts[g % pairs]
            elif v == pivot:
                weight_equal += counts[g % pairs]
            else:
                lower.append(g)
        if need <= weight_high:
            index = higher
        elif need <= weight_high + weight_equal:
            return pivot
        else:
            need -= weight_high + weight_equal
            index = lower


def throughput_row2(
    shape: NativeShape,
    estimates: list[float],
    truths: list[float],
    uniforms: list[float],
    base: int,
    stride: int,
    n: int,
    take: int,
) -> tuple[list[int], list[int]] | None:
    depths = shape.depths
    offsets = shape.offsets
    counts = shape.counts
    pairs = len(depths)
    values: list[float] = []
    for i in range(n):
        _chain(shape, estimates[base + i * stride], values)
    cut = _kth_largest(values, counts, pairs, take)
    if cut < TINY:
        return None
    low = cut - cut * GUARD
    high = cut + cut * GUARD
    above = 0
    band = -1
    for g in range(n * pairs):
        v = values[g]
        if v > high:
            above += counts[g % pairs]
        elif v >= low:
            if band >= 0:
                return None
            band = g
    partial = take - above
    verified: list[int] = []
    emitted: list[int] = []
    for i in range(n):
        at = base + i * stride
        a = truths[at]
        b = 1.0 - a
        u = uniforms[at]
        row = i * pairs
        chosen = 0
        accepted = 0
        level = 1
        reach = 0.0
        lead = a
        value = a
        offset = 0
        for p in range(pairs):
            d = depths[p]
            o = offsets[p]
            if d != level:
                if u - reach > reach * GUARD + TINY:
                    pass
                elif reach - u > reach * GUARD + TINY:
                    accepted += 1
                else:
                    return None
                while level < d:
                    lead *= a
                    level += 1
                value = lead
                offset = 0
                reach = 0.0
            while offset < o:
                value *= b
                offset += 1
            g = row + p
            v = values[g]
            if v > high:
                taken = counts[p]
            elif g == band:
                taken = partial
            else:
                continue
            chosen += taken
            reach += value * taken
        if u - reach > reach * GUARD + TINY:
            pass
        elif reach - u > reach * GUARD + TINY:
            accepted += 1
        else:
            return None
        verified.append(chosen + 1)
        emitted.append(accepted + 1)
    return verified, emitted
