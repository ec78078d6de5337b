"""AdaServe's selection step on its fast path gives what the general step gives, to the bit.

A selection step with nobody behind (Algorithm 2's throughput phase alone: every bench-chat selection step)
is asked directly (`TreeScheduler.throughput_step`, from the planner's columns) instead of through
`scheduler.step`'s DecodeBatch; the path probabilities are computed in one-dimensional calls instead of
broadcast outer products; the roots and the verifier's own token are counted as the reductions' initial
value; the full tree's all-selected mask is shared. Each is held here to the form it replaced: the whole run
against the planner with the direct path turned off (every record, every engine sample, the scheduler's
counts and the step lengths), and each function against its plain numpy formula on random inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from core.backend_api import LoadPlan
from core.control.adaserve import policy as policy_module
from core.control.adaserve.policy import AdaServePolicy, TreePlanner
from core.control.adaserve.scheduler import TreeScheduler
from core.control.adaserve.speculation import (
    accepted_depths,
    candidate_shape,
    every_candidate,
    most_probable,
    path_probabilities,
    selected_counts,
)
from core.profile import AdaServeSpec, Calibration, KnobsSpec, load_calibration, load_profile
from core.records import RequestSLO, RequestSpec
from core.workload import build_load_plan
from tests.fakes import compiled
from tests.test_adaserve_fast_path import Run, _assert_same, _engine_run
from tests.test_sim import tiny_calibration


def _run(
    calibration: Calibration, knobs: KnobsSpec, plan: LoadPlan, spec: AdaServeSpec, seed: int, direct: bool
) -> Run:
    policy = AdaServePolicy(spec, calibration, seed)
    if not direct:
        make = policy.step_planner

        def general(replica_index: int) -> TreePlanner:
            planner = make(replica_index)
            planner._throughput = None  # every selection step through scheduler.step
            return planner

        policy.step_planner = general  # type: ignore[method-assign]
    return _engine_run(calibration, knobs, plan, policy, seed, False)


def _profile_case(name: str, requests: int, update: dict[str, Any]) -> Callable[[bool], Run]:
    profile = load_profile(name)
    calibration = load_calibration(profile)
    spec = profile.adaserve.model_copy(update=update)

    def run(direct: bool) -> Run:
        plan = build_load_plan(profile, seed=profile.seed, requests=requests)
        return _run(calibration, profile.knobs, plan, spec, profile.seed, direct)

    return run


def _mixed_tiers_case(update: dict[str, Any]) -> Callable[[bool], Run]:
    """Requests with and without a TPOT SLO side by side (tiers around the plain step's 10 ms): a step's needs
    start at any position of the batch, and some steps have requests behind."""
    calibration = tiny_calibration()
    knobs = KnobsSpec(max_num_seqs=32, max_num_batched_tokens=512)
    tpots = (None, None, 0.0105, 0.012, 0.02)

    def run(direct: bool) -> Run:
        rng = np.random.default_rng(7)
        specs = [
            RequestSpec(
                request_id=i,
                prompt_tokens=int(rng.integers(50, 700)),
                output_tokens=int(rng.integers(20, 300)),
                arrival_s=0.03 * i,
                slo=RequestSLO(e2e_s=30.0, tpot_s=tpots[int(rng.integers(len(tpots)))]),
                acceptance=0.7,
            )
            for i in range(240)
        ]
        plan = LoadPlan(requests=iter(specs), mode="open", max_requests=len(specs))
        return _run(calibration, knobs, plan, AdaServeSpec().model_copy(update=update), 4, direct)

    return run


@pytest.mark.parametrize(
    ("case", "make"),
    [
        ("bench-chat", lambda: _profile_case("bench-chat", 400, {})),  # no TPOT SLO: nobody is ever behind
        ("adaserve-mix", lambda: _profile_case("adaserve-mix", 300, {})),  # TPOT tiers: some steps have requests behind
        # The ablation: the needs are built, the throughput phase runs alone.
        ("adaserve-mix-no-slo-phase", lambda: _profile_case("adaserve-mix", 300, {"slo_selection": False})),
        ("mixed-tiers", lambda: _mixed_tiers_case({})),
        ("mixed-tiers-no-slo-phase", lambda: _mixed_tiers_case({"slo_selection": False})),
    ],
)
def test_direct_throughput_step_equals_the_general_step(
    case: str, make: Callable[[], Callable[[bool], Run]], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    throughput_step = TreeScheduler.throughput_step

    def counted(self: TreeScheduler, *args: Any) -> Any:
        asked.append(1)
        return throughput_step(self, *args)

    monkeypatch.setattr(TreeScheduler, "throughput_step", counted)
    run = make()
    direct = run(True)
    assert len(asked) > 50  # (the direct path is taken)
    asked.clear()
    _assert_same(direct, run(False))
    assert not asked


def _outer_form(shape: Any, a: np.ndarray) -> np.ndarray:
    """The path probabilities as the broadcast outer products computed them before."""
    depth, offset = shape.exponents
    logs = np.multiply.outer(np.log(a), depth)
    logs += np.multiply.outer(np.log1p(-a), offset)
    return np.exp(logs, out=logs)


@pytest.mark.parametrize(("depth", "width"), [(1, 1), (3, 8), (3, 6), (2, 5), (6, 2), (8, 4)])
def test_path_probabilities_equal_the_outer_products_bit_for_bit(depth: int, width: int) -> None:
    shape = candidate_shape(depth, width)
    rng = np.random.default_rng(depth * 100 + width)
    for rows in (0, 1, 2, 7, 20, 63, 256):
        a = np.minimum(np.maximum(rng.beta(2.0, 1.0, rows), 1e-9), 1.0 - 1e-9)
        a[: rows // 4] = rng.choice([1e-9, 1.0 - 1e-9, 0.5], rows // 4)  # the clip's bounds and exact values
        fast = path_probabilities(shape, a, clipped=True)
        assert fast.shape == (rows, shape.size)
        assert fast.view(np.uint64).tolist() == _outer_form(shape, a).view(np.uint64).tolist()
        broadcast = path_probabilities(shape, a, clipped=True, shared=False)  # (a stretch's form)
        assert broadcast.view(np.uint64).tolist() == fast.view(np.uint64).tolist()


def test_counts_with_an_initial_value_equal_the_counts_plus_it() -> None:
    shape = candidate_shape(3, 8)
    rng = np.random.default_rng(5)
    for n in (1, 4, 9, 30):
        both = path_probabilities(shape, rng.uniform(0.05, 0.95, 2 * n), clipped=True)
        selected = most_probable(both[:n], int(rng.integers(1, n * shape.size)))
        uniforms = rng.random(n)
        reach = (both[n:] * selected) @ shape.level_onehot
        assert (
            accepted_depths(shape, selected, both[n:], uniforms, 1).tolist()
            == ((reach > uniforms[:, None]).sum(axis=1) + 1).tolist()
        )
        assert selected_counts(selected, 1).tolist() == (selected.sum(axis=1) + 1).tolist()
        assert accepted_depths(shape, selected, both[n:], uniforms).tolist() == (
            (reach > uniforms[:, None]).sum(axis=1).tolist()
        )


def test_the_shared_all_selected_mask_is_all_true_and_read_only() -> None:
    mask = every_candidate(4, 24)
    assert mask.shape == (4, 24) and mask.all() and mask is every_candidate(4, 24)
    with pytest.raises(ValueError):
        mask[0, 0] = False


# Patches TreePlanner._step_columns, which a compiled planner calls directly (tests.fakes.compiled).
@pytest.mark.skipif(compiled(policy_module), reason="patches a method of a mypyc-compiled class")
def test_step_columns_hold_each_request_at_its_position(monkeypatch: pytest.MonkeyPatch) -> None:
    """The columns the selection step reads, request by request: this step's entry of each request's randomness
    and, where some request is behind, a need for every request (A(r) - 1 with a TPOT SLO, 0.0 without one,
    built from the first request that has one), in the batch's order."""
    step_columns = TreePlanner._step_columns
    checked: list[bool] = []

    def checking(self: TreePlanner, replica: Any, now: float, prefill: Any, budget: int, spec_steps: int) -> Any:
        columns, needs = step_columns(self, replica, now, prefill, budget, spec_steps)
        decoding = replica.decoding
        n = len(decoding)
        runs = [(item.planned.run, item.planned.run.next - 1) for item in decoding]
        assert columns.tolist() == [run.estimate_list[k] for run, k in runs] + [
            run.truth_list[k] for run, k in runs
        ] + [run.uniform_list[k] for run, k in runs]
        if needs is not None:
            step_s = self._spec_step_s(replica, prefill, budget, spec_steps)
            expected = [
                (now - t.first_token_s + step_s) / t.tpot_s - (t.output_tokens - item.out_left)
                if (t := item.planned).tpot_s < np.inf
                else 0.0
                for item in decoding
            ]
            assert len(needs) == n and needs.tolist() == expected
            checked.append(not np.isfinite(decoding[0].planned.tpot_s))
        return columns, needs

    monkeypatch.setattr(TreePlanner, "_step_columns", checking)
    _mixed_tiers_case({})(True)
    assert sum(checked) > 10  # (steps with requests behind whose first request has no TPOT SLO)
