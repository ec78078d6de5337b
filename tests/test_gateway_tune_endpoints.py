"""The gateway's online-tuning endpoints (core/gateway/server.py): GET /gateway/tune shows the online tuner's
steps (core.events.online_tune_feed), POST /gateway/swap runs the replica swap of `--launch`
(core/backends/launched_replicas.py) over scripted servers, and a gateway without either says so."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from core.controller_api import Policy
from core.gateway.server import Gateway
from core.profile import load_profile
from core.tune.online import OnlineSettings
from core.tune.online_gateway import OnlineGatewayTuning, attach_online_tuner
from tests.fakeserver import FakeLaunchedReplicas, FakeOpenAIServer, StreamReply
from tests.test_gateway import assert_accounted, completion, post

# Windows of 16 requests and 0.3 s; one pair of windows decides (no re-measure inside the noise): a step
# needs two windows of served requests.
QUICK = OnlineSettings(window_requests=16, window_s=0.3, batches=2, max_pairs=1)


def quick_profile():  # type: ignore[no-untyped-def]
    profile = load_profile("saber-w1")
    tuner = profile.tuner.model_copy(
        update={
            "concurrency_bounds": (2, 6),
            "concurrency_step": 2,
            "max_num_seqs_bounds": (4, 16),
            "max_num_seqs_step": 4,
        }
    )
    knobs = profile.knobs.model_copy(update={"concurrency": 4, "max_num_seqs": 8})
    return profile.model_copy(update={"tuner": tuner, "knobs": knobs})


@asynccontextmanager
async def launch_gateway(profile: Any) -> AsyncIterator[tuple[FakeLaunchedReplicas, Gateway]]:
    """A gateway in front of the one server `--launch` would start (a scripted one), stopped after."""
    replicas = FakeLaunchedReplicas(profile)
    first = await replicas.start_first()
    try:
        async with Gateway([first], Policy()) as gateway:
            yield replicas, gateway
    finally:
        await replicas.close()


async def get_json(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as response:
        return response.status, await response.json()


async def post_json(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with session.post(url, data=json.dumps(body)) as response:
        return response.status, await response.json()


async def serve_until_steps(gateway: Gateway, tuning: OnlineGatewayTuning, steps: int, rounds: int = 40) -> int:
    """Serve batches of requests and poll the tuner (as its 1 s timer does) until it has taken `steps` steps;
    returns the requests sent."""
    sent = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(rounds):
            if len(tuning.steps) >= steps:
                break
            await asyncio.gather(*(post(session, gateway.base_url, completion()) for _ in range(16)))
            sent += 16
            await asyncio.sleep(QUICK.window_s)
            tuning.poll()
    assert len(tuning.steps) >= steps, f"the tuner took {len(tuning.steps)} steps after {sent} requests"
    return sent


def test_a_gateway_without_tuner_or_launched_servers_says_so() -> None:
    async def scenario() -> None:
        async with (
            FakeOpenAIServer(StreamReply()) as fake,
            Gateway([fake.base_url], Policy()) as gateway,
            aiohttp.ClientSession() as session,
        ):
            status, stats = await get_json(session, gateway.base_url + "/gateway/stats")
            assert status == 200 and stats["online_tune"] is False and stats["replica_swap"] is False
            status, body = await get_json(session, gateway.base_url + "/gateway/tune")
            assert status == 404 and "--tune" in body["error"]["message"]
            status, body = await post_json(session, gateway.base_url + "/gateway/swap", {"max_num_seqs": 8})
            assert status == 409 and "--launch" in body["error"]["message"]

    asyncio.run(scenario())


def test_gateway_tune_lists_the_online_steps_from_an_index_on() -> None:
    async def scenario() -> None:
        async with (
            FakeOpenAIServer(StreamReply(first_delay_s=0.01, chunk_delay_s=0.005)) as fake,
            Gateway([fake.base_url], Policy()) as gateway,
            aiohttp.ClientSession() as session,
        ):
            printed: list[dict[str, Any]] = []
            tuning = attach_online_tuner(gateway, quick_profile(), settings=QUICK, sink=printed.append)
            status, stats = await get_json(session, gateway.base_url + "/gateway/stats")
            assert stats["online_tune"] is True and stats["replica_swap"] is False
            status, feed = await get_json(session, gateway.base_url + "/gateway/tune")
            assert status == 200 and feed["steps"] == [] and feed["next"] == 0
            assert feed["incumbent"]["concurrency"] == 4 and feed["knobs"]["concurrency"] == 4
            sent = await serve_until_steps(gateway, tuning, 2)
            status, feed = await get_json(session, gateway.base_url + "/gateway/tune?since=0")
            assert status == 200 and feed["next"] == len(tuning.steps)
            assert feed["steps"] == [e for e in printed if e["event"] == "tune_step"]  # what stdout printed
            assert all(step["algorithm"] == "online" and step["world"] == "live" for step in feed["steps"])
            assert feed["incumbent"] == tuning.tuner.incumbent.as_dict()
            assert feed["knobs"]["concurrency"] == tuning.policy.cap
            _, later = await get_json(session, gateway.base_url + f"/gateway/tune?since={feed['next'] - 1}")
            assert later["since"] == feed["next"] - 1 and later["steps"] == feed["steps"][-1:]
            status, _ = await get_json(session, gateway.base_url + "/gateway/tune?since=x")
            assert status == 400
            await tuning.stop()
            status, _ = await get_json(session, gateway.base_url + "/gateway/tune")
            assert status == 404  # a stopped tuner shows nothing
            assert_accounted(gateway, sent)

    asyncio.run(scenario())


def test_gateway_swap_replaces_the_launched_server_and_refuses_bad_knobs() -> None:
    async def scenario() -> None:
        async with launch_gateway(quick_profile()) as (replicas, gateway), aiohttp.ClientSession() as session:
            replicas.answer_swaps(gateway)
            status, stats = await get_json(session, gateway.base_url + "/gateway/stats")
            assert stats["replica_swap"] is True
            url = gateway.base_url + "/gateway/swap"
            status, body = await post_json(session, url, {"max_num_seqs": 0})
            assert status == 400 and "max_num_seqs" in body["error"]["message"]
            status, body = await post_json(session, url, {"max_num_seqs": 8})  # in force already: no swap
            assert status == 200 and replicas.swaps == 0 and len(replicas.started) == 1
            status, body = await post_json(session, url, {"max_num_seqs": 12})
            assert status == 200 and body["knobs"]["max_num_seqs"] == 12
            assert replicas.swaps == 1 and [k.max_num_seqs for k in replicas.started] == [8, 12]
            old, new = gateway.upstreams
            assert old.retired and not new.retired and [u.url for u in gateway.routable] == [new.url]
            assert (await post(session, gateway.base_url, completion()))[0] == 200
            assert new.served == 1
            status, body = await post_json(session, url, {"max_num_seqs": 16})
            assert status == 200 and replicas.swaps == 2
            # Each swap starts the new server on the cores the old one does not use (core/serve/cpu_binding.py).
            assert replicas.started_slots == [0, 1, 0]
            status, body = await post_json(session, url, [])
            assert status == 400

    asyncio.run(scenario())


def test_an_operator_swap_while_tuning_becomes_the_incumbent_within_the_tuners_range() -> None:
    async def scenario() -> None:
        profile = quick_profile()
        async with launch_gateway(profile) as (replicas, gateway), aiohttp.ClientSession() as session:
            tuning = attach_online_tuner(gateway, profile, settings=QUICK, replicas=replicas)
            url = gateway.base_url + "/gateway/swap"
            status, body = await post_json(session, url, {"max_num_seqs": 64})
            assert status == 400 and "4..16" in body["error"]["message"] and replicas.swaps == 0
            status, body = await post_json(session, url, {"max_num_seqs": 16})
            assert status == 200 and body["knobs"]["max_num_seqs"] == 16 and replicas.swaps == 1
            assert tuning.tuner.incumbent.max_num_seqs == 16 == tuning.tuner.current.max_num_seqs
            _, feed = await get_json(session, gateway.base_url + "/gateway/tune")
            assert feed["knobs"]["max_num_seqs"] == 16 and feed["swapping"] is False
            await tuning.stop()

    asyncio.run(scenario())
