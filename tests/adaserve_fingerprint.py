"""Fixed-seed AdaServe runs reduced to a digest of every timeline plus the summary figures (see
tests/data/make_adaserve_fingerprints.py): what pins the AdaServe per-step path across optimisations."""

from __future__ import annotations

import asyncio

from core.backends.sim import SimBackend
from core.control.adaserve.policy import AdaServePolicy, StaticSpeculationPolicy
from core.controller_api import Policy
from core.metrics import summarize
from core.profile import Profile, load_calibration, load_profile
from core.workload import build_load_plan
from tests.sim_fingerprint import records_digest

# name: (profile, mix rate in RPS or trace time scale (None: as shipped), policy, shortcut)
CASES: dict[str, tuple[str, float | None, str, bool]] = {
    "mix-4rps": ("adaserve-mix", None, "adaserve", True),
    "mix-12rps": ("adaserve-mix", 12.0, "adaserve", True),
    "mix-14rps": ("adaserve-mix", 14.0, "adaserve", True),
    "mix-12rps-no-shortcut": ("adaserve-mix", 12.0, "adaserve", False),
    "mix-12rps-static-3": ("adaserve-mix", 12.0, "static-3", True),
    "trace": ("adaserve-trace", None, "adaserve", True),
    "trace-4x": ("adaserve-trace", 0.25, "adaserve", True),
    "long-prompt-chat": ("long-prompt-chat", None, "adaserve", True),
    # `adaserve.must_pay: false` (issue 21's ablation) is the behaviour before it: these keep its digests.
    "mix-12rps-must-pay-off": ("adaserve-mix", 12.0, "adaserve-must-pay-off", True),
    "mix-14rps-must-pay-off": ("adaserve-mix", 14.0, "adaserve-must-pay-off", True),
    "trace-4x-must-pay-off": ("adaserve-trace", 0.25, "adaserve-must-pay-off", True),
}


def case_profile(name: str) -> Profile:
    profile_name, knob, _, _ = CASES[name]
    profile = load_profile(profile_name)
    if knob is None:
        return profile
    workload = profile.workload
    if workload.trace is not None:
        workload = workload.model_copy(update={"trace": workload.trace.model_copy(update={"time_scale": knob})})
    else:
        assert workload.arrival is not None
        workload = workload.model_copy(update={"arrival": workload.arrival.model_copy(update={"rate_rps": knob})})
    copy = profile.model_copy(update={"workload": workload})
    copy._source = profile._source
    return copy


def fingerprint_case(name: str) -> dict[str, object]:
    _, _, policy_name, shortcut = CASES[name]
    profile = case_profile(name)
    calibration = load_calibration(profile)
    seed = profile.seed

    def policy() -> Policy:
        if policy_name == "adaserve":
            return AdaServePolicy(profile.adaserve, calibration, seed, shortcut=shortcut)
        if policy_name == "adaserve-must-pay-off":
            spec = profile.adaserve.model_copy(update={"must_pay": False})
            return AdaServePolicy(spec, calibration, seed, shortcut=shortcut)
        return StaticSpeculationPolicy(int(policy_name.split("-")[1]), profile.adaserve, calibration, seed)

    backend = SimBackend(calibration, profile.knobs, seed=seed, policy_factory=policy)
    records = asyncio.run(backend.run(build_load_plan(profile, seed=seed))).records
    summary = summarize(records, slo=profile.slo, smooth=profile.smooth_goodput)
    return {
        "records": len(records),
        "sha256": records_digest(records),
        "slo_attainment": round(summary.slo_attainment, 9),
        "token_goodput_tps": round(summary.token_goodput_tps, 6),
    }
