"""The operator console, driven with Textual's pilot: open, run on the simulator, panels update, tune, export a
factsheet, edit knobs, quit with nothing left running. Plus the session model without any UI."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, TabbedContent

from console.app import SloConsoleApp
from console.launch import create_app, run_app
from console.messages import SessionChanged
from console.screens.main import TABS
from console.session import Session
from console.widgets.kpi import KpiTile
from console.widgets.process import KnobDialog, KnobEditor
from core.backends.gateway_backend import GatewayBackend
from core.backends.sim import SimBackend
from core.events import make_event
from core.jobs import summary_event
from core.metrics.verdict import check_slo
from core.modes import MODE_GUIDE, MODES
from core.profile import Profile, TunerSpec, load_calibration, load_profile
from tests.fakes import run_batch
from tests.fakeserver import FakeOpenAIServer, StreamReply

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
    proc = run_batch(*args)
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
        # ... and whether the p99 met the 1.2 s SLO and by how much (the verdict core/metrics/verdict gives).
        verdict = check_slo("p99", expected["p99_s"], 1.2)
        assert verdict.state in ("met", "violated") and verdict.margin is not None
        side = "under" if verdict.state == "met" else "over"
        assert tile(app, "kpi-p99").value_text == f"{expected['p99_s']:.3f} · {verdict.state}"
        assert tile(app, "kpi-p99").border_subtitle == f"{abs(verdict.margin) * 100:.0f}% {side} SLO"
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


async def test_factsheet_after_a_tune_is_the_tuned_configuration_with_nothing_unknown(tmp_path: Path) -> None:
    """`f` after a tune writes what `--batch --job tune --out` writes: the tuned configuration, its objective,
    attainment and spread, and the SLO verdict (it showed "objective: unknown" / "SLO attainment unknown")."""
    out = tmp_path / "tuned"
    app = create_app("quickstart", requests=REQUESTS, speed=None, autostart=False, tuner_spec=small_tuner(), out=out)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("t")
        await wait_until(pilot, lambda: app.state.session.tune.finished, timeout_s=120)
        await pilot.press("f")
        await wait_until(pilot, lambda: app.state.last_export is not None)
        await pilot.press("q")
    factsheet = json.loads((out / "factsheet.json").read_text())
    tuning = factsheet["tuning"]
    assert factsheet["job"] == "tune" and tuning["objective"].startswith("maximise S(K)")
    assert tuning["tuned"]["slo_attainment"] is not None and tuning["baseline"]["slo_attainment"] is not None
    assert tuning["spread"]["measurements"] >= 1
    assert factsheet["verdict"]["state"] in ("met", "violated")
    assert factsheet["verdict"]["headline"].startswith("tuned ")
    page = (out / "factsheet.md").read_text()
    assert "objective: unknown" not in page and "## Tuning" in page
    assert f"**{factsheet['verdict']['headline']}.**" in page


async def test_factsheet_before_any_run_explains_what_to_do() -> None:
    app = create_app("quickstart", autostart=False)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("f")
        await pilot.pause()
        [note] = list(app._notifications)
        assert note.severity == "error" and "Fix:" in note.message and "press f" in note.message


# ---------------------------------------------------------------- process view, knobs


async def edit_knob(pilot: Pilot[Any], row: int, text: str) -> None:
    """On the Process tab: the cursor to knob `row`, Enter opens its dialog, `text` is typed, Enter keeps it."""
    app = pilot.app
    assert isinstance(app.focused, KnobEditor)
    await pilot.press("home", *["down"] * row, "enter")
    await pilot.pause()
    assert isinstance(app.screen, KnobDialog)
    await pilot.press(*text, "enter")  # the number keys type here: the dialog is where values are entered
    await pilot.pause()


async def test_knob_edit_restarts_the_simulated_run_with_the_new_knobs() -> None:
    app = create_app("quickstart", requests=REQUESTS, speed=None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state.session.run_state == "finished")
        first = app.state.last_result
        await pilot.press("3")
        screen = app.get_screen_main()
        editor = screen.query_one(KnobEditor)
        await edit_knob(pilot, 1, "4")  # max_num_seqs: the dialog opens with 12 selected, so 4 replaces it
        assert app.screen is screen and editor.pending["max_num_seqs"] == 4
        assert editor.get_cell("max_num_seqs", "value") == "12 → 4"  # pending until applied
        assert app.state.profile.knobs.max_num_seqs == 12
        await pilot.click("#restart")
        await wait_until(
            pilot, lambda: app.state.last_result is not first and app.state.session.run_state == "finished"
        )
        assert app.state.last_result is not None
        assert app.state.last_result.profile.knobs.max_num_seqs == 4
        assert app.state.session.knobs["max_num_seqs"] == 4
        assert editor.get_cell("max_num_seqs", "value") == "4"  # applied: nothing pending
        # Fewer sequences per batch queue longer under the same arrivals.
        assert app.state.last_result.summary.p99_s > first.summary.p99_s
        assert "embedded simulator" in str(screen.query_one("#process-command").render())


async def test_a_bad_knob_value_is_refused_in_its_dialog_and_esc_leaves_it_as_it_was() -> None:
    app = create_app("quickstart", autostart=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await edit_knob(pilot, 1, "0")
        dialog = app.screen
        assert isinstance(dialog, KnobDialog)  # still open: 0 is no max_num_seqs
        problem = str(dialog.query_one("#knob-problem").render())
        assert "max_num_seqs" in problem and "greater than" in problem
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.get_screen_main()
        assert app.get_screen_main().query_one(KnobEditor).pending["max_num_seqs"] == 12
        assert app.state.session.run_state == "idle"


async def test_on_off_knobs_flip_with_enter_and_a_refused_combination_says_cause_and_fix() -> None:
    app = create_app("quickstart", autostart=False)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("3")
        editor = app.get_screen_main().query_one(KnobEditor)
        await pilot.press("home", "down", "down", "down", "down", "enter")  # speculation: off -> on
        assert editor.pending["spec_on"] is True and editor.get_cell("spec_on", "value") == "off → on"
        editor.set_value("max_num_seqs", 0)  # what a bad edit elsewhere would leave: refused before any run
        await pilot.click("#restart")
        await pilot.pause()
        [note] = list(app._notifications)
        assert note.severity == "error" and "max_num_seqs" in note.message and "Fix:" in note.message
        assert app.state.session.run_state == "idle"


# ---------------------------------------------------------------- keys: numbers and Esc always navigate


async def test_number_keys_switch_tabs_from_the_knob_editor_and_never_edit_a_knob() -> None:
    app = create_app("quickstart", autostart=False)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.get_screen_main()
        tabs = screen.query_one(TabbedContent)
        editor = screen.query_one(KnobEditor)
        await pilot.press("3")
        assert tabs.active == "process" and app.focused is editor  # the tab's knobs have focus when it opens
        for key, tab in (("1", "monitor"), ("3", "process"), ("2", "tuner"), ("3", "process"), ("4", "modes")):
            await pilot.press(key)
            await pilot.pause()
            assert tabs.active == tab
        assert editor.pending == {**editor.pending, "max_num_seqs": 12, "concurrency": None}
        assert app.state.profile.knobs == load_profile("quickstart").knobs


async def test_from_every_focusable_widget_number_keys_navigate_and_esc_releases_focus() -> None:
    """The bug this guards: a focused knob Input took `1` as a digit (12 became 1) and kept Esc. The main
    screen holds no widget that takes those keys, so from whatever has focus they navigate."""
    app = create_app("quickstart", autostart=False)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.get_screen_main()
        tabs = screen.query_one(TabbedContent)
        for number, tab in enumerate(TABS, start=1):
            await pilot.press(str(number))
            await pilot.pause()
            assert tabs.active == tab
            widgets = list(screen.focus_chain)
            assert widgets, f"nothing to focus on the {tab} tab"
            for widget in widgets:
                assert not any(widget.check_consume_key(key, key) for key in "1234"), widget
                assert not widget.check_consume_key("escape", None), widget
                widget.focus()
                await pilot.pause()
                other = 1 if number != 1 else 2
                await pilot.press(str(other))
                await pilot.pause()
                assert tabs.active == TABS[other - 1], f"{other} did not navigate from {widget}"
                await pilot.press(str(number))
                await pilot.pause()
            widgets[-1].focus()
            await pilot.press("escape")
            await pilot.pause()
            assert app.focused is None and tabs.active == tab  # Esc releases the focus and stays on the tab
        editor = screen.query_one(KnobEditor)
        assert editor.pending["max_num_seqs"] == 12 and app.state.profile.knobs == load_profile("quickstart").knobs


async def test_in_a_knob_dialog_digits_type_and_esc_closes_it() -> None:
    app = create_app("quickstart", autostart=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3", "home", "down", "enter")
        await pilot.pause()
        assert isinstance(app.screen, KnobDialog)
        await pilot.press("1", "6")
        assert app.screen.query_one(Input).value == "16"
        assert app.get_screen_main().query_one(TabbedContent).active == "process"  # 1 typed, did not navigate
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.get_screen_main()
        assert app.get_screen_main().query_one(KnobEditor).pending["max_num_seqs"] == 12


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
        # ▶ the mode in use; * its figures are this console's last run (not a compare's).
        assert [row[0] for row in rows] == [
            f"{'▶' if mode == 'fcfs' else ' '} {mode}" + " *" * (mode == "fcfs") for mode in MODES
        ]
        summary = app.state.last_result.summary
        header = [str(column.label) for column in table.columns.values()]
        fcfs = dict(zip(header, rows[0], strict=True))
        assert fcfs["max_seqs"] == "12" and fcfs["speculation"] == "off"
        assert fcfs["SLO att."] == f"{summary.slo_attainment:.3f}" and fcfs["p99 s"] == f"{summary.p99_s:.2f}"
        assert fcfs["att. chat"] == f"{summary.per_task['chat'].slo_attainment:.3f}"
        assert set(rows[1][1:]) == {"—"}  # not run yet: unknown, never 0
        # Under the table, each mode's hint: when to use it and when not (core/modes.py MODE_GUIDE).
        note = str(screen.query_one("#modes-note").render())
        for guide in MODE_GUIDE.values():
            assert guide.what in note and guide.use_when in note and guide.avoid_when in note


async def test_modes_table_has_focus_when_its_tab_opens_and_enter_switches_the_mode() -> None:
    app = create_app("quickstart", requests=REQUESTS, speed=None)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state.session.run_state == "finished")
        first = app.state.last_result
        await pilot.press("4")
        await pilot.pause()
        table = app.get_screen_main().query_one("#modes-table", DataTable)
        assert app.focused is table
        await pilot.press("down", "down", "down")  # fcfs, saber, slos-serve, adaserve
        assert table.get_row_at(table.cursor_row)[0] == "  adaserve"
        await pilot.press("enter")
        await wait_until(
            pilot, lambda: app.state.last_result is not first and app.state.session.run_state == "finished"
        )
        assert app.state.profile.mode == "adaserve" and app.state.session.scheduling_mode == "adaserve"
        assert app.state.last_result is not None
        assert app.state.last_result.outcome.notes["mode"]["mode"] == "adaserve"  # the mode that actually ran
        await pilot.pause(0.3)
        row = {str(c.label): v for c, v in zip(table.columns.values(), table.get_row("adaserve"), strict=True)}
        # AdaServe drafts token trees although the knobs turn speculation off: its row says so.
        assert row["mode"] == "▶ adaserve *" and row["speculation"] == "token trees (draft)"


async def test_compare_fills_the_modes_table_with_the_batch_tables_columns_and_cells() -> None:
    from core.compare import format_table, run_compare, table_cells, table_header, table_tasks

    def assert_cells_fit(table: DataTable[Any]) -> None:
        """Every column is as wide as its widest cell: a figure that arrived after its placeholder is not cut
        (the CV column once showed `0.` while compare ran)."""
        for index, column in enumerate(table.columns.values()):
            widest = max(len(str(table.get_row_at(r)[index])) for r in range(table.row_count))
            assert column.content_width >= widest, column.label

    app = create_app("quickstart", requests=REQUESTS, speed=None, autostart=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        table = app.get_screen_main().query_one("#modes-table", DataTable)
        # A row as compare sends it while it runs, into a table drawn with placeholders.
        row = {"max_num_seqs": 12, "speculation": "token trees (draft)", "cv_completion_over_slo": 0.356123}
        app.state.session.apply(make_event("compare_row", mode="adaserve", **row))
        app.post_message(SessionChanged())
        await pilot.pause(0.3)
        assert table.get_row("adaserve")[2] == "token trees (draft)"
        assert_cells_fit(table)
        await pilot.press("c")
        await wait_until(pilot, lambda: app.state.session.compare_state == "finished", timeout_s=120)
        batch = await run_compare(app.state.profile, requests=REQUESTS)
        fields = {row.mode: row.fields() for row in batch.rows}
        tasks = table_tasks(list(fields.values()))
        assert tasks == ["chat"]
        header = [str(column.label) for column in table.columns.values()]
        assert header == table_header(tasks)
        assert " ".join(header) == " ".join(format_table(batch).splitlines()[0].split())  # what --batch prints
        for mode, figures in fields.items():
            # The same cells as the batch table's (`-` there is `—` here: unknown).
            assert list(table.get_row(mode))[1:] == table_cells(mode, figures, tasks, unknown="—")[1:]
        assert_cells_fit(table)
        assert table.get_row("adaserve")[2] == "token trees (draft)"


async def test_the_console_builds_its_backends_with_make_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    import core.backends.factory as factory

    calls: list[tuple[Any, ...]] = []
    build = factory.make_backend

    def spy(kind: str, profile: Profile, **options: Any) -> Any:
        calls.append((kind, profile.mode, options))
        return build(kind, profile, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(factory, "make_backend", spy)
    app = create_app("quickstart", requests=REQUESTS, speed=None, mode="saber")
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.state.session.run_state == "finished")
        assert [(kind, mode) for kind, mode, _ in calls] == [("sim", "saber")]
        assert calls[0][2]["on_server_state"] == app.server_state_from_thread  # a managed vLLM reports here
        app.modes.switch("fcfs")
        await wait_until(pilot, lambda: len(calls) == 2 and app.state.session.run_state == "finished")
        assert calls[1][:2] == ("sim", "fcfs")
    # A managed vLLM comes from the same builder (only built here, never started).
    app = create_app("quickstart", "vllm", autostart=False, mode="adaserve")
    async with app.run_test(size=SIZE):
        backend = app.runs.backend()
        assert calls[-1][:2] == ("vllm", "adaserve") and isinstance(backend, GatewayBackend)
        app.state.backend = None  # nothing started: nothing to stop on quit


async def test_the_mode_that_ran_is_in_the_modes_tab_the_summary_and_the_factsheet(tmp_path: Path) -> None:
    """--mode saber reaches the run (one channel: the profile's mode), and a switch in the Modes tab reruns in
    the new mode; the Modes tab, the summary and the factsheet say which mode actually ran."""
    app = create_app("quickstart", requests=REQUESTS, speed=None, mode="saber", out=tmp_path / "saber")
    async with app.run_test(size=SIZE) as pilot:
        state = app.state
        await wait_until(pilot, lambda: state.session.run_state == "finished")
        assert state.last_result is not None and state.session.summary is not None
        assert state.last_result.scheduling_mode == "saber" and state.session.summary["scheduling_mode"] == "saber"
        await pilot.press("4")
        await pilot.pause(0.2)
        table = app.get_screen_main().query_one("#modes-table", DataTable)

        def mode_cells() -> set[str]:
            # The mode cell marks the mode in use (▶) and a row holding this console's last run in it (*).
            return {str(table.get_row_at(i)[0]) for i in range(table.row_count)}

        assert {"▶ saber *", "  fcfs"} <= mode_cells()
        await pilot.press("f")
        await wait_until(pilot, lambda: state.last_export is not None)
        assert state.last_export is not None
        saber = json.loads(state.last_export[0].read_text())
        assert saber["configuration"]["scheduling_mode"] == "saber"
        first = state.last_result
        app.modes.switch("slos-serve")
        await wait_until(pilot, lambda: state.last_result is not first and state.session.run_state == "finished")
        assert state.last_result.scheduling_mode == "slos-serve"
        await pilot.pause(0.3)
        assert {"▶ slos-serve *", "  saber *"} <= mode_cells()
        state.last_export = None
        state.config.out = tmp_path / "slos-serve"
        await pilot.press("f")
        await wait_until(pilot, lambda: state.last_export is not None)
        assert state.last_export is not None
        assert json.loads(state.last_export[0].read_text())["configuration"]["scheduling_mode"] == "slos-serve"
        await pilot.press("q")


async def test_switching_mode_on_a_live_server_puts_the_gateway_in_front_and_then_swaps_its_policy() -> None:
    async with FakeOpenAIServer(StreamReply(), tokens_per_word=1) as fake:
        app = create_app("quickstart", "url", url=fake.base_url, requests=6, autostart=False)
        async with app.run_test(size=SIZE) as pilot:
            app.runs.start()
            await wait_until(pilot, lambda: app.state.session.run_state == "finished")
            assert not isinstance(app.state.backend, GatewayBackend) and len(fake.bodies) == 6
            await pilot.press("4")  # the Modes table has focus: Enter on it switches the mode
            await pilot.pause(0.1)
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
    from console.cli import build_parser, options_from_args

    argv = ["--profile", str(tmp_path / "missing.yaml")]
    assert run_app(options_from_args(build_parser().parse_args(argv), argv)) == 2
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


async def test_a_run_whose_requests_fail_says_why_as_the_batch_does(tmp_path: Path) -> None:
    """Prompts past the model's context fail; the console's toast carries the batch's cause-and-fix line."""
    profile = tmp_path / "long.yaml"
    profile.write_text(
        "name: long\nseed: 3\nworkload:\n  arrival: {kind: poisson, rate_rps: 20}\n  requests: 60\n  tasks:\n"
        "    - name: rag\n      prompt_tokens: {dist: lognormal, mean: 3500, sigma: 0.3, max: 8000}\n"
        "      output_tokens: {dist: fixed, value: 20}\nslo: {e2e_s: 60.0}\n"
        "engine: {calibration: calibrations/llama-7b-a100.yaml}\n"
    )
    app = create_app(str(profile), speed=None)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_until(pilot, lambda: app.state.session.run_state == "finished")
        batch = run_batch("--profile", str(profile)).stderr
        [said] = [n.message for n in app._notifications if "requests failed:" in n.message]
        assert said in batch and "exceeds max_model_len 4096" in said
        await pilot.press("q")
