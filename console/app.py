"""The operator console: a Textual app over the same event stream the batch runner prints.

`create_app(...)` (console/launch.py) is the one factory the CLI (`run_app`) and the tests use. The app draws
and routes keys; its jobs live in controllers (console/app_run.py, app_tuner.py, app_process.py,
app_modes.py) that share only the state declared in console/state.py. Jobs run in Textual workers on the
app's event loop: the simulator yields between slices of virtual time and the live
backends await HTTP, so the UI never freezes. Every event is folded into `console.session.Session` at once
(cheap) and announced with a coalescing `SessionChanged` message; redraws are capped at a few per second,
so a fast stream never makes the UI lag behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import Button, TabbedContent

from console.app_gateway import GatewayController
from console.app_modes import ModesController
from console.app_process import ProcessController
from console.app_run import RunController
from console.app_tuner import TunerController
from console.export import default_out_dir, export_factsheet
from console.messages import FactsheetWritten, ServerStateChanged, SessionChanged
from console.screens.help import HelpScreen
from console.screens.main import TABS, MainScreen
from console.state import ConsoleState
from console.widgets.modes import ModeChosen
from console.widgets.process import KnobEditor, KnobsInvalid
from core.backend_api import Backend
from core.exit_codes import ExitCode
from core.jobs.options import JobName, OperatorOptions
from core.profile import Profile, TunerSpec

# A progress event per this many finished requests: at 14 req/s that is about three panel updates a second
# of run time (the batch runner's 250 suits a log, not a live panel).
CONSOLE_PROGRESS_EVERY = 5
# At most this many redraws a second; events in between are folded into the model and drawn together.
MAX_REDRAWS_PER_S = 8.0
LOG_POLL_S = 1.0  # how often the process tab re-reads vLLM's log tail
BACKEND_CLOSE_TIMEOUT_S = 60.0  # vLLM gets SIGTERM, then SIGKILL after its own stop timeout

BackendFactory = Callable[[Profile], Backend]


@dataclass
class ConsoleConfig(OperatorOptions):
    """What the operator asked for (`OperatorOptions`, the batch runner's too; `profile` is loaded, in the
    asked-for mode: console/launch.py `open_console`) and the console's own settings."""

    autostart: bool = True
    progress_every: int = CONSOLE_PROGRESS_EVERY
    backend_factory: BackendFactory | None = None  # tests inject a backend; None builds the asked-for one
    tuner_spec: TunerSpec | None = None  # None: the profile's tuner section (the paper's values by default)


class SloConsoleApp(App[int]):
    """slo-console's operator console.

    The app draws and routes keys; its jobs live in controllers (`runs`, `tuner`, `process`, `modes`) that
    share only the declared `state` (console/state.py).
    """

    TITLE = "slo-console"
    CSS_PATH = "app.tcss"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "run", "Run"),
        Binding("s", "stop", "Stop"),
        Binding("t", "tune", "Tune"),
        Binding("f", "factsheet", "Factsheet"),
        # Tab numbers and Esc come first on the main screen, whatever has focus: they always navigate and
        # never land in a field (the main screen has none; a knob's value is typed in its own dialog, where
        # `check_action` lets the digits through).
        Binding("1", "show_tab('monitor')", "Monitor", priority=True),
        Binding("2", "show_tab('tuner')", "Tuner", priority=True),
        Binding("3", "show_tab('process')", "Process", priority=True),
        Binding("4", "show_tab('modes')", "Modes", priority=True),
        Binding("escape", "release_focus", "Unfocus", show=False, priority=True),
        Binding("c", "compare", "Compare modes"),
        Binding("question_mark,f1", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        # ctrl+q quits from anywhere, even from a focused input that takes the plain q.
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(self, config: ConsoleConfig) -> None:
        super().__init__()
        self.state = ConsoleState.from_config(config)
        self.runs = RunController(self)
        self.process = ProcessController(self)
        self.modes = ModesController(self)
        self.tuner = TunerController(self)
        self.gateway = GatewayController(self)
        self.redraws = 0  # counted so a test can see that a burst of events coalesces
        self._last_redraw = 0.0
        self._redraw_pending = False

    # ------------------------------------------------------------ setup

    def get_default_screen(self) -> Screen[Any]:
        return MainScreen(self.state.config.backend, self.state.profile.knobs)

    def on_ready(self) -> None:
        # Ready, not Mount: the main screen has composed its widgets by now.
        config = self.state.config
        self.sub_title = f"{self.state.profile.name} · {config.backend}"
        self._redraw()
        self.process.show_facts()
        if config.backend == "vllm":
            self.set_interval(LOG_POLL_S, self.process.poll)
        self.gateway.probe()
        if config.autostart:
            self.runs.start()

    def get_screen_main(self) -> MainScreen:
        for screen in self.screen_stack:
            if isinstance(screen, MainScreen):
                return screen
        raise RuntimeError("the main screen is not mounted")

    # ------------------------------------------------------------ redraws

    def on_session_changed(self, _message: SessionChanged) -> None:
        since = time.monotonic() - self._last_redraw
        if since >= 1.0 / MAX_REDRAWS_PER_S:
            self._redraw()
        elif not self._redraw_pending:
            # Draw the newest state a little later rather than every event: the loop stays free for input.
            self._redraw_pending = True
            self.set_timer(1.0 / MAX_REDRAWS_PER_S - since, self._deferred_redraw)

    def _deferred_redraw(self) -> None:
        self._redraw_pending = False
        self._redraw()

    def _redraw(self) -> None:
        self._last_redraw = time.monotonic()
        self.redraws += 1
        with contextlib.suppress(RuntimeError, NoMatches):
            self.get_screen_main().refresh_from(self.state.session)

    @on(TabbedContent.TabActivated)
    def _tab_shown(self) -> None:
        self._redraw()

    # ------------------------------------------------------------ messages from widgets and threads

    def server_state_from_thread(self, state: Any, detail: str) -> None:
        """A managed vLLM changed state: called on the process watcher's thread, so only post a message."""
        self.post_message(ServerStateChanged(str(state), detail))

    def on_server_state_changed(self, message: ServerStateChanged) -> None:
        self.process.server_state_changed(message.state, message.detail)

    def on_mode_chosen(self, message: ModeChosen) -> None:
        self.modes.switch(message.mode)

    # ------------------------------------------------------------ process view

    @on(Button.Pressed, "#process-buttons Button")
    def _process_button(self, event: Button.Pressed) -> None:
        action = event.button.id or ""
        knobs = None
        if action in ("start", "restart"):
            try:
                knobs = self.get_screen_main().query_one(KnobEditor).knobs(self.state.profile.knobs)
            except KnobsInvalid as exc:
                self.notify_error("Knobs not applied", exc, fix="Enter on the knob in the process tab (3) edits it")
                return
        self.process.action(action, knobs)

    # ------------------------------------------------------------ actions

    def action_run(self) -> None:
        self.runs.start()

    def action_stop(self) -> None:
        self.runs.stop()

    def action_tune(self) -> None:
        self.action_show_tab("tuner")
        if self.state.gateway is not None and self.state.gateway.online_tune:
            self.notify("The gateway tunes online; this tab shows its steps.", title="Tuner not started")
            return
        self.tuner.start()

    def action_compare(self) -> None:
        self.action_show_tab("modes")
        self.modes.compare()

    # Actions that act on the main screen only: on a dialog, the palette or help, their keys go to it.
    MAIN_SCREEN_ACTIONS = frozenset({"show_tab", "release_focus"})

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in self.MAIN_SCREEN_ACTIONS:
            return isinstance(self.screen, MainScreen)
        return True

    def action_release_focus(self) -> None:
        self.screen.set_focus(None)

    def action_show_tab(self, tab: str) -> None:
        if tab in TABS:
            with contextlib.suppress(RuntimeError, NoMatches):
                self.get_screen_main().query_one(TabbedContent).active = tab

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_factsheet(self) -> None:
        if self.state.last_job is None:
            self.notify_error(
                "No run to summarise yet",
                RuntimeError("the factsheet summarises a finished or stopped run, tune or compare"),
                fix="let the run finish, or press s to stop it, then press f",
            )
            return
        job, result = self.state.last_job
        self._factsheet_job(job, result, self.state.config.out or default_out_dir())

    @work(thread=True, group="factsheet", exclusive=True, exit_on_error=False, description="factsheet export")
    def _factsheet_job(self, job: JobName, result: Any, out_dir: Path) -> None:
        # A thread: building it probes the host (GPU, CPU, git) and writes files, all blocking calls.
        try:
            paths = export_factsheet(job, result, out_dir, self.state.config, self.state.profile)
        except OSError as exc:
            self.call_from_thread(
                self.notify_error, "Factsheet not written", exc, f"choose a writable folder with --out (was {out_dir})"
            )
            return
        except Exception as exc:
            self.call_from_thread(self.notify_error, "Factsheet not written", exc, None)
            return
        self.post_message(FactsheetWritten([str(path) for path in paths]))

    def on_factsheet_written(self, message: FactsheetWritten) -> None:
        json_path, markdown_path = (Path(p) for p in message.paths)
        self.state.last_export = (json_path, markdown_path)
        self.notify(f"{json_path}\n{markdown_path}", title="Factsheet written", timeout=10)

    async def action_quit(self) -> None:
        await self.shutdown()
        self.exit(ExitCode.OK)

    async def shutdown(self) -> None:
        """Stop the run and any server this console started, then let the app exit. Safe to call twice."""
        state = self.state
        if state.closed:
            return
        state.closed = True
        state.next_generation()  # late events of the stopped run are not drawn
        await self.runs.stop_task()
        backend = state.backend
        if backend is not None:
            if state.config.backend == "vllm":
                self.notify("Stopping vLLM…", title="Quit", timeout=BACKEND_CLOSE_TIMEOUT_S)
            try:
                # Before the load thread stops: an admission gateway serves on that thread's loop.
                await asyncio.wait_for(backend.close(), BACKEND_CLOSE_TIMEOUT_S)
            except Exception as exc:  # still exit; the process module's atexit hook is the last resort
                self.notify_error("Closing the backend failed", exc, None)
        state.load_thread.close()

    # ------------------------------------------------------------ feel

    def notify_error(self, title: str, exc: BaseException, fix: str | None = None) -> None:
        """An error as a toast: the cause (the exception's one line) and, when known, the fix."""
        text = str(exc) or type(exc).__name__
        if fix:
            text += f"\nFix: {fix}"
        self.notify(text, title=title, severity="error", timeout=15)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Run the workload", "Run the profile's workload (restarts a running one)", self.action_run)
        yield SystemCommand("Stop the run", "Stop the run; keep what it measured", self.action_stop)
        yield SystemCommand("Start the SLO-Tuner", "Hill-climb the knobs against the p99 SLO", self.action_tune)
        yield SystemCommand(
            "Export factsheet",
            "Write factsheet.json and factsheet.md of the last run, tune or compare",
            self.action_factsheet,
        )
        for tab in TABS:
            yield SystemCommand(f"Show {tab}", f"Switch to the {tab} tab", lambda tab=tab: self.action_show_tab(tab))
        yield SystemCommand("Help", "Key bindings and metric definitions", self.action_help)
        if self.state.config.backend == "vllm":
            yield SystemCommand(
                "Start vLLM", "Start vLLM with the edited knobs", lambda: self._process_button_by_id("start")
            )
            yield SystemCommand("Stop vLLM", "Stop the vLLM this console started", lambda: self.process.action("stop"))
            yield SystemCommand(
                "Restart vLLM", "Restart vLLM with the edited knobs", lambda: self._process_button_by_id("restart")
            )

    def _process_button_by_id(self, action: str) -> None:
        with contextlib.suppress(RuntimeError, NoMatches):
            self.get_screen_main().query_one(f"#process-buttons #{action}", Button).press()
