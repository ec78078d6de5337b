"""SLOs-Serve's admission DP reads the virtual replica's records directly (virtual.running_parts): the same parts,
and so the same admissions, as the PlanRequests `Tracked.as_plan` makes of them (admission.plan_parts).

Held at every admission decision of real runs (bench-chat, quickstart overloaded, slos-serve-mixed with its
tiers and best-effort retries) and on made-up records at the edges of as_plan's arithmetic (a prefill that
rounds to none, half tokens, overdue decodes, a pace not started yet).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from core.control.slos_serve import virtual
from core.control.slos_serve.admission import AdmissionPlanner, PlannerSettings, PlanRequest, plan_parts
from core.control.slos_serve.virtual import Tracked, running_parts
from core.step_time import StepTimeModel
from tests.fakes import compiled
from tests.test_sim_fast_path import _run as run_profile

REQUESTS = 300
# The check patches VirtualReplica.try_admit, which a compiled policy calls directly (tests.fakes.compiled).
PATCHED = pytest.mark.skipif(compiled(virtual), reason="patches a method of a mypyc-compiled class")


def _checking(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """`try_admit` with each decision's parts and admission held to the PlanRequests' (forced, decoders) seen."""
    seen: list[tuple[int, int]] = []
    original = virtual.VirtualReplica.try_admit

    def try_admit(self: virtual.VirtualReplica, now: float, new: Any, **kwargs: Any) -> Any:
        held = kwargs.get("held")
        if held is None:
            held = self.held(now, best_effort=kwargs.get("best_effort", False))
        plans = [t.as_plan() for t in held]
        parts = running_parts(held)
        assert parts == plan_parts(plans)
        assert type(parts.context_tokens) is int and type(parts.kv_tokens) is int
        admission = original(self, now, new, **kwargs)
        assert admission == self.planner.admit(now, plans, new)
        seen.append((len(parts.forced), len(parts.decoders)))
        return admission

    monkeypatch.setattr(virtual.VirtualReplica, "try_admit", try_admit)
    return seen


@PATCHED
@pytest.mark.parametrize("profile", ["bench-chat", "quickstart", "slos-serve-mixed"])
def test_every_decision_reads_the_same_parts(monkeypatch: pytest.MonkeyPatch, profile: str) -> None:
    with monkeypatch.context() as patch:
        seen = _checking(patch)
        run_profile(profile, "slos-serve", reference=False, requests=REQUESTS)
    # Many decisions with decoding requests, and some with a prefilling one beside them (the DP's two kinds).
    assert sum(decoders for _, decoders in seen) > 500
    assert any(forced and decoders for forced, decoders in seen)


def _made_up(rng: random.Random, request_id: int) -> Tracked:
    total = rng.choice([0, 1, 7, 40])
    return Tracked(
        request_id=request_id,
        prompt_tokens=rng.choice([1, 9, 300]),
        prefill_deadline_s=rng.choice([0.5, 1.25, 3.0]),
        prefill_left=rng.choice([0.0, 0.3, 0.5, 1.5, 2.0, 120.0, -0.2, 0]),
        decode_left=rng.choice([0.0, 0.4, 0.5, 2.5, 3.7, float(total), -0.6, total, 0]),
        decode_total=total,
        tpot_s=rng.choice([0.02, 0.05, 0.1]),
        kv_tokens=rng.choice([10, 340, 2000]),
        best_effort=rng.random() < 0.2,
        decode_start_s=rng.choice([None, 0.25, 1.0]),
    )


def test_made_up_records_at_the_edges_of_as_plan() -> None:
    planner = AdmissionPlanner(
        StepTimeModel(((0.004, 1e-5, 0.0, 1e-8, 0.0),)),
        PlannerSettings(max_batch_tokens=2048, kv_capacity_tokens=60_000, max_seqs=24),
    )
    rng = random.Random(7)
    ids = itertools.count()
    for _ in range(400):
        held = [_made_up(rng, next(ids)) for _ in range(rng.randrange(0, 12))]
        plans = [t.as_plan() for t in held]
        assert running_parts(held) == plan_parts(plans)
        new = [
            PlanRequest(next(ids), rng.choice([0.3, 1.0, 2.0]), rng.choice([10, 400]), 30, rng.choice([0.05, 0.1]), 500)
            for _ in range(rng.randrange(1, 5))
        ]
        assert planner.admit_parts(0.2, running_parts(held), new) == planner.admit(0.2, plans, new)
