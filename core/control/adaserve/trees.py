"""Token trees on explicit nodes: AdaServe's optimal construction and its practical variant (paper 002, sec. 4).

These are the reference implementations, written node by node so they can be checked against the paper's
worked example (Figure 5) and against brute force on small cases. The simulator runs the same selection
rule vectorised over a batch (speculation.py); tests hold the two against each other.

Conventions used throughout the package:
- A node is a token sequence continuing the request's text; its path probability f(v) is the probability
  that the verifier accepts the whole path (sec. 3, Theorem 3.1). The root (the last generated token) is
  not a node here: every verification yields one token on its own, so a tree of draft nodes S yields
  1 + (accepted draft tokens), and E[accepted draft tokens] = sum of f(v) over S.
- `need` is A(r) - 1: the draft tokens that must be accepted this step, beyond the verifier's own token, for
  the request to be back on its TPOT SLO (sec. 3, A(r) = (l + t_spec) / t_tpot - o). Figure 5's A_cap values
  (0.6, 0.8) are in this unit: they are met by summing the speculated tokens' probabilities alone.
- `budget` is B, the tokens verified in one step, roots included (eq. 1: sum of |T_i| <= B).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Path = tuple[int, ...]
# A model's next-token distribution after a path: conditional probability of each candidate token.
ChildFn = Callable[[Path], Sequence[tuple[int, float]]]


@dataclass(frozen=True, slots=True)
class Node:
    request: int
    path: Path  # token ids from the root; len(path) is the node's depth
    prob: float  # path probability f(v), or the draft's approximation of it (eq. 7)

    @property
    def depth(self) -> int:
        return len(self.path)


def _children(request: int, parent: Node | None, children: ChildFn) -> list[Node]:
    path: Path = () if parent is None else parent.path
    base = 1.0 if parent is None else parent.prob
    return [Node(request, (*path, token), base * p) for token, p in children(path) if p > 0.0]


class _Frontier:
    """The candidates of GetTop (sec. 4.2): nodes whose parent is in a tree and that are not themselves.

    Popping the most probable node and pushing its children enumerates an infinite tree in descending f(v);
    a child is never more probable than its parent, so this is exactly the top of T_inf - S_added (App. B).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Node]] = []
        self._order = itertools.count()

    def push(self, nodes: Sequence[Node]) -> None:
        for node in nodes:
            # Ties go to the node pushed first, which is never a descendant of a later one.
            heapq.heappush(self._heap, (-node.prob, next(self._order), node))

    def pop(self) -> Node | None:
        return heapq.heappop(self._heap)[2] if self._heap else None

    def peek_prob(self) -> float:
        return -self._heap[0][0] if self._heap else -1.0


def optimal_trees(children: Sequence[ChildFn], need: Sequence[float], budget: int) -> list[list[Node]] | None:
    """Algorithm 1 (sec. 4.1): the trees that meet every request's need with the fewest tokens and spend the
    rest of the budget where the accepted-token expectation grows most. `children[i]` gives request i's true
    conditionals (its infinite tree T_inf). Returns None (INVALID) when the needs cannot all be met."""
    n = len(children)
    remaining = budget - n  # every tree's root is verified
    if remaining < 0:
        return None
    frontiers = [_Frontier() for _ in range(n)]
    for i in range(n):
        frontiers[i].push(_children(i, None, children[i]))
    trees: list[list[Node]] = [[] for _ in range(n)]
    # Step 1: each request greedily toward its SLO, in the given order.
    for i in range(n):
        accepted = 0.0
        while accepted < need[i]:
            node = frontiers[i].pop() if remaining > 0 else None
            if node is None:
                return None
            trees[i].append(node)
            accepted += node.prob
            remaining -= 1
            frontiers[i].push(_children(i, node, children[i]))
    # Step 2: the rest of the budget to the most probable nodes of any request.
    while remaining > 0:
        best = max(range(n), key=lambda j: frontiers[j].peek_prob())
        node = frontiers[best].pop()
        if node is None:
            break
        trees[best].append(node)
        remaining -= 1
        frontiers[best].push(_children(best, node, children[best]))
    return trees


def beam_search(request: int, draft: ChildFn, depth: int, width: int) -> list[Node]:
    """The speculation phase (sec. 4.3, step 1): `depth` draft passes; each keeps the `width` most probable
    children (by approximated path probability) of the previous pass's nodes. Returns the candidate tree
    T_cand, `width` nodes per level, level by level."""
    candidates: list[Node] = []
    beam: list[Node | None] = [None]
    for _ in range(depth):
        expanded = [child for parent in beam for child in _children(request, parent, draft)]
        # Stable: among equal probabilities the earlier parent's child wins, so results are reproducible.
        beam = sorted(expanded, key=lambda node: -node.prob)[:width]  # type: ignore[assignment]
        if not beam:
            break
        candidates.extend(beam)  # type: ignore[arg-type]
    return candidates


def slo_cap(need: float, depth: int) -> float:
    """A_cap (sec. 4.3, step 2): a tree of depth d yields at most d draft tokens, so no more can be asked."""
    return min(need, float(depth))


def select_trees(
    candidates: Sequence[Sequence[Node]], need: Sequence[float], budget: int, depth: int, n_max: int
) -> list[list[Node]]:
    """SLO-customized then throughput-optimized selection (Algorithm 2, lines 9-23) from candidate trees.

    Requests are served in descending need (the slowest first); each takes its most probable candidates
    until their summed approximated probability reaches A_cap, it holds n_max tokens, or the budget is gone.
    The budget left then goes to the most probable remaining candidates of all requests."""
    n = len(candidates)
    remaining = budget - n
    ranked = [sorted(tree, key=lambda node: -node.prob) for tree in candidates]  # stable: parents first
    taken = [0] * n
    for i in sorted(range(n), key=lambda j: -need[j]):
        cap = slo_cap(need[i], depth)
        accepted = 0.0
        while accepted < cap and taken[i] < min(n_max, len(ranked[i])) and remaining > 0:
            accepted += ranked[i][taken[i]].prob
            taken[i] += 1
            remaining -= 1
    heads = [(-ranked[i][taken[i]].prob, i) for i in range(n) if taken[i] < len(ranked[i])]
    heapq.heapify(heads)
    while remaining > 0 and heads:
        _, i = heapq.heappop(heads)
        taken[i] += 1
        remaining -= 1
        if taken[i] < len(ranked[i]):
            heapq.heappush(heads, (-ranked[i][taken[i]].prob, i))
    return [ranked[i][: taken[i]] for i in range(n)]


def adaptive_shape(
    active: int,
    *,
    verify_budget: int,
    draft_budget: int,
    depth_bounds: tuple[int, int],
    max_width: int,
    c1: float,
    c2: int,
) -> tuple[int, int]:
    """Depth and beam width from the number of active requests (sec. 5.2, eqs. 8-9):

    d = clip(floor(B1 / (n + c1)) - 1, D_min, D_max), w = clip(floor(B2 / n) + c2, 1, W_max)
    with B1 the verifier's and B2 the draft model's tokens per step: deep trees when few requests share the
    budget, shallow and narrow ones under load."""
    n = max(active, 1)
    low, high = depth_bounds
    depth = min(max(int(verify_budget // (n + c1)) - 1, low), high)
    width = min(max(draft_budget // n + c2, 1), max_width)
    return depth, width
