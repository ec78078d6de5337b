"""How AdaServe's planner builds a stretch of throughput selection steps (core/control/adaserve/stretch.py): a
step that builds one does not gather its columns first (the stretch gathers them again), and a stretch's rows
reach no further than a third of the tokens any request has left. Both only change how much is computed; that the
records stay the same is tests/test_adaserve_stretch.py's whole-run comparison."""

from __future__ import annotations

from typing import Any

import pytest

from core.control.adaserve import policy as policy_module
from core.control.adaserve.policy import TreePlanner
from core.control.adaserve.stretch import STRETCH_STEPS, TOKENS_PER_STEP, SelectionStretch
from tests.fakes import compiled
from tests.test_adaserve_stretch import _profile_run


# The test patches TreePlanner's methods, which a compiled planner calls directly (tests.fakes.compiled).
@pytest.mark.skipif(compiled(policy_module), reason="patches a method of a mypyc-compiled class")
def test_a_step_that_builds_a_stretch_gathers_no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    steps_seen: list[list[str]] = []  # per planned step: the calls it made
    before: dict[int, int] = {}  # each decoding request's run.next when its step was planned (0: not drawn yet)
    plan = TreePlanner.plan
    step_columns = TreePlanner._step_columns
    build = policy_module.build_stretch

    def planning(self: TreePlanner, replica: Any, now: float) -> Any:
        steps_seen.append([])
        before.clear()
        for item in replica.decoding:
            run = item.planned.run if item.planned is not None else None
            before[id(item)] = run.next if run is not None and run.next < run.length else 0
        return plan(self, replica, now)

    def columns(self: TreePlanner, *args: Any) -> Any:
        steps_seen[-1].append("columns")
        return step_columns(self, *args)

    def building(decoding: list[Any], dims: Any, budget: int, steps: int, throughput: Any) -> SelectionStretch:
        steps_seen[-1].append("build")
        # Each run advanced past this step's entry, as the columns leave it (build_stretch's contract).
        assert all(item.planned.run.next == before[id(item)] + 1 for item in decoding)
        assert 1 < steps <= min(STRETCH_STEPS, *((item.out_left + 1) // TOKENS_PER_STEP for item in decoding))
        return build(decoding, dims, budget, steps, throughput)

    monkeypatch.setattr(TreePlanner, "plan", planning)
    monkeypatch.setattr(TreePlanner, "_step_columns", columns)
    monkeypatch.setattr(policy_module, "build_stretch", building)
    _profile_run("bench-chat", 300, {}, True)
    built = [calls for calls in steps_seen if "build" in calls]
    assert len(built) > 20 and sum("columns" in calls for calls in steps_seen) > 20  # (both kinds of step)
    assert all(calls == ["build"] for calls in built)
