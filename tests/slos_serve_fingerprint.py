"""Fixed-seed SLOs-Serve runs reduced to a digest of every timeline plus the summary figures (see
tests/data/make_slos_serve_fingerprints.py): what pins the SLOs-Serve planner path across optimisations
(issue 22), as tests/adaserve_fingerprint.py does for AdaServe."""

from __future__ import annotations

import asyncio

from core.backends.sim import SimBackend
from core.metrics import summarize
from core.modes import ModeContext, make_policy
from core.profile import load_calibration, load_profile
from core.workload import build_load_plan
from tests.sim_fingerprint import records_digest

# name: (profile, requests): the paper's scenarios as shipped, the simulator benchmark and the quickstart
# (speculation, several TPOT tiers, a bursty trace, best-effort retries and preemption between them).
CASES: dict[str, tuple[str, int]] = {
    "chatbot": ("slos-serve-chatbot", 400),
    "coder": ("slos-serve-coder", 400),
    "mixed": ("slos-serve-mixed", 400),
    "reasoning": ("slos-serve-reasoning", 300),
    "summarizer": ("slos-serve-summarizer", 300),
    "toolllm": ("slos-serve-toolllm", 400),
    "trace": ("slos-serve-trace", 400),
    "bench-chat": ("bench-chat", 600),
    "quickstart": ("quickstart", 600),
}


def fingerprint_case(name: str) -> dict[str, object]:
    profile_name, requests = CASES[name]
    profile = load_profile(profile_name)
    calibration = load_calibration(profile)
    seed = profile.seed
    context = ModeContext(profile=profile, calibration=calibration, seed=seed)
    backend = SimBackend(
        calibration, profile.knobs, seed=seed, policy_factory=lambda: make_policy("slos-serve", context)
    )
    plan = build_load_plan(profile, seed=seed, requests=min(profile.workload.requests or requests, requests))
    outcome = asyncio.run(backend.run(plan))
    summary = summarize(outcome.records, slo=profile.slo, smooth=profile.smooth_goodput)
    return {
        "records": len(outcome.records),
        "sha256": records_digest(outcome.records),
        "samples": len(outcome.samples),
        "slo_attainment": round(summary.slo_attainment, 9),
        "token_goodput_tps": round(summary.token_goodput_tps, 6),
    }
