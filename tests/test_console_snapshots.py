"""Snapshot tests of the console's main screens (pytest-textual-snapshot; SVGs in tests/__snapshots__/).

Deterministic by construction: a fixed profile and seed, the simulator run flat out to the end (a finished
run, not a moving one), a fixed terminal size, cursor blink frozen, notifications cleared, the tuner view
fed with fixed events. Snapshots depend on the Textual version (pinned in the dev venv: 8.2.8): after an
intended UI change, review the report and run `pytest tests/test_console_snapshots.py --snapshot-update`.

`python tests/test_console_snapshots.py` also writes assets/console.svg, assets/tuner.svg and assets/modes.svg
(the Modes tab after `c` compared every mode on the quickstart arrivals) for the README from the same
deterministic states.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input

from console.app import SloConsoleApp
from console.launch import create_app
from console.messages import SessionChanged
from core.events import make_event

SIZE = (160, 48)
REQUESTS = 600
ASSETS = Path(__file__).resolve().parent.parent / "assets"

# A fixed tuner trajectory in the shape core/tune emits (the SLO-Tuner paper's start: spec on, width 8).
TUNE_EVENTS: list[dict[str, Any]] = [
    make_event("start", job="tune", algorithm="hillclimb", steps=8, slo_p99_s=1.2),
    *[
        make_event(
            "tune_step",
            algorithm="hillclimb",
            world="sim",
            step=step,
            knobs=knobs,
            p50_s=p50,
            p95_s=p95,
            p99_s=p99,
            goodput_rps=goodput,
            score=score,
            moved=moved,
            reason=why,
        )
        for step, knobs, p50, p95, p99, goodput, score, moved, why in [
            (
                1,
                {"concurrency": 8, "max_num_seqs": 8, "spec_on": True, "spec_width": 8},
                0.899,
                1.244,
                1.362,
                8.17,
                -0.270,
                True,
                "best neighbour gains 16.126 >= delta 0.02",
            ),
            (
                2,
                {"concurrency": 8, "max_num_seqs": 8, "spec_on": False, "spec_width": 8},
                0.509,
                0.605,
                0.614,
                16.02,
                15.856,
                True,
                "best neighbour gains 0.310 >= delta 0.02",
            ),
            (
                3,
                {"concurrency": 10, "max_num_seqs": 8, "spec_on": False, "spec_width": 8},
                0.611,
                0.760,
                0.802,
                16.95,
                16.166,
                False,
                "best neighbour gains 0.004 < delta 0.02",
            ),
        ]
    ],
]
TUNE_SEGMENTS_USED = 21


@pytest.fixture(autouse=True)
def frozen_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A blinking cursor makes two screenshots of the same state differ; hold it still."""
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)


def finished_app(requests: int | None = REQUESTS) -> SloConsoleApp:
    return create_app("quickstart", requests=requests, speed=None, command_line=["slo-console"])


async def until_finished(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, SloConsoleApp)
    deadline = time.monotonic() + 60
    while app.state.session.run_state != "finished":
        assert time.monotonic() < deadline, "the simulated run did not finish"
        await pilot.pause(0.05)
    await pilot.pause(0.3)
    app.clear_notifications()
    await pilot.pause()


async def with_tuner(pilot: Pilot[Any]) -> None:
    await until_finished(pilot)
    app = pilot.app
    assert isinstance(app, SloConsoleApp)
    await pilot.press("2")
    for event in TUNE_EVENTS:
        app.state.session.apply(event, wall_s=0.0)
    app.state.session.apply(make_event("tune_segment", segments_used=TUNE_SEGMENTS_USED), wall_s=42.0)
    # Time left rests on wall time; pin it by stating the elapsed time outright.
    app.state.session.tune.started_wall_s = 0.0
    app.post_message(SessionChanged())
    await pilot.pause(0.3)


def test_monitor_after_a_finished_run(snap_compare: Any) -> None:
    assert snap_compare(finished_app(), terminal_size=SIZE, run_before=until_finished)


def test_tuner_view(snap_compare: Any) -> None:
    assert snap_compare(finished_app(), terminal_size=SIZE, run_before=with_tuner)


def test_process_view_on_the_simulator(snap_compare: Any) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await until_finished(pilot)
        await pilot.press("3")

    assert snap_compare(finished_app(), terminal_size=SIZE, run_before=run_before)


def test_modes_view(snap_compare: Any) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await until_finished(pilot)
        await pilot.press("4")

    assert snap_compare(finished_app(), terminal_size=SIZE, run_before=run_before)


def test_help_screen(snap_compare: Any) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await until_finished(pilot)
        await pilot.press("question_mark")

    assert snap_compare(finished_app(), terminal_size=SIZE, run_before=run_before)


async def with_compare(pilot: Pilot[Any]) -> None:
    """The Modes tab once `c` has compared every mode on the profile's seeded arrivals (the simulator)."""
    await until_finished(pilot)
    app = pilot.app
    assert isinstance(app, SloConsoleApp)
    await pilot.press("4")
    await pilot.press("c")
    deadline = time.monotonic() + 900
    while app.state.session.compare_state != "finished":
        assert app.state.session.compare_state in ("idle", "running"), app.state.session.compare_state
        assert time.monotonic() < deadline, "the compare job did not finish"
        await pilot.pause(0.2)
    await pilot.pause(0.5)
    app.clear_notifications()
    await pilot.pause()


async def export_assets() -> None:
    """Write the README screenshots from the same deterministic states the snapshots use."""
    ASSETS.mkdir(exist_ok=True)
    for name, prepare in (("console.svg", until_finished), ("tuner.svg", with_tuner), ("modes.svg", with_compare)):
        app = finished_app(requests=None)  # the README's command: the whole quickstart profile
        async with app.run_test(size=SIZE) as pilot:
            await prepare(pilot)
            await pilot.pause(0.3)
            (ASSETS / name).write_text(app.export_screenshot(title="slo-console"))
            print(ASSETS / name)


if __name__ == "__main__":
    asyncio.run(export_assets())
