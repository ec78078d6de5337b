"""The operator console, driven with Textual's pilot: open, run on the simulator, panels update, tune, export a
factsheet, edit knobs, quit with nothing left running. Plus the session model without any UI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input

from console.app import SloConsoleApp
from console.launch import create_app, run_app
from console.messages import SessionChanged
from console.session import Session
from console.widgets.kpi import KpiTile
from core.backends.gateway import GatewayBackend
from core.backends.sim import SimBackend
from core.control.modes import MODES
from core.events import make_event
from core.jobs import summary_event
from core.profile import Profile, TunerSpec, load_calibration, load_profile
from tests.fakeserver import FakeOpenAIServer, StreamReply

REPO = Path(__file__).resolve().parent.parent
SIZE = (160, 48)
REQUESTS = 240  # enough for percentiles that mean something, few enough for a quick test
FAST = 400.0  # simulator pace: 400x wall time keeps the run paced (like the real console) yet quick


async def wait_until(pilot: Pilot[Any], condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the console")
        await pilot.pause(0.05)
    await pilot.pause(0.2)  # let the last coalesced redraw land


def tile(app: SloConsoleApp, tile_id: str) -> KpiTile:
    return app.get_screen_main().query_one(f"#{tile_id}", KpiTile)


def batch_summary_line(*args: str) -> dict[str, Any]:
    """The last line `slo-console --batch` prints: its summary event for the same profile and seed."""
    proc = subprocess.run(
        [sys.executable, "-m", "console", "--batch", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


# ---------------------------------------------------------------- the session model (no UI)


def make_session() -> Session:
    return Session(
        profile_name="p",
        backend_kind="sim",
        slo_e2e_s=1.2,
        slo_ttft_s=0.5,
        slo_tpot_s=None,
        knobs={"max_num_seqs": 16},
        speed=1.0,
    )


def test_session_folds_progress_engine_and_summary() -> None:
    session = make_session()
    session.apply(make_event("start", job="run", seed=7, max_requests=100, backend={"backend": "sim"}, knobs={}))
    window = {"p99_s": 1.5, "goodput_rps": 9.0, "slo_attainment": 0.8, "smooth_goodput": 900.0}
    session.apply(make_event("progress", t_s=10.0, finished=50, failed=0, window=window))
    session.apply(make_event("engine", t_s=10.0, running=4, waiting=1, kv_usage=0.25, power_w=300.0))
    session.apply(make_event("engine", t_s=12.0, running=4, waiting=0, kv_usage=0.3, power_w=200.0))
    assert session.run_state == "running"
    assert session.headline()["p99_s"] == 1.5 and session.headline()["scope"] == "last 10 s window"
    assert session.series["p99_s"].last == 1.5 and len(session.series["running"]) == 2
    # 300 W held for 2 s; the second sample's power holds until a later one.
    assert session.energy_j == pytest.approx(600.0) and session.energy_basis == "modelled"
    session.apply(make_event("summary", interrupted=False, p99_s=2.0, goodput_rps=11.0))
    assert session.run_state == "finished"
    assert session.headline()["p99_s"] == 2.0 and session.headline()["scope"] == "run summary"


def test_session_unknown_values_are_never_plotted_as_zero() -> None:
    session = make_session()
    session.apply(make_event("progress", t_s=1.0, finished=1, failed=0, window={"p99_s": float("nan")}))
    assert len(session.series["p99_s"]) == 0
    assert session.headline()["p99_s"] is None


def test_session_tuner_budget_and_best() -> None:
    session = make_session()
    session.apply(make_event("start", job="tune", steps=2, slo_p99_s=1.0), wall_s=100.0)
    assert session.tune.active and session.tune.budget_segments == 17  # 2 steps x 8 segments + the final
    for used, (score, p99) in enumerate([(-3.0, 1.4), (2.0, 0.9), (1.0, 0.8)], start=1):
        session.apply(make_event("tune_segment", segments_used=used), wall_s=100.0 + used)
        session.apply(
            make_event("tune_step", step=used, knobs={"max_num_seqs": used}, p99_s=p99, score=score, reason="r"),
            wall_s=100.0 + used,
        )
    assert session.tune.best["score"] == 2.0 and session.tune.baseline["score"] == -3.0
    assert session.tune.steps[0]["why"] == "r"
    assert session.tune.time_left_s() == pytest.approx(14.0)  # 1 s per segment, 14 segments left


# ---------------------------------------------------------------- open and run


async def test_opens_on_the_simulator_and_panels_move_then_match_the_batch_summary() -> None:
    app = create_app("quickstart", requests=REQUESTS, speed=FAST)
    async with app.run_test(size=SIZE) as pilot:
        # The run starts by itself: a first-time user sees live panels without pressing anything.
        await wait_until(pilot, lambda: app.state.session.finished > 0)
        assert app.state.session.run_state in ("running", "finished")
        await wait_until(pilot, lambda: app.state.session.run_state == "finished")
        assert len(app.state.session.series["p99_s"]) >= 3  # a time series, not one final point
        assert len(app.state.session.series["running"]) >= 3
        expected = await asyncio.to_thread(batch_summary_line, "--requests", str(REQUESTS))
        assert app.state.last_result is not None
        assert summary_event(app.state.last_result) == expected  # byte for byte, pacing changes nothing
        # Tiles show the run's summary once it ends: the batch runner's numbers, to the digits shown.
        assert tile(app, "kpi-p99").value_text == f"{expected['p99_s']:.3f}"
        assert tile(app, "kpi-goodput").value_text == f"{expected['goodput_rps']:.2f}"
        assert tile(app, "kpi-attain").value_text == f"{expected['slo_attainment'] * 100:.1f}%"
        # The p99 tile's colour says where p99 stands against the 1.2 s SLO: red over it, green well within.
        if expected["p99_s"] > 1.2:
            assert tile(app, "kpi-p99").has_class("-bad")
        elif expected["p99_s"] < 1.2 * 0.9:
            assert tile(app, "kpi-p99").has_class("-good")
        assert tile(app, "kpi-power").border_title == "power W model"  # simulator watts are modelled, and say so
        assert str(tile(app, "kpi-power").border_subtitle).startswith("energy ")
        await pilot.press("q")
    assert app.return_code == 0


async def test_stop_keeps_what_was_measured_and_r_runs_again() -> None:
    # The full 2000 requests at 4x take ~30 s of wall time: a loaded machine that starves the UI loop for
    # seconds still cannot finish the run before `s` arrives (at 20x, 6 s, a clean-clone CI run did).
    app = create_app("quickstart", speed=4.0)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state.session.finished >= 100)
        await pilot.press("s")
        await wait_until(pilot, lambda: app.state.session.run_state == "stopped")
        assert app.state.last_result is not None and app.state.last_result.interrupted
        assert 0 < app.state.last_result.summary.requests < 2000
        stopped = app.state.last_result
        await pilot.press("r")
        await wait_until(pilot, lambda: app.state.session.run_state == "running")
        assert app.state.session.summary is None  # a fresh run: the stopped run's summary is gone from the tiles
        assert tile(app, "kpi-p99").border_subtitle == "SLO 1.20 s"
        assert app.state.last_result is stopped  # the stopped run stays exportable until the new one ends
        await pilot.press("q")


async def test_a_fast_event_stream_coalesces_into_few_redraws() -> None:
    app = create_app("quickstart", autostart=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        before = app.redraws
        for _ in range(500):
            app.post_message(SessionChanged())
        await pilot.pause(0.5)
        assert 1 <= app.redraws - before <= 10
        assert SessionChanged().can_replace(SessionChanged())


# ---------------------------------------------------------------- tuner


def small_tuner() -> TunerSpec:
    # The paper's hill-climb, 2 steps: rows arrive step by step (the default guided search sweeps the
    # simulator before its first row; tests/test_tune.py runs it on this profile).
    return TunerSpec(algorithm="hillclimb", steps=2, sim_min_duration_s=20.0, sim_min_requests=200)


async def test_tuner_on_the_simulator_shows_trajectory_rows_as_they_arrive() -> None:
    pytest.importorskip("core.tune.job")
    app = create_app("quickstart", requests=REQUESTS, speed=None, autostart=False, tuner_spec=small_tuner())
    async with app.run_test(size=SIZE, message_hook=None) as pilot:
        await pilot.press("t")
        await wait_until(pilot, lambda: app.state.session.tune.finished, timeout_s=120)
        table = app.get_screen_main().query_one("#trajectory", DataTable)
        assert table.row_count == len(app.state.session.tune.steps) >= 1
        assert app.get_screen_main().query_one("TabbedContent").active == "tuner"
        first = table.get_row_at(0)
        start_seqs = load_profile("quickstart").knobs.max_num_seqs  # the tuner starts from the profile's knobs
        assert first[0] == "1" and f"seqs {start_seqs}" in first[1]
        assert tile(app, "tune-segments").value_text.startswith(str(app.state.session.tune.segments_used))
        assert tile(app, "tune-best").value_text != "—"
        await pilot.press("q")


async def test_tuner_view_renders_fed_events_row_by_row() -> None:
    """The view against the documented event shapes alone, independent of the tuner's search."""
    app = create_app("quickstart", autostart=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        app.state.session.apply(make_event("start", job="tune", steps=3, slo_p99_s=1.2), wall_s=0.0)
        table = app.get_screen_main().query_one("#trajectory", DataTable)
        for step, p99 in enumerate([1.9, 1.3, 1.0], start=1):
            app.state.session.apply(
                make_event(
                    "tune_step",
                    step=step,
                    knobs={"concurrency": 8, "max_num_seqs": 16 - 3 * step, "spec_on": False, "spec_width": 0},
                    p50_s=0.5,
                    p95_s=p99 - 0.1,
                    p99_s=p99,
                    goodput_rps=5.0 + step,
                    score=step,
                    moved=step < 3,
                    reason="best neighbour gains" if step < 3 else "no neighbour gains >= delta",
                ),
                wall_s=float(step),
            )
            app.post_message(SessionChanged())
            await pilot.pause(0.2)
            assert table.row_count == step  # each step appears as it arrives
        assert tile(app, "tune-best").value_text == "8.00"
        assert tile(app, "tune-best").has_class("-good")  # p99 1.0 s within the 1.2 s SLO (and not within 10% of it)
        assert tile(app, "tune-baseline").has_class("-bad")
        assert tile(app, "tune-gain").value_text == "×1.33"


# ---------------------------------------------------------------- factsheet


async def test_f_exports_a_factsheet_and_says_where(tmp_path: Path) -> None:
    out = tmp_path / "session"
    app = create_app("quickstart", requests=REQUESTS, speed=None, out=out)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_until(pilot, lambda: app.state.session.run_state == "finished")
        await pilot.press("f")
        await wait_until(pilot, lambda: app.state.last_export is not None)
        json_path, markdown_path = app.state.last_export
        assert json_path == out / "factsheet.json" and json_path.exists() and markdown_path.exists()
        factsheet = json.loads(json_path.read_text())
        assert factsheet["performance"]["basis"] == "simulated"
        assert factsheet["performance"]["requests"] == app.state.last_result.summary.requests
        assert any(str(json_path) in n.message for n in app._notifications)
        await pilot.press("q")


async def test_factsheet_before_any_run_explains_what_to_do() -> None:
    app = create_app("quickstart", autostart=False)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("f")
        await pilot.pause()
        [note] = list(app._notifications)
        assert note.severity == "error" and "Fix:" in note.message and "press f" in note.message


# ---------------------------------------------------------------- process view, knobs


async def test_knob_edit_restarts_the_simulated_run_with_the_new_knobs() -> None:
    app = create_app("quickstart", requests=REQUESTS, speed=None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state.session.run_state == "finished")
        first = app.state.last_result
        await pilot.press("3")
        screen = app.get_screen_main()
        screen.query_one("#knob-max_num_seqs", Input).value = "4"
        await pilot.click("#restart")
        await wait_until(pilot, lambda: app.state.last_result is not first and app.state.session.run_state == "finished")
        assert app.state.last_result.profile.knobs.max_num_seqs == 4
        assert app.state.session.knobs["max_num_seqs"] == 4
        # Fewer sequences per batch queue longer under the same arrivals.
        assert app.state.last_result.summary.p99_s > first.summary.p99_s
        assert "embedded simulator" in str(screen.query_one("#process-command").render())


async def test_a_bad_knob_is_refused_with_cause_and_fix() -> None:
    app = create_app("quickstart", autostart=False)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("3")
        app.get_screen_main().query_one("#knob-max_num_seqs", Input).value = "0"
        await pilot.click("#restart")
        await pilot.pause()
        [note] = list(app._notifications)
        assert note.severity == "error" and "max_num_seqs" in note.message and "fix" in note.message
        assert app.state.session.run_state == "idle"


# ---------------------------------------------------------------- feel: help, palette, modes


async def test_help_screen_and_palette_commands() -> None:
    app = create_app("quickstart", autostart=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        await pilot.pause()
        assert type(app.screen).__name__ == "MainScreen"
        titles = {command.title for command in app.get_system_commands(app.screen)}
        assert {"Run the workload", "Start the SLO-Tuner", "Export factsheet", "Stop the run"} <= titles


async def test_modes_tab_lists_every_mode_with_the_last_run_of_the_one_in_use() -> None:
    app = create_app("quickstart", requests=REQUESTS, speed=None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state.session.run_state == "finished")
        await pilot.press("4")
        await pilot.pause(0.2)
        screen = app.get_screen_main()
        assert "fcfs (vLLM default)" in str(screen.query_one("#mode-current").render())
        table = screen.query_one("#modes-table", DataTable)
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        assert [row[0] for row in rows] == list(MODES)
        assert rows[0][2] == "in use · last run"
        summary = app.state.last_result.summary
        assert rows[0][3] == f"{100 * summary.slo_attainment:.1f}" and rows[0][5] == f"{summary.p99_s:.3f}"


async def test_switching_mode_on_a_live_server_puts_the_gateway_in_front_and_then_swaps_its_policy() -> None:
    async with FakeOpenAIServer(StreamReply(), tokens_per_word=1) as fake:
        app = create_app("quickstart", "url", url=fake.base_url, requests=6, autostart=False)
        async with app.run_test(size=SIZE) as pilot:
            app.runs.start()
            await wait_until(pilot, lambda: app.state.session.run_state == "finished")
            assert not isinstance(app.state.backend, GatewayBackend) and len(fake.bodies) == 6
            await pilot.press("4")
            await pilot.pause(0.1)
            app.get_screen_main().query_one("#modes-table", DataTable).focus()
            await pilot.press("enter")  # the cursor is on fcfs: choosing a mode on a live server means the gateway
            await pilot.pause(0.1)
            backend = app.state.backend
            assert isinstance(backend, GatewayBackend) and backend.mode == "fcfs"
            app.runs.start()
            await wait_until(pilot, lambda: app.state.session.run_state == "finished" and backend.gateway is not None)
            await wait_until(pilot, lambda: app.state.session.summary is not None)
            gateway = backend.gateway
            assert gateway is not None and gateway.stats.completed == 6 and len(fake.bodies) == 12
            app.modes.switch("fcfs")  # the running gateway swaps its policy (on its own loop); nothing restarts
            await wait_until(pilot, lambda: gateway.stats.policy_swaps == 1)
            assert app.state.backend is backend and backend.gateway is gateway
            await pilot.press("q")  # quits: the gateway stops on its loop before the load thread does
        assert backend.gateway is None


# ---------------------------------------------------------------- quit


class ManagedServerBackend:
    """The simulator behind a real child server process, managed like vLLM (core.serve.process): quitting the
    console must stop it. The child is a tiny HTTP server, so the test needs no vLLM."""

    name = "sim"

    def __init__(self, profile: Profile) -> None:
        from core.serve.process import ServerProcess

        self.sim = SimBackend(load_calibration(profile), profile.knobs, seed=profile.seed, speed=None)
        self.process = ServerProcess(
            lambda host, port: [sys.executable, "-m", "http.server", str(port), "--bind", host],
            ready_paths=("/",),
            startup_timeout_s=30.0,
            stop_timeout_s=10.0,
        )
        self.closed = False

    def describe(self) -> dict[str, Any]:
        return self.sim.describe()

    async def run(self, plan, observer=None):  # type: ignore[no-untyped-def]
        if not self.process.is_running():
            await asyncio.to_thread(self.process.start)
        return await self.sim.run(plan, observer)

    async def close(self) -> None:
        self.closed = True
        await asyncio.to_thread(self.process.stop)


async def test_quit_stops_the_server_the_console_started() -> None:
    from core.serve.process_group import group_members

    backends: list[ManagedServerBackend] = []

    def factory(profile: Profile) -> ManagedServerBackend:
        backends.append(ManagedServerBackend(profile))
        return backends[-1]

    app = create_app("quickstart", requests=REQUESTS, speed=None, backend_factory=factory)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state.session.run_state == "finished")
        [backend] = backends
        pid = backend.process.pid
        assert pid is not None and backend.process.is_running()
        await pilot.press("q")
    assert backend.closed and not backend.process.is_running()
    assert group_members(pid) == []  # nothing of its process group is left


def test_a_bad_profile_exits_2_before_any_ui(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from console.cli import build_parser

    args = build_parser().parse_args(["--profile", str(tmp_path / "missing.yaml")])
    assert run_app(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("slo-console: ") and len(err.strip().splitlines()) == 1


async def test_a_live_run_generates_load_off_the_ui_loop() -> None:
    """Load generation and chunk timestamps run on the load thread's loop, so redraws cannot delay them."""
    import threading

    from core.backends.live import UrlBackend
    from tests.fakeserver import FakeOpenAIServer, StreamReply

    seen: dict[str, Any] = {}

    class WatchedUrlBackend(UrlBackend):
        async def run(self, plan, observer=None):  # type: ignore[no-untyped-def]
            seen["thread"] = threading.current_thread()
            seen["loop"] = asyncio.get_running_loop()
            return await super().run(plan, observer)

    async with FakeOpenAIServer(reply=StreamReply(chunk_delay_s=0.002)) as server:
        app = create_app(
            "quickstart",
            "url",
            url=server.base_url,
            requests=40,
            backend_factory=lambda profile: WatchedUrlBackend(server.base_url, metrics_interval_s=None),
        )
        async with app.run_test(size=SIZE) as pilot:
            await wait_until(pilot, lambda: app.state.session.run_state == "finished")
            ui_loop = asyncio.get_running_loop()
            result = app.state.last_result
            assert result is not None and len(result.records) == 40
            assert all(record.ok for record in result.records)
            assert app.state.session.run_state == "finished"  # the events crossed back to the UI loop
            await pilot.press("q")

    assert seen["thread"] is not threading.main_thread() and seen["thread"].name == "slo-console-load"
    assert seen["loop"] is not ui_loop
