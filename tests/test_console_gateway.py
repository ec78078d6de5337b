"""The console attached to a running admission gateway (`--backend url --url http://GATEWAY`,
console/app_gateway.py), driven with Textual's pilot against a real in-process gateway over scripted
upstreams: the Tuner tab shows the gateway's online steps as they happen, marked as the gateway's; the header
and the Process tab say a gateway fronts the server; "restart with these knobs" becomes a replica swap at a
--launch gateway and one line saying why not at any other. A plain server is not taken for a gateway."""

from __future__ import annotations

import asyncio

from textual.widgets import DataTable, Static

from console.app_gateway import ONLINE_SOURCE, probe_gateway
from console.launch import create_app
from console.widgets.process import ProcessView
from console.widgets.status import StatusBar
from core.controller_api import Policy
from core.gateway.server import Gateway
from core.profile import KnobsSpec
from core.tune.online_gateway import attach_online_tuner
from tests.fakeserver import FakeOpenAIServer, StreamReply
from tests.test_console import SIZE, tile, wait_until
from tests.test_gateway_tune_endpoints import QUICK, launch_gateway, quick_profile, serve_until_steps


def _text(widget: Static) -> str:
    return str(widget.render())


async def test_the_tuner_tab_shows_the_gateways_online_steps_as_they_happen() -> None:
    async with (
        FakeOpenAIServer(StreamReply(first_delay_s=0.01, chunk_delay_s=0.005)) as fake,
        Gateway([fake.base_url], Policy()) as gateway,
    ):
        tuning = attach_online_tuner(gateway, quick_profile(), settings=QUICK)
        app = create_app("quickstart", backend="url", url=gateway.base_url, autostart=False)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await wait_until(pilot, lambda: app.state.gateway is not None)
            assert app.state.gateway is not None and app.state.gateway.online_tune
            assert "behind a gateway" in _text(app.get_screen_main().query_one(StatusBar))
            await pilot.press("2")
            await serve_until_steps(gateway, tuning, 1)
            table = app.get_screen_main().query_one("#trajectory", DataTable)
            await wait_until(pilot, lambda: table.row_count == len(tuning.steps))
            assert table.row_count >= 1
            assert tile(app, "tune-state").value_text == ONLINE_SOURCE
            assert ONLINE_SOURCE in str(table.border_title)
            first = tuning.steps[0]
            row = table.get_row_at(0)
            assert row[0] == str(first["step"]) and str(row[-1]) == first["reason"]
            # More steps arrive while the tab is open: only the new ones are added.
            await serve_until_steps(gateway, tuning, len(tuning.steps) + 1)
            await wait_until(pilot, lambda: table.row_count == len(tuning.steps))
            # t does not start the console's own tuner over the gateway's.
            await pilot.press("t")
            await pilot.pause(0.2)
            assert not app.workers or all(w.group != "tune" for w in app.workers)
            assert any("tunes online" in n.message for n in app._notifications)
            # The Process tab says a gateway fronts the server; without --launch a restart says it cannot swap.
            await pilot.press("3")
            view = app.get_screen_main().query_one(ProcessView)
            await wait_until(pilot, lambda: "fronts the server" in _text(view.query_one("#process-state", Static)))
            app.process.action("restart", KnobsSpec(max_num_seqs=12))
            await pilot.pause(0.1)
            assert any("cannot swap" in n.message for n in app._notifications)
            await app.shutdown()
        await tuning.stop()


async def test_restart_with_edited_knobs_is_a_replica_swap_at_a_launch_gateway() -> None:
    async with launch_gateway(quick_profile()) as (replicas, gateway):
        replicas.answer_swaps(gateway)
        app = create_app("quickstart", backend="url", url=gateway.base_url, autostart=False)
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await wait_until(pilot, lambda: app.state.gateway is not None)
            assert app.state.gateway is not None and app.state.gateway.replica_swap
            assert not app.state.gateway.online_tune
            # 16: neither the gateway's server (8) nor the console's quickstart profile (12) has it, so the
            # profile's knobs become 16 only from the swap's answer. Wait on that answer (its notification): a
            # condition already true before the swap (12 was quickstart's own) let the asserts run mid-swap on a
            # loaded machine.
            assert app.state.profile.knobs.max_num_seqs != 16
            knobs = app.state.profile.knobs.model_copy(update={"max_num_seqs": 16})
            app.process.action("restart", knobs)
            await wait_until(pilot, lambda: any("now serves with" in n.message for n in app._notifications))
            assert replicas.swaps == 1 and [k.max_num_seqs for k in replicas.started] == [8, 16]
            assert [u.retired for u in gateway.upstreams] == [True, False]
            assert app.state.profile.knobs.max_num_seqs == 16
            await app.shutdown()


def test_a_plain_server_is_not_taken_for_a_gateway() -> None:
    async def scenario() -> None:
        async with FakeOpenAIServer(StreamReply()) as fake:
            assert await asyncio.to_thread(probe_gateway, fake.base_url) is None
        assert await asyncio.to_thread(probe_gateway, "http://127.0.0.1:9", 0.5) is None  # nothing listens

    asyncio.run(scenario())
