"""AdaServe's tree algorithms against the paper's worked example, brute force, and each other."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from core.control.adaserve.speculation import (
    accepted_draft_tokens,
    candidate_shape,
    chain_selection,
    draft_estimate,
    path_probabilities,
    select,
)
from core.control.adaserve.trees import (
    Node,
    adaptive_shape,
    beam_search,
    optimal_trees,
    select_trees,
)
from core.step_time import expected_accepted_tokens


def table_draft(table: dict[tuple[int, ...], list[float]]):
    """A draft given as explicit conditionals per path (paths missing from the table have no children)."""

    def children(path: tuple[int, ...]) -> list[tuple[int, float]]:
        return list(enumerate(table.get(path, [])))

    return children


def geometric_draft(a: float, vocab: int = 8):
    """The simulator's ranked-geometric model: the rank-j child has conditional a (1 - a)^(j-1)."""

    def children(path: tuple[int, ...]) -> list[tuple[int, float]]:
        return [(j, a * (1 - a) ** j) for j in range(vocab)]

    return children


def random_draft(seed: int, vocab: int = 3):
    """Fixed random conditionals per path (Dirichlet), the same on every call."""
    cache: dict[tuple[int, ...], list[tuple[int, float]]] = {}

    def children(path: tuple[int, ...]) -> list[tuple[int, float]]:
        if path not in cache:
            rng = np.random.default_rng([seed, len(path), *path])
            probs = rng.dirichlet(np.ones(vocab + 1))[:vocab]  # the rest is mass outside the vocabulary
            cache[path] = list(enumerate(probs.tolist()))
        return cache[path]

    return children


# ---------------------------------------------------------------- Figure 5


FIG5_R0 = {
    (): [0.7, 0.1],
    (0,): [0.8, 0.1],
    (1,): [0.5],
    (0, 0): [0.6, 0.3],
    (0, 1): [0.2],
}
FIG5_R1 = {
    (): [0.5, 0.4],
    (0,): [0.5, 0.3],
    (1,): [0.6, 0.3],
    (0, 0): [0.4],
    (1, 0): [0.5],
}


def test_figure_5_slo_then_throughput_selection() -> None:
    """Two requests, budget 8 (roots included), beam width 2, depth 3, A_cap 0.6 and 0.8 (sec. 4.3, Fig. 5)."""
    candidates = [beam_search(0, table_draft(FIG5_R0), depth=3, width=2), beam_search(1, table_draft(FIG5_R1), 3, 2)]
    # t1..t6 of each request: the candidate tree level by level, as the figure numbers them.
    label = {node.path: f"t{i + 1}" for tree in candidates for i, node in enumerate(tree) if node.request == 0}
    label1 = {node.path: f"t{i + 1}" for i, node in enumerate(candidates[1])}
    assert [len(tree) for tree in candidates] == [6, 6]
    assert candidates[0][0].prob == pytest.approx(0.7)
    trees = select_trees(candidates, need=[0.6, 0.8], budget=8, depth=3, n_max=8)
    names0 = [label[node.path] for node in trees[0]]
    names1 = [label1[node.path] for node in trees[1]]
    # SLO-customized: t1 alone meets 0.6 for r0; r1 needs t1 and t2 (0.5 + 0.4 >= 0.8).
    only_slo = select_trees(candidates, need=[0.6, 0.8], budget=5, depth=3, n_max=8)
    assert [label[n.path] for n in only_slo[0]] == ["t1"]
    assert [label1[n.path] for n in only_slo[1]] == ["t1", "t2"]
    # Throughput-optimized with the 3 left: t3 and t5 of r0, t3 of r1, the most probable remaining nodes.
    assert sorted(names0) == ["t1", "t3", "t5"]
    assert sorted(names1) == ["t1", "t2", "t3"]
    assert sum(len(tree) + 1 for tree in trees) == 8


def test_figure_5_vectorised_selection_agrees() -> None:
    candidates = [beam_search(0, table_draft(FIG5_R0), 3, 2), beam_search(1, table_draft(FIG5_R1), 3, 2)]
    approx = np.array([[node.prob for node in tree] for tree in candidates])
    selection = select(approx, np.array([0.6, 0.8]), budget=8, depth=3, n_max=8)
    assert selection.slo_counts.tolist() == [1, 2]
    assert selection.counts.tolist() == [3, 3]
    assert selection.verified_tokens == 8
    # Both were behind (A_cap 0.6, 0.8), neither beyond the depth-3 tree's reach.
    assert (selection.behind, selection.beyond_tree) == (2, 0)
    # A need above the depth (A(r) > d + 1) is counted as beyond one step's reach; a request the budget
    # leaves nothing in the SLO phase is not counted as served.
    far = select(approx, np.array([3.5, 0.8]), budget=8, depth=3, n_max=8)
    assert far.slo_counts.tolist() == [6, 0] and (far.behind, far.beyond_tree) == (1, 1)


def test_n_max_limits_the_slo_phase_and_the_largest_need_goes_first() -> None:
    candidates = [beam_search(0, table_draft(FIG5_R0), 3, 2), beam_search(1, table_draft(FIG5_R1), 3, 2)]
    capped = select_trees(candidates, need=[0.6, 2.5], budget=20, depth=3, n_max=2)
    assert len(capped[1]) == 6  # n_max stops the SLO phase at 2; the throughput phase adds the rest
    scarce = select_trees(candidates, need=[0.6, 2.5], budget=4, depth=3, n_max=8)
    assert [len(t) for t in scarce] == [0, 2]  # r1's larger need is served first and takes the budget


# ---------------------------------------------------------------- Algorithm 1 is optimal


def _best_sums_by_size(children, request: int, depth: int) -> dict[int, float]:
    """Brute force: the largest sum of f over connected trees (rooted at the root) of each size."""
    nodes: list[Node] = []
    frontier: list[Node | None] = [None]
    for _ in range(depth):
        nxt = []
        for parent in frontier:
            path = () if parent is None else parent.path
            base = 1.0 if parent is None else parent.prob
            for token, p in children(path):
                nxt.append(Node(request, (*path, token), base * p))
        nodes.extend(nxt)
        frontier = nxt
    best: dict[int, float] = {0: 0.0}
    paths = {node.path for node in nodes}
    for size in range(1, 4):
        for subset in itertools.combinations(nodes, size):
            chosen = {node.path for node in subset}
            if all(node.path[:-1] in chosen or len(node.path) == 1 for node in subset):
                assert chosen <= paths
                best[size] = max(best.get(size, 0.0), sum(node.prob for node in subset))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_algorithm_1_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    children = [random_draft(100 * seed + i, vocab=2) for i in range(2)]
    best = [_best_sums_by_size(children[i], i, depth=3) for i in range(2)]
    budget = 2 + int(rng.integers(1, 4))  # at most 3 draft tokens: depth 3 holds every candidate tree
    need = rng.uniform(0.0, 1.2, size=2).tolist()
    feasible = [
        best[0][m0] + best[1][m1]
        for m0 in best[0]
        for m1 in best[1]
        if m0 + m1 <= budget - 2 and best[0][m0] >= need[0] and best[1][m1] >= need[1]
    ]
    trees = optimal_trees(children, need, budget)
    if not feasible:
        assert trees is None
        return
    assert trees is not None
    assert sum(len(t) for t in trees) <= budget - 2
    assert all(sum(n.prob for n in trees[i]) >= need[i] for i in range(2))
    assert sum(n.prob for t in trees for n in t) == pytest.approx(max(feasible))


@pytest.mark.parametrize("seed", range(8))
def test_practical_algorithm_matches_the_optimum_when_the_beam_covers_it(seed: int) -> None:
    """Theorem 4.1: a D_opt-step beam search of width B contains the optimal trees; with an exact draft and
    no n_max limit Algorithm 2 then finds trees as good as Algorithm 1's and meets the same needs."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 4))
    children = [random_draft(1000 * seed + i) for i in range(n)]
    budget = n + int(rng.integers(2, 7))
    need = rng.uniform(0.0, 1.0, size=n)
    optimum = optimal_trees(children, need.tolist(), budget)
    while optimum is None:  # ask less until the budget can meet every need
        need /= 2
        optimum = optimal_trees(children, need.tolist(), budget)
    need = need.tolist()
    depth = max(node.depth for tree in optimum for node in tree)
    candidates = [beam_search(i, children[i], depth=depth, width=budget) for i in range(n)]
    practical = select_trees(candidates, need, budget, depth=depth, n_max=budget)
    assert all(sum(node.prob for node in practical[i]) >= need[i] for i in range(n))
    assert sum(len(t) for t in practical) == sum(len(t) for t in optimum)
    assert sum(node.prob for t in practical for node in t) == pytest.approx(
        sum(node.prob for t in optimum for node in t)
    )


def test_a_shallow_beam_falls_short_of_the_optimum() -> None:
    """The same comparison can fail: a depth-1 beam cannot hold a deep optimal tree."""
    children = [geometric_draft(0.9)]
    optimum = optimal_trees(children, [0.0], budget=5)
    assert optimum is not None and max(node.depth for node in optimum[0]) == 4
    shallow = select_trees([beam_search(0, children[0], depth=1, width=5)], [0.0], 5, depth=1, n_max=5)
    assert sum(n.prob for n in shallow[0]) < sum(n.prob for n in optimum[0]) - 0.5


# ---------------------------------------------------------------- the simulator's vectorised model


@pytest.mark.parametrize(("depth", "width"), [(1, 1), (3, 2), (4, 3), (6, 4), (5, 1)])
def test_tabulated_shape_is_the_beam_search_of_the_geometric_draft(depth: int, width: int) -> None:
    shape = candidate_shape(depth, width)
    for a in (0.3, 0.6, 0.85):
        tree = beam_search(0, geometric_draft(a, vocab=width + 2), depth, width)
        table = path_probabilities(shape, np.array([a]))[0]
        assert table.tolist() == pytest.approx([node.prob for node in tree])
        assert shape.depth.tolist() == [node.depth for node in tree]
        # Each node's parent is one level up and differs by its rank (equal-probability siblings may swap).
        for i in range(shape.size):
            parent = shape.parent[i]
            assert (parent == -1) == (shape.depth[i] == 1)
            if parent >= 0:
                assert shape.depth[parent] == shape.depth[i] - 1
                assert shape.offset[i] == shape.offset[parent] + shape.rank[i] - 1


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_selection_equals_algorithm_2_on_nodes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 7))
    depth, width = int(rng.integers(1, 6)), int(rng.integers(1, 4))
    a = rng.uniform(0.2, 0.95, size=n)
    need = rng.uniform(-1.0, 4.0, size=n)
    budget = int(rng.integers(n, n + n * depth * width + 3))
    n_max = int(rng.integers(1, 8))
    shape = candidate_shape(depth, width)
    selection = select(path_probabilities(shape, a), need, budget, depth, n_max)
    trees = [beam_search(i, geometric_draft(a[i], vocab=width + 1), depth, width) for i in range(n)]
    reference = select_trees(trees, need.tolist(), budget, depth, n_max)
    assert selection.counts.tolist() == [len(t) for t in reference]
    for row in selection.selected:  # each selected node's parent is selected: a valid tree (App. B)
        chosen = np.flatnonzero(row)
        assert all(shape.parent[i] < 0 or row[shape.parent[i]] for i in chosen)


def test_accepted_tokens_follow_theorem_3_1_and_the_explicit_walk() -> None:
    """Mean accepted draft tokens = sum of true f over the selected tree (Theorem 3.1), and the depth's
    distribution equals a walk that draws each level's true token (rank j with probability a (1-a)^(j-1))."""
    rng = np.random.default_rng(7)
    shape = candidate_shape(4, 3)
    a_true = np.array([0.8, 0.55])
    a_hat = np.array([0.6, 0.7])  # a mismatched draft picks the tree; the truth decides acceptance
    selection = select(path_probabilities(shape, a_hat), np.array([1.5, 0.5]), budget=12, depth=4, n_max=6)
    true = path_probabilities(shape, a_true)
    draws = 40_000
    samples = np.stack(
        [accepted_draft_tokens(shape, selection, true, rng.uniform(size=2)) for _ in range(draws)], axis=1
    )
    for i in range(2):
        chosen = selection.selected[i]
        assert chosen.sum() == selection.counts[i]
        expected = true[i][chosen].sum()
        assert samples[i].mean() == pytest.approx(expected, abs=4 * samples[i].std() / math.sqrt(draws))
        # The walk: from the root, draw a rank per level; go on while that child is in the selected tree.
        walk = np.zeros(draws, dtype=np.int64)
        current = np.full(draws, -1)
        alive = np.ones(draws, dtype=bool)
        for level in range(1, 5):
            ranks = rng.geometric(a_true[i], size=draws)
            child = np.full(draws, -1)
            for node in np.flatnonzero(chosen & (shape.depth == level)):
                child[(current == shape.parent[node]) & (ranks == shape.rank[node])] = node
            alive &= child >= 0
            walk += alive
            current = np.where(alive, child, -2)
        for k in range(5):
            assert (samples[i] == k).mean() == pytest.approx((walk == k).mean(), abs=0.015)


def test_a_static_chain_yields_the_engines_expected_tokens() -> None:
    """vLLM-Spec(k) on this model: a k-chain accepts, with the verifier's token, E = (1 - a^(k+1)) / (1 - a),
    the fast path's per-step expectation (core/step_time.py)."""
    rng = np.random.default_rng(1)
    for width in (1, 3, 5):
        shape = candidate_shape(width, 1)
        a = np.full(20_000, 0.7)
        accepted = accepted_draft_tokens(
            shape, chain_selection(len(a), width), path_probabilities(shape, a), rng.uniform(size=len(a))
        )
        assert 1 + accepted.mean() == pytest.approx(expected_accepted_tokens(0.7, width), rel=0.02)


def test_draft_mismatch_perturbs_only_the_estimate() -> None:
    rng = np.random.default_rng(0)
    truth = rng.beta(7.5, 2.5, size=50_000)
    assert np.array_equal(draft_estimate(truth, 0.0, 0.0, rng), np.clip(truth, 1e-9, 1 - 1e-9))
    small = draft_estimate(truth, 0.3, 0.0, rng)
    large = draft_estimate(truth, 1.5, 0.0, rng)
    assert np.abs(large - truth).mean() > 2 * np.abs(small - truth).mean() > 0
    assert (draft_estimate(truth, 0.0, 1.0, rng) > truth).all()  # an overconfident draft


def test_adaptive_depth_and_width_follow_eqs_8_and_9() -> None:
    settings = {"verify_budget": 96, "draft_budget": 32, "depth_bounds": (1, 8), "max_width": 4, "c1": 1.0, "c2": 0}
    assert adaptive_shape(1, **settings) == (8, 4)  # light load: the bounds
    assert adaptive_shape(11, **settings) == (7, 2)  # floor(96 / 12) - 1 = 7, floor(32 / 11) = 2
    assert adaptive_shape(40, **settings) == (1, 1)  # floor(96 / 41) - 1 = 1, floor(32 / 40) = 0 -> 1
    shapes = [adaptive_shape(n, **settings) for n in range(1, 80)]
    assert all(a[0] >= b[0] and a[1] >= b[1] for a, b in itertools.pairwise(shapes))
