"""Server flags in the online climb (issue 23 item 2): with launched servers (`gateway --tune --launch`) the climb
moves max_num_seqs, speculation (width and on/off) and, where the profile bounds it, max_num_batched_tokens, each
by replica swap; without them it moves none of these (core/tune/online_space.py, core/tune/online_gateway.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from core.profile import load_profile
from core.tune.online_gateway import attach_online_tuner, server_flags_to_change, start_point
from core.tune.online_space import OnlinePoint, online_space
from tests.test_gateway import assert_accounted
from tests.test_gateway_tune_endpoints import QUICK, get_json, launch_gateway, post_json, serve_until_steps


def flags_profile(**tuner: Any):  # type: ignore[no-untyped-def]
    """saber-w1 with the cap and max_num_seqs pinned, so that the climb's only moves are the flags under test."""
    profile = load_profile("saber-w1")
    update = {
        "concurrency_bounds": (4, 4),
        "max_num_seqs_bounds": (8, 8),
        "spec_toggle": False,
        "spec_width_bounds": (0, 0),
        **tuner,
    }
    knobs = profile.knobs.model_copy(update={"concurrency": 4, "max_num_seqs": 8, "max_num_batched_tokens": 2048})
    return profile.model_copy(update={"tuner": profile.tuner.model_copy(update=update), "knobs": knobs})


def test_without_launched_servers_no_server_flag_moves_and_the_events_keep_their_fields() -> None:
    profile = flags_profile(spec_toggle=True, spec_width_bounds=(0, 16), max_num_batched_tokens_bounds=(512, 8192))
    space = online_space(profile)
    point = start_point(profile, space)
    assert point.max_num_batched_tokens is None and "max_num_batched_tokens" not in point.as_dict()
    assert space.neighbours(point) == []  # the cap is pinned too: nothing the gateway owns is left to move


def test_with_launched_servers_speculation_and_batched_tokens_are_neighbours() -> None:
    profile = flags_profile(spec_toggle=True, spec_width_bounds=(0, 16), max_num_batched_tokens_bounds=(1024, 8192))
    space = online_space(profile, server_flags=True)
    point = start_point(profile, space)
    assert point.max_num_batched_tokens == 2048 and point.as_dict()["max_num_batched_tokens"] == 2048
    moves = {(n.spec_on, n.spec_width, n.max_num_batched_tokens) for n in space.neighbours(point)}
    assert moves == {(True, 4, 2048), (False, 0, 1024), (False, 0, 4096)}
    on = OnlinePoint(4, 8, 8, True, max_num_batched_tokens=8192)
    moves = {(n.spec_on, n.spec_width, n.max_num_batched_tokens) for n in space.neighbours(on)}
    assert moves == {(True, 4, 8192), (True, 12, 8192), (False, 8, 8192), (True, 8, 4096)}  # 16384: above bounds
    assert space.clamp(OnlinePoint(4, 8, 0, False, max_num_batched_tokens=100)).max_num_batched_tokens == 1024
    assert (
        on.key() != OnlinePoint(4, 8, 8, True, max_num_batched_tokens=4096).key() != OnlinePoint(4, 8, 0, False).key()
    )
    # Without bounds for it the profile's max_num_batched_tokens stays (a swap restarts a vLLM per move).
    plain = online_space(flags_profile(spec_toggle=True, spec_width_bounds=(0, 16)), server_flags=True)
    assert all(n.max_num_batched_tokens is None for n in plain.neighbours(start_point(profile, plain)))


def test_a_swap_changes_only_the_flags_that_make_another_server() -> None:
    knobs = load_profile("saber-w1").knobs.model_copy(update={"max_num_seqs": 8, "max_num_batched_tokens": 2048})
    assert server_flags_to_change(knobs, OnlinePoint(4, 8, 12, False)) == {}  # speculation off at any width
    assert server_flags_to_change(knobs, OnlinePoint(4, 8, 4, True)) == {"spec_on": True, "spec_width": 4}
    assert server_flags_to_change(knobs, OnlinePoint(4, 12, 0, False, max_num_batched_tokens=4096)) == {
        "max_num_seqs": 12,
        "max_num_batched_tokens": 4096,
    }
    assert server_flags_to_change(knobs, OnlinePoint(4, 8, 0, False)) == {}  # None: the server keeps its own


@pytest.mark.parametrize(
    ("tuner", "moved"),
    [
        ({"spec_toggle": True, "spec_width_bounds": (0, 16)}, "spec_on"),
        ({"max_num_batched_tokens_bounds": (1024, 4096)}, "max_num_batched_tokens"),
    ],
)
def test_the_tuners_trial_of_a_server_flag_is_a_replica_swap_that_drops_nothing(tuner: dict, moved: str) -> None:
    async def scenario() -> None:
        profile = flags_profile(**tuner)
        async with launch_gateway(profile) as (replicas, gateway), aiohttp.ClientSession() as session:
            tuning = attach_online_tuner(gateway, profile, settings=QUICK, replicas=replicas)
            sent = await serve_until_steps(gateway, tuning, 1)
            while tuning.swap is not None:  # the trial's swap: the new server starts, the old one drains
                await asyncio.sleep(0.05)
            assert replicas.swaps >= 1, "the tuner's trial did not swap the server"
            first, trial = replicas.started[0], replicas.started[1]
            assert getattr(trial, moved) != getattr(first, moved)
            assert trial.max_num_seqs == first.max_num_seqs == 8  # only the flag the trial moved
            _, feed = await get_json(session, gateway.base_url + "/gateway/tune")
            assert feed["knobs"][moved] == getattr(replicas.current_knobs(gateway), moved)
            await tuning.stop()
            assert_accounted(gateway, sent)

    asyncio.run(scenario())


def test_an_operator_swap_outside_the_tuners_range_names_the_flag_and_its_range() -> None:
    async def scenario() -> None:
        profile = flags_profile(max_num_batched_tokens_bounds=(1024, 4096))
        async with launch_gateway(profile) as (replicas, gateway), aiohttp.ClientSession() as session:
            tuning = attach_online_tuner(gateway, profile, settings=QUICK, replicas=replicas)
            url = gateway.base_url + "/gateway/swap"
            status, body = await post_json(session, url, {"max_num_batched_tokens": 16384})
            assert status == 400 and replicas.swaps == 0
            assert (
                body["error"]["message"]
                == "max_num_batched_tokens 16384 is outside the online tuner's range 1024..4096"
            )
            status, body = await post_json(session, url, {"max_num_batched_tokens": 4096})
            assert status == 200 and replicas.swaps == 1 and body["knobs"]["max_num_batched_tokens"] == 4096
            assert tuning.tuner.incumbent.max_num_batched_tokens == 4096
            await tuning.stop()

    asyncio.run(scenario())


def test_bounds_in_the_wrong_order_are_one_clear_error() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens_bounds: lower bound 4096 is above upper bound 1024"):
        load_profile("saber-w1").tuner.model_validate({"max_num_batched_tokens_bounds": (4096, 1024)})
