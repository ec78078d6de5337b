"""AdaServe's throughput selection steps computed several at once (core/control/adaserve/stretch.py) give what
the steps give one at a time, to the bit.

The whole run is held to the planner with stretches turned off (every record, engine sample, scheduler count
and step length), on profiles whose selection steps come in stretches, and with the ablation; each stretch
row is held to `TreeScheduler.throughput_step` asked for that step alone, at the stretch's B and after a
change of B.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from core.control.adaserve import policy as policy_module
from core.control.adaserve.policy import AdaServePolicy, TreePlanner
from core.control.adaserve.scheduler import AcceptanceRun, TreeScheduler
from core.control.adaserve.stretch import SelectionStretch, build_stretch
from core.profile import load_calibration, load_profile
from core.step_planner_api import StepRequest
from core.step_time import StepTimeModel
from core.workload import build_load_plan
from tests.fakes import compiled
from tests.test_adaserve_fast_path import Run, _assert_same, _engine_run


def _profile_run(name: str, requests: int, update: dict[str, Any], stretches: bool) -> Run:
    profile = load_profile(name)
    calibration = load_calibration(profile)
    policy = AdaServePolicy(profile.adaserve.model_copy(update=update), calibration, profile.seed)
    make = policy.step_planner

    def planner(replica_index: int) -> TreePlanner:
        made = make(replica_index)
        made.stretches = stretches
        return made

    policy.step_planner = planner  # type: ignore[method-assign]
    plan = build_load_plan(profile, seed=profile.seed, requests=requests)
    return _engine_run(calibration, profile.knobs, plan, policy, profile.seed, False)


@pytest.mark.parametrize(
    ("name", "requests", "update"),
    [
        ("bench-chat", 400, {}),  # no TPOT SLO: every selection step is the throughput phase's
        ("adaserve-mix", 300, {"slo_selection": False}),  # the ablation: TPOT tiers, the throughput phase alone
        ("adaserve-mix", 300, {}),  # TPOT tiers with the SLO phase: no stretch is built
        ("bench-chat", 300, {"mismatch": 0.0}),  # a perfect drafter: estimates equal to the truths
    ],
)
def test_stretches_equal_the_step_by_step_selection(
    name: str, requests: int, update: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[int] = []
    take = SelectionStretch.take

    def counted(self: SelectionStretch, *args: Any) -> Any:
        row = take(self, *args)
        taken.append(row is not None)
        return row

    monkeypatch.setattr(SelectionStretch, "take", counted)
    fast = _profile_run(name, requests, update, True)
    # A compiled planner calls SelectionStretch.take directly, past the patch (tests.fakes.compiled): there the
    # runs are compared, not counted.
    counted_calls = not compiled(policy_module)
    if name == "adaserve-mix" and not update:
        assert not taken
    elif counted_calls:
        assert sum(taken) > 100  # (rows are taken from stretches)
    taken.clear()
    _assert_same(fast, _profile_run(name, requests, update, False))
    assert not taken


def _runs(rng: np.random.Generator, n: int, length: int) -> list[AcceptanceRun]:
    runs = []
    for _ in range(n):
        truth = np.minimum(np.maximum(rng.beta(3.0, 1.5, length), 1e-9), 1.0 - 1e-9)
        truth[: length // 5] = 0.5  # equal rates: ties among the requests' candidates
        # (clipped, as draw_run's estimates are)
        estimate = np.minimum(np.maximum(truth * rng.uniform(0.8, 1.2, length), 1e-9), 1.0 - 1e-9)
        runs.append(AcceptanceRun(truth, estimate, rng.random(length), length))
    return runs


@pytest.mark.parametrize(("n", "steps"), [(1, 2), (4, 8), (11, 5), (30, 8)])
def test_each_stretch_row_is_the_throughput_step_of_its_step(n: int, steps: int) -> None:
    rng = np.random.default_rng(n * 10 + steps)
    scheduler = TreeScheduler(load_profile("bench-chat").adaserve, StepTimeModel(((0.01, 1e-5, 0, 0, 0),)), rng)
    runs = _runs(rng, n, 40)
    decoding: list[Any] = []
    for run in runs:
        run.next = 4  # the stretch's first step took entry 3
        # A real StepRequest (a compiled build takes no stand-in), with only what build_stretch reads set.
        track = type("Track", (), {"run": run})()
        decoding.append(StepRequest(req=None, prompt_left=0, out_left=0, planned=track))
    budget = n + 3 * n  # room for some of each request's candidates
    dims = scheduler.shape(n, budget)
    stretch = build_stretch(decoding, dims, budget, steps, scheduler.throughput_step)
    step_by_step = TreeScheduler(scheduler.spec, scheduler.model, rng)
    for step in range(steps):
        if step == steps // 2:  # B grows by one (more context): the rows left are selected afresh
            budget += 1
            if scheduler.shape(n, budget) != dims:
                break
            if step:
                taken = stretch.take(decoding, budget, dims)
                assert taken is not None
                verified, emitted = taken
            else:
                stretch.select(0, budget)
                verified, emitted = stretch.verified[0], stretch.emitted[0]
        elif step:
            taken = stretch.take(decoding, budget, dims)
            assert taken is not None
            verified, emitted = taken
        else:
            verified, emitted = stretch.verified[0], stretch.emitted[0]
        entry = 3 + step
        paired = np.array([run.estimate_list[entry] for run in runs] + [run.truth_list[entry] for run in runs])
        uniforms = np.array([run.uniform_list[entry] for run in runs])
        alone = step_by_step.throughput_step(paired, uniforms, budget)
        assert (verified, emitted) == (alone[0].tolist(), alone[1].tolist())
        assert all(run.next == 4 + step for run in runs)  # (each take advances every run by one)
    if n > 1:
        assert stretch.take(decoding[::-1], budget, dims) is None  # another order: another batch
