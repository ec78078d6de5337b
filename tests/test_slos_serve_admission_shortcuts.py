"""SLOs-Serve's admission shortcuts give the records the admission DP itself gives, exactly.

`VirtualReplica.room` answers (None) for the DP when every sequence slot is held: the DP's slot condition (a new
request is admitted only while `state.new < slots_free`) then admits nobody, so the policy skips building the
plans and running the DP (policy._route). Overloaded runs (capacity's probes above the base rate) ask it at
most arrivals and best-effort retries. The reference: the same run with `room` never None (every offer goes
through the DP); a shortcut one slot off must differ from it (the test can fail). Also: `_running_demand`
works out the row of a deadline equal to the one before once.
"""

from __future__ import annotations

import numpy as np
import pytest

from core.capacity import at_rate
from core.control.slos_serve import virtual
from core.control.slos_serve.admission import PlanRequest, _running_demand
from core.modes import ModeContext, make_policy
from core.profile import load_calibration, load_profile
from core.records import RequestRecord
from core.sim.engine import SimEngine
from core.workload import build_load_plan
from tests.fakes import compiled
from tests.test_sim_fast_path import assert_same_records

REQUESTS = 500
# The tests patch VirtualReplica.room, which a compiled policy calls directly (tests.fakes.compiled).
PATCHED = pytest.mark.skipif(compiled(virtual), reason="patches a method of a mypyc-compiled class")


def _quickstart(rate_rps: float) -> list[RequestRecord]:
    profile = at_rate(load_profile("quickstart"), rate_rps)
    calibration = load_calibration(profile)
    context = ModeContext(profile=profile, calibration=calibration, seed=profile.seed)
    plan = build_load_plan(profile, seed=profile.seed, requests=REQUESTS)
    engine = SimEngine(calibration, profile.knobs, plan, seed=profile.seed, policy=make_policy("slos-serve", context))
    return engine.run()


def _counting_full(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    answers: list[bool] = []  # whether `room` said full
    original = virtual.VirtualReplica.room

    def counting(self: virtual.VirtualReplica, now: float, *, best_effort: bool = False) -> list | None:
        held = original(self, now, best_effort=best_effort)
        answers.append(held is None)
        return held

    monkeypatch.setattr(virtual.VirtualReplica, "room", counting)
    return answers


def _never_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference: `room` advances the replica as before but never answers for the DP."""

    def never(self: virtual.VirtualReplica, now: float, *, best_effort: bool = False) -> list | None:
        return self.held(now, best_effort=best_effort)

    monkeypatch.setattr(virtual.VirtualReplica, "room", never)


@PATCHED
@pytest.mark.parametrize("rate_rps", [17.0, 25.5, 34.0])
def test_full_replicas_skip_the_dp_with_the_same_records(rate_rps: float, monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patch:
        answers = _counting_full(patch)
        fast = _quickstart(rate_rps)
    assert sum(answers) > 0.2 * len(answers)  # the shortcut does answer (overloaded: most offers)
    with monkeypatch.context() as patch:
        _never_full(patch)
        reference = _quickstart(rate_rps)
    assert_same_records(fast, reference)


@PATCHED
def test_a_shortcut_one_slot_off_changes_the_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison above can fail: declaring a replica full one slot early declines requests the DP admits."""
    with monkeypatch.context() as patch:
        _never_full(patch)
        reference = _quickstart(25.5)

    def early(self: virtual.VirtualReplica, now: float, *, best_effort: bool = False) -> list | None:
        held = self.held(now, best_effort=best_effort)
        return None if self.planner.slots_free(len(held), 1) <= 1 else held

    with monkeypatch.context() as patch:
        patch.setattr(virtual.VirtualReplica, "room", early)
        broken = _quickstart(25.5)
    with pytest.raises(AssertionError):
        assert_same_records(broken, reference)


def test_running_demand_rows_of_equal_deadlines_are_worked_out_once() -> None:
    """`_running_demand` reuses the row of a deadline equal to the one before: every row equals the row worked
    out for its deadline alone (random decoders over two tiers, deadlines with runs of equal values)."""
    rng = np.random.default_rng(11)
    tier_of = {0.05: 0, 0.1: 1}
    for _ in range(200):
        decoders = [
            PlanRequest(
                i, 0.0, 0, int(rng.integers(0, 80)), float(rng.choice([0.05, 0.1])), 500, 400, float(rng.random())
            )
            for i in range(int(rng.integers(1, 12)))
        ]
        deadlines = sorted(float(x) for x in rng.choice(rng.random(4) * 3.0, size=int(rng.integers(1, 10))))
        rows = _running_demand(0.5, decoders, tier_of, 2, deadlines)
        assert rows == [_running_demand(0.5, decoders, tier_of, 2, [d])[0] for d in deadlines]
