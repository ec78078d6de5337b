"""The simulator's fast paths give the records the step-by-step reference gives, exactly.

`SimEngine(reference=True)` forms every engine step through step_once (the general path); the default
advances stretches of decode-only steps in one call (EngineReplica.run_decode_steps). Every field of every
record, the token timelines and the engine samples must be identical, on every shipped profile (traces,
closed loops, speculation, chunked prefill) under each scheduling mode, and under KV pressure.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from core.backend_api import EngineSample, LoadPlan
from core.modes import ModeContext, make_policy
from core.profile import KnobsSpec, load_calibration, load_profile
from core.records import RequestRecord, RequestSpec
from core.sim.engine import SimEngine
from core.workload import build_load_plan
from tests.test_sim import tiny_calibration

PROFILES = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "profiles").glob("*.yaml"))
MODES = ["fcfs", "saber", "slos-serve", "adaserve"]
REQUESTS = 400  # fcfs: enough for preemptions, completions inside decode runs and many engine samples
# The other modes take the general path in both runs today (the decode runs are fcfs's); a few requests
# each pin that a fast path added for them later must match too, without the cost of the full check.
MODE_REQUESTS = 60


def _run(
    profile_name: str, mode: str, *, reference: bool, requests: int | None = None
) -> tuple[list[RequestRecord], list[EngineSample]]:
    profile = load_profile(profile_name)
    calibration = load_calibration(profile)
    context = ModeContext(profile=profile, calibration=calibration, seed=profile.seed)
    cap = requests or (REQUESTS if mode == "fcfs" else MODE_REQUESTS)
    plan = build_load_plan(profile, seed=profile.seed, requests=min(profile.workload.requests or cap, cap))
    samples: list[EngineSample] = []
    engine = SimEngine(
        calibration,
        profile.knobs,
        plan,
        seed=profile.seed,
        policy=None if mode == "fcfs" else make_policy(mode, context),  # type: ignore[arg-type]
        on_sample=samples.append,
        reference=reference,
    )
    return engine.run(), samples


def assert_same_records(fast: list[RequestRecord], reference: list[RequestRecord]) -> None:
    assert len(fast) == len(reference)
    for a, b in zip(fast, reference, strict=True):
        for name in (f.name for f in dataclasses.fields(RequestRecord)):
            left, right = getattr(a, name), getattr(b, name)
            if isinstance(left, np.ndarray) or isinstance(right, np.ndarray):
                assert left is not None and right is not None, (a.request_id, name)
                np.testing.assert_array_equal(left, right, err_msg=f"request {a.request_id} {name}")
            else:
                assert left == right, (a.request_id, name, left, right)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", PROFILES)
def test_fast_path_equals_the_step_by_step_reference(name: str, mode: str) -> None:
    fast, fast_samples = _run(name, mode, reference=False)
    reference, reference_samples = _run(name, mode, reference=True)
    assert_same_records(fast, reference)
    assert fast_samples == reference_samples


def test_fast_path_equals_the_reference_under_kv_pressure_and_chunked_prefill() -> None:
    """A cache that overflows (recompute preemptions) and prompts longer than the token budget (chunks)."""
    calibration = tiny_calibration(kv_capacity_tokens=4096)
    knobs = KnobsSpec(max_num_seqs=16, max_num_batched_tokens=256, chunked_prefill=True)

    def plan() -> LoadPlan:
        rng = np.random.default_rng(3)
        specs = [
            RequestSpec(
                request_id=i,
                prompt_tokens=int(rng.integers(50, 700)),
                output_tokens=int(rng.integers(20, 400)),
                arrival_s=0.05 * i,
            )
            for i in range(300)
        ]
        return LoadPlan(requests=iter(specs), mode="open", max_requests=len(specs))

    runs = {}
    for reference in (False, True):
        samples: list[EngineSample] = []
        engine = SimEngine(calibration, knobs, plan(), seed=2, on_sample=samples.append, reference=reference)
        runs[reference] = (engine.run(), samples, engine.preemptions)
    assert runs[True][2] > 0  # the cache did overflow
    assert_same_records(runs[False][0], runs[True][0])
    assert runs[False][1] == runs[True][1]


@pytest.mark.parametrize("cap", [None, 2, 6])
@pytest.mark.parametrize("interval_s", [0.5, math.inf])
def test_decode_runs_through_completions_equal_the_reference_with_an_in_flight_cap(
    cap: int | None, interval_s: float
) -> None:
    """Open loop, as the tuner's segments run it (its concurrency knob caps requests in flight, no engine
    samples): a decode run goes on past a completion only while nobody waits for an in-flight slot."""
    profile = load_profile("quickstart")
    calibration = load_calibration(profile)
    runs = {}
    for reference in (False, True):
        plan = build_load_plan(profile, seed=5, requests=500)
        plan.concurrency = cap
        samples: list[EngineSample] = []
        engine = SimEngine(
            calibration,
            profile.knobs,
            plan,
            seed=5,
            on_sample=samples.append,
            sample_interval_s=interval_s,
            reference=reference,
        )
        runs[reference] = (engine.run(), samples, engine.clients)
    assert_same_records(runs[False][0], runs[True][0])
    assert runs[False][1] == runs[True][1]
    if cap is not None:  # requests did wait for a slot (sent later than they arrived)
        assert any(rec.sent_s is not None and rec.sent_s > rec.arrival_s for rec in runs[True][0])
