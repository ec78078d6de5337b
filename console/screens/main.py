"""The main screen: a status line, four tabs (monitor, tuner, process, modes) and the footer."""

from __future__ import annotations

import contextlib

from textual import on
from textual.app import ComposeResult
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane

from console.session import Session
from console.widgets.modes import ModesView
from console.widgets.monitor import MonitorView
from console.widgets.process import ProcessView
from console.widgets.status import StatusBar
from console.widgets.tuner import TunerView
from core.profile import KnobsSpec

TABS = ("monitor", "tuner", "process", "modes")
# What has focus when a tab opens, so its keys work at once (Enter on the Modes table switches the mode).
TAB_FOCUS = {"monitor": "#tabs Tabs", "tuner": "#trajectory", "process": "#knob-editor", "modes": "#modes-table"}


class MainScreen(Screen[None]):
    def __init__(self, backend_kind: str, knobs: KnobsSpec) -> None:
        super().__init__()
        self.backend_kind = backend_kind
        self.knobs = knobs

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        with TabbedContent(initial="monitor", id="tabs"):
            with TabPane("1 Monitor", id="monitor"):
                yield MonitorView(id="monitor-view")
            with TabPane("2 Tuner", id="tuner"):
                yield TunerView(id="tuner-view")
            with TabPane("3 Process", id="process"):
                yield ProcessView(self.backend_kind, self.knobs, id="process-view")
            with TabPane("4 Modes", id="modes"):
                yield ModesView(id="modes-view")
        yield Footer()

    @on(TabbedContent.TabActivated)
    def _focus_tab(self, event: TabbedContent.TabActivated) -> None:
        target = TAB_FOCUS.get(event.pane.id or "")
        if target is not None:
            with contextlib.suppress(NoMatches):
                self.query_one(target).focus()

    def refresh_from(self, session: Session) -> None:
        """Redraw the status line and the visible tab (hidden tabs redraw when they are shown)."""
        self.query_one(StatusBar).refresh_from(session)
        active = self.query_one(TabbedContent).active
        if active == "monitor":
            self.query_one(MonitorView).refresh_from(session)
        elif active == "tuner":
            self.query_one(TunerView).refresh_from(session)
        elif active == "modes":
            self.query_one(ModesView).refresh_from(session)
        elif active == "process" and session.is_simulator:
            # The simulator has no process log; its feed is the event stream (what --batch prints).
            view = self.query_one(ProcessView)
            view.show_state(session.run_state, "embedded simulator")
            view.show_log(list(session.recent))
