"""SLOs-Serve's stretches of plain decode steps give the records the step-by-step reference gives, exactly.

With nothing prefilling, nothing to admit and no speculation, SLOs-Serve's planner gives every decoding
request one token while they fit in its batch budget; the replica then runs such steps itself, without asking the
planner each step (stepwise.StepwiseReplica.run_decode_steps, the planner's `plain_decode_check`).
`SimEngine(reference=True)` asks the planner every step. Every field of every record, the token timelines
and the engine samples must be identical: on every shipped profile, with several TPOT tiers and the
best-effort tier, under KV pressure (preemptions), with noise and stalls, with requests queued for a slot,
and with speculation on (no stretches).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from core.backend_api import EngineSample, LoadPlan
from core.control.slos_serve.policy import SlosServePolicy
from core.modes import ModeContext, make_policy
from core.profile import Calibration, KnobsSpec, PerfTerm, StallModel, load_calibration, load_profile
from core.records import RequestRecord, RequestSLO, RequestSpec
from core.sim import stepwise
from core.sim.engine import SimEngine
from core.workload import build_load_plan
from tests.fakes import compiled
from tests.test_sim import tiny_calibration
from tests.test_sim_fast_path import PROFILES, assert_same_records
from tests.test_sim_fast_path import _run as run_profile

REQUESTS = 200
# The counts patch StepwiseReplica's methods, which the compiled engine and replica call directly
# (tests.fakes.compiled): against the install the runs are compared, not counted.
COUNTED = not compiled(stepwise)


def _count_stretch_steps(monkeypatch: pytest.MonkeyPatch, queued: list[int] | None = None) -> list[int]:
    """Count the steps the replica runs in stretches (so that a test cannot pass with none run), and in
    `queued` those it runs with requests queued."""
    ran: list[int] = []
    original = stepwise.StepwiseReplica.run_decode_steps

    def counting(self: stepwise.StepwiseReplica, *args: float) -> int:
        steps = original(self, *args)
        ran.append(steps)
        if queued is not None and self.waiting:
            queued.append(steps)
        return steps

    monkeypatch.setattr(stepwise.StepwiseReplica, "run_decode_steps", counting)
    return ran


def _both(run: Callable[[bool], tuple[list[RequestRecord], list[EngineSample]]]) -> None:
    fast, fast_samples = run(False)
    reference, reference_samples = run(True)
    assert_same_records(fast, reference)
    assert fast_samples == reference_samples


@pytest.mark.parametrize("name", PROFILES)
def test_slos_serve_stretches_equal_the_step_by_step_reference(name: str) -> None:
    _both(lambda reference: run_profile(name, "slos-serve", reference=reference, requests=REQUESTS))


@pytest.mark.skipif(not COUNTED, reason="patches a method of a mypyc-compiled class")
def test_bench_chat_runs_most_steps_in_stretches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stretches are taken where they should be: bench-chat's decode-only steps (about 60% of them)."""
    ran = _count_stretch_steps(monkeypatch)
    profile = load_profile("bench-chat")
    calibration = load_calibration(profile)
    context = ModeContext(profile=profile, calibration=calibration, seed=profile.seed)
    plan = build_load_plan(profile, seed=profile.seed, requests=REQUESTS)
    engine = SimEngine(calibration, profile.knobs, plan, seed=profile.seed, policy=make_policy("slos-serve", context))
    engine.run()
    assert sum(ran) > 0.5 * engine.step


def _pressure_plan(tpots: tuple[float, ...], count: int = 240) -> LoadPlan:
    rng = np.random.default_rng(5)
    specs = [
        RequestSpec(
            request_id=i,
            prompt_tokens=int(rng.integers(50, 700)),
            output_tokens=int(rng.integers(20, 300)),
            arrival_s=float(0.03 * i + (0.5 if i % 40 == 0 else 0.0)),
            slo=RequestSLO(ttft_s=float(rng.choice([0.2, 1.0])), tpot_s=float(rng.choice(tpots))),
            acceptance=0.7,
        )
        for i in range(count)
    ]
    return LoadPlan(requests=iter(specs), mode="open", max_requests=len(specs))


@pytest.mark.parametrize(
    ("case", "calibration", "knobs"),
    [
        # A small cache (recompute preemptions) and prompts longer than the token budget (chunks), three tiers.
        (
            "kv-pressure",
            tiny_calibration(kv_capacity_tokens=4096),
            KnobsSpec(max_num_seqs=16, max_num_batched_tokens=256),
        ),
        # Four sequence slots: requests queue, and stretches run while only best-effort ones wait for a slot.
        ("slots", tiny_calibration(noise_cv=0.2), KnobsSpec(max_num_seqs=4, max_num_batched_tokens=512)),
        # Step-time noise (the stretch draws it as step_once does).
        ("noise", tiny_calibration(noise_cv=0.2), KnobsSpec(max_num_seqs=32, max_num_batched_tokens=512)),
        # Stalls: a stretch's step asks the stall clock as step_once's does.
        (
            "stalls",
            tiny_calibration(noise_cv=0.2, stalls=StallModel(rate_per_s=2.0, mean_s=0.01, cv=1.0)),
            KnobsSpec(max_num_seqs=32, max_num_batched_tokens=512),
        ),
        # A KV-read term that makes the tightest tier's budget shrink as the cache fills (16-30 tokens at 5-10k
        # of context): a prefill stretch's per-step budget (BudgetModel.batch_at) moves with the KV (a stretch
        # that priced it 16 tokens of KV off failed here), and a decode stretch's one test over the KV it can
        # reach (holds_decodes_between) mostly declines, so its steps are tested one by one.
        (
            "kv-budget",
            tiny_calibration(
                terms=[
                    PerfTerm(name="mem", base_s=0.01),
                    PerfTerm(name="compute", per_token_s=1e-4),
                    PerfTerm(name="attention", per_token_s=5e-4, per_ctx_token_s=1e-6),
                ]
            ),
            KnobsSpec(max_num_seqs=32, max_num_batched_tokens=512),
        ),
        # A budget that bites: at 1 ms a token the tightest tier's batch holds 18 tokens (0.9 x 20 ms), so with
        # its requests decoding the decodes often do not all fit, and a decode stretch must not start; the
        # looser tiers' 45 and 180 hold them (the check's tiers must be the decoding requests' own).
        (
            "tight-budget",
            tiny_calibration(terms=[PerfTerm(name="mem", base_s=0.01), PerfTerm(name="compute", per_token_s=1e-3)]),
            KnobsSpec(max_num_seqs=32, max_num_batched_tokens=512),
        ),
        # Speculation on: no plain decode batch, every step planned.
        ("speculation", tiny_calibration(), KnobsSpec(max_num_seqs=32, spec_on=True, spec_width=3)),
    ],
)
def test_slos_serve_stretches_equal_the_reference_under_pressure(
    case: str, calibration: Calibration, knobs: KnobsSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued: list[int] = []
    ran = _count_stretch_steps(monkeypatch, queued)
    preemptions: list[int] = []

    def run(reference: bool) -> tuple[list[RequestRecord], list[EngineSample]]:
        samples: list[EngineSample] = []
        engine = SimEngine(
            calibration,
            knobs,
            _pressure_plan((0.02, 0.05, 0.2)),
            seed=4,
            policy=SlosServePolicy(calibration, knobs),
            on_sample=samples.append,
            reference=reference,
        )
        records = engine.run()
        preemptions.append(engine.preemptions)
        return records, samples

    _both(run)
    if case == "speculation":
        assert sum(ran) == 0
    elif COUNTED:
        assert sum(ran) > 0
    if case == "kv-pressure":
        assert preemptions[0] > 0
    if case == "slots" and COUNTED:
        assert sum(queued) > 0
