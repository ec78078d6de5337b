"""AdaServe's live approximation on the real vLLM CPU build: priority by urgency through the gateway and the
batch-size speculation schedule, both accepted by vLLM and in effect."""

from __future__ import annotations

import asyncio

import pytest

from core.backends.factory import make_backend
from core.control.adaserve.live import SCHEDULE_CONFIG_KEY, live_speculation_extra
from core.profile import load_profile
from core.records import Status
from core.workload import build_load_plan

pytestmark = pytest.mark.vllm  # skipped without a vLLM python (tests/conftest.py)


def test_adaserve_mode_on_a_real_vllm_uses_the_schedule_and_priorities() -> None:
    """The tiny Llama with its own weights as draft accepts every drafted token, so the mean acceptance
    length vLLM reports is the speculative tokens it used + 1: eq. 8's 3 at every batch size up to 8 (the
    schedule), not the 4 the server is started with. Every request carries a priority, which vLLM (started
    with --scheduling-policy priority) accepts."""
    profile = load_profile("vllm-cpu-tiny")
    knobs = profile.knobs.model_copy(update={"spec_on": True, "spec_width": 4, "scheduling_policy": "priority"})
    server = profile.server.model_copy(update={"draft_model": "builtin:tiny-llama-draft-high"})
    live = profile.model_copy(update={"knobs": knobs, "server": server})
    live._source = profile._source
    assert live_speculation_extra(live) == {SCHEDULE_CONFIG_KEY: [[1, 8, 3]]}
    backend = make_backend("vllm", live, mode="adaserve")
    outcome = asyncio.run(backend.run(build_load_plan(live, requests=32)))
    assert [r.status for r in outcome.records] == [Status.OK] * 32
    assert outcome.notes["gateway"]["mode"] == "adaserve" and outcome.notes["gateway"]["accounted"]
    assert "--scheduling-policy" in outcome.notes["vllm"]["argv"]
    assert outcome.notes["server"]["spec_mean_acceptance_length"] == pytest.approx(4.0, abs=0.25)
