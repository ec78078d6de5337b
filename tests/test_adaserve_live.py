"""AdaServe's live approximation: urgency as vLLM priority through the gateway, and the batch-size
speculation schedule (against scripted upstreams; no vLLM needed)."""

from __future__ import annotations

import asyncio
import itertools

import aiohttp

from core.control.adaserve.live import SCHEDULE_CONFIG_KEY, live_speculation_extra, speculation_schedule
from core.control.adaserve.policy import NO_TPOT_PRIORITY, AdaServePolicy
from core.controller_api import Policy
from core.gateway.server import Gateway
from core.modes import ModeContext, make_policy
from core.profile import AdaServeSpec, load_calibration, load_profile
from tests.fakeserver import FakeOpenAIServer, StreamReply


def forwarded_priorities(policy: Policy, slos: list[dict[str, object] | None]) -> list[object]:
    """Post one request per SLO through a gateway running `policy`; the `priority` each reached vLLM with."""

    async def scenario() -> list[object]:
        async with (
            FakeOpenAIServer(StreamReply(chunk_delay_s=0.0)) as fake,
            Gateway([fake.base_url], policy) as gateway,
            aiohttp.ClientSession() as session,
        ):
            for slo in slos:
                body: dict[str, object] = {"model": "fake-model", "prompt": "hi", "max_tokens": 3, "stream": True}
                if slo is not None:
                    body["slo"] = slo
                async with session.post(gateway.base_url + "/v1/completions", json=body) as response:
                    assert response.status == 200
                    await response.read()
            return [b.get("priority", "absent") for b in fake.bodies]

    return asyncio.run(scenario())


def test_adaserve_sends_urgency_as_vllm_priority() -> None:
    """Lower vLLM priority values are served first: the TPOT SLO in ms (coding copilot 12.6 ms before chat
    50 ms before summaries 150 ms), requests without a TPOT SLO last; fcfs sends no priority at all."""
    profile = load_profile("adaserve-mix")
    policy = AdaServePolicy(profile.adaserve, load_calibration(profile), send_priority=True)
    slos = [{"task": "summarization", "tpot_s": 0.15}, {"task": "coding-copilot", "tpot_s": 0.0126}, None]
    assert forwarded_priorities(policy, slos) == [150, 13, NO_TPOT_PRIORITY]
    assert forwarded_priorities(Policy(), slos[:1]) == ["absent"]


def test_no_priority_unless_the_server_schedules_by_priority() -> None:
    """Under vLLM's default FCFS policy the field does nothing (and older releases refuse it), so the mode
    sends one only when the profile's knobs.scheduling_policy is priority (the knob that starts vLLM so)."""
    profile = load_profile("adaserve-mix")
    assert profile.knobs.scheduling_policy == "fcfs"
    context = ModeContext(profile=profile, calibration=load_calibration(profile))
    assert forwarded_priorities(make_policy("adaserve", context), [{"tpot_s": 0.05}]) == ["absent"]
    knobs = profile.knobs.model_copy(update={"scheduling_policy": "priority"})
    prioritised = profile.model_copy(update={"knobs": knobs})
    context = ModeContext(profile=prioritised, calibration=load_calibration(profile))
    assert forwarded_priorities(make_policy("adaserve", context), [{"tpot_s": 0.05}]) == [50]


def test_speculation_schedule_follows_eq_8_and_covers_every_batch_size() -> None:
    calibration = load_calibration(load_profile("adaserve-mix"))
    schedule = speculation_schedule(AdaServeSpec(depth_bounds=(1, 6)), calibration, max_num_seqs=128, max_width=4)
    # vLLM's format: sorted, non-overlapping inclusive ranges from batch size 1 to max_num_seqs.
    assert schedule[0][0] == 1 and schedule[-1][1] == 128
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(schedule))
    widths = [k for _, _, k in schedule]
    assert widths == sorted(widths, reverse=True) and len(set(widths)) == len(widths)
    # Eq. 8 with B = 93 (the roofline knee of llama-7b-a100), c1 = 1: floor(93 / (n + 1)) - 1, clipped to
    # [1, 6] and to the deployed 4 speculative tokens.
    expected = {n: min(4, max(1, 93 // (n + 1) - 1)) for n in range(1, 129)}
    assert {n: k for start, end, k in schedule for n in range(start, end + 1)} == expected


def test_the_live_schedule_goes_into_the_speculative_config_only_with_speculation_on() -> None:
    profile = load_profile("vllm-cpu-tiny")
    assert live_speculation_extra(profile) == {}  # spec_on: false
    knobs = profile.knobs.model_copy(update={"spec_on": True, "spec_width": 2})
    speculating = profile.model_copy(update={"knobs": knobs})
    speculating._source = profile._source
    assert live_speculation_extra(speculating) == {SCHEDULE_CONFIG_KEY: [[1, 8, 2]]}
    off = speculating.model_copy(update={"adaserve": AdaServeSpec(live_schedule=False)})
    off._source = profile._source
    assert live_speculation_extra(off) == {}
