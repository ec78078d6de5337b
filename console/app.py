"""The operator console: a Textual app over the same event stream the batch runner prints.

`create_app(...)` (console/launch.py) is the one factory the CLI (`run_app`) and the tests use. Jobs run in
Textual workers on the app's event loop: the simulator yields between slices of virtual time and the live
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

from console.app_modes import ModeSwitchMixin
from console.app_process import ProcessTabMixin
from console.app_tuner import TunerJobMixin
from console.export import default_out_dir, export_factsheet
from console.messages import FactsheetWritten, SessionChanged
from console.screens.help import HelpScreen
from console.screens.main import TABS, MainScreen
from console.session import Session
from console.widgets.process import KnobEditor, KnobsInvalid
from core.backend_api import Backend, BackendUnavailable
from core.backends.load_thread import LoadThread
from core.events import Event
from core.exit_codes import ExitCode
from core.job_registry import JOBS, JobContext
from core.jobs import RunResult, summary_event
from core.jobs.options import JobName, OperatorOptions
from core.profile import KnobsSpec, Profile, ProfileError, TunerSpec

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


class SloConsoleApp(TunerJobMixin, ProcessTabMixin, ModeSwitchMixin, App[int]):
    """slo-console's operator console."""

    TITLE = "slo-console"
    CSS_PATH = "app.tcss"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "run", "Run"),
        Binding("s", "stop", "Stop"),
        Binding("t", "tune", "Tune"),
        Binding("f", "factsheet", "Factsheet"),
        Binding("1", "show_tab('monitor')", "Monitor"),
        Binding("2", "show_tab('tuner')", "Tuner"),
        Binding("3", "show_tab('process')", "Process"),
        Binding("4", "show_tab('modes')", "Modes"),
        Binding("c", "compare", "Compare modes"),
        Binding("question_mark,f1", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        # ctrl+q quits from anywhere, even from a focused input that takes the plain q.
        Binding("ctrl+q", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(self, config: ConsoleConfig) -> None:
        super().__init__()
        self.config = config
        self.profile = config.load_profile()  # open_console loaded it in its mode: returned as it is
        slo = self.profile.slo
        self.session = Session(
            profile_name=self.profile.name,
            backend_kind=config.backend,
            slo_e2e_s=slo.e2e_s if slo else None,
            slo_ttft_s=slo.ttft_s if slo else None,
            slo_tpot_s=slo.tpot_s if slo else None,
            knobs=self.profile.knobs.model_dump(),
            speed=config.speed,
            scheduling_mode=self.profile.mode,
        )
        self.backend: Backend | None = None
        self.last_result: RunResult | None = None
        # The last finished job and its result (a RunResult, TuneResult or CompareResult): what `f` exports.
        self.last_job: tuple[JobName, Any] | None = None
        self.last_export: tuple[Path, Path] | None = None
        self.redraws = 0  # counted so a test can see that a burst of events coalesces
        self._run_task: asyncio.Task[RunResult] | None = None
        self._generation = 0  # events of a superseded run are dropped, never mixed into the new one
        self._last_redraw = 0.0
        self._redraw_pending = False
        self._closed = False
        # Live runs generate load and stamp chunks on a loop of their own, never on this UI loop.
        self.load_thread = LoadThread()

    # ------------------------------------------------------------ setup

    def get_default_screen(self) -> Screen[Any]:
        return MainScreen(self.config.backend, self.profile.knobs)

    def on_ready(self) -> None:
        # Ready, not Mount: the main screen has composed its widgets by now.
        self.sub_title = f"{self.profile.name} · {self.config.backend}"
        self._redraw()
        self._show_process_facts()
        if self.config.backend == "vllm":
            self.set_interval(LOG_POLL_S, self._poll_process)
        if self.config.autostart:
            self.start_run()

    def get_screen_main(self) -> MainScreen:
        for screen in self.screen_stack:
            if isinstance(screen, MainScreen):
                return screen
        raise RuntimeError("the main screen is not mounted")

    def _make_backend(self) -> Backend:
        if self.config.backend_factory is not None:
            return self.config.backend_factory(self.profile)
        if self.config.backend == "vllm":
            from core.backends.vllm import VllmBackend

            server = VllmBackend.from_profile(self.profile, on_state=self._server_state_from_thread)
            if self.profile.mode == "fcfs":
                return server
            from core.backends.gateway_backend import GatewayBackend

            return GatewayBackend(server, self.profile, self.profile.mode)  # type: ignore[return-value]
        from core.backends.factory import make_backend

        return make_backend(
            self.config.backend,  # type: ignore[arg-type]
            self.profile,
            seed=self.config.seed,
            url=self.config.url,
            speed=self.config.speed,
        )

    # ------------------------------------------------------------ the event stream

    def _sink_for(self, generation: int) -> Callable[[Event], None]:
        def sink(event: Event) -> None:
            if generation != self._generation:
                return
            self.session.apply(event, wall_s=time.monotonic())
            self.post_message(SessionChanged())

        return sink

    def _from_load_thread(self, sink: Callable[[Event], None]) -> Callable[[Event], None]:
        """A sink the load thread can call: the event is folded on the UI loop, without waiting for it."""
        ui_loop = asyncio.get_running_loop()
        return lambda event: ui_loop.call_soon_threadsafe(sink, event)

    def _live(self) -> bool:
        return self.config.backend != "sim"

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
            self.get_screen_main().refresh_from(self.session)

    @on(TabbedContent.TabActivated)
    def _tab_shown(self) -> None:
        self._redraw()

    # ------------------------------------------------------------ running the workload

    def start_run(self, knobs: KnobsSpec | None = None) -> None:
        self._run_job(knobs)

    @work(group="run", exclusive=True, exit_on_error=False, description="run the workload")
    async def _run_job(self, knobs: KnobsSpec | None = None) -> None:
        await self._stop_run_task()
        self._generation += 1
        sink = self._sink_for(self._generation)
        try:
            if knobs is not None:
                await self._apply_knobs(knobs)
            if self.backend is None:
                self.backend = self._make_backend()
            self.session.reset_run()
            self.session.knobs = self.profile.knobs.model_dump()
            self.session.run_state = "starting"
            self._show_process_facts()
            # The registry's run job (the batch runner's) on the backend this console holds.
            run = JOBS["run"].run
            progress = self.config.progress_every
            if self._live():
                ctx = JobContext(self.profile, self.config, self._from_load_thread(sink), backend=self.backend)
                ctx.progress_every = progress
                self._run_task = asyncio.ensure_future(self.load_thread.run(lambda: run(ctx)))
            else:
                ctx = JobContext(self.profile, self.config, sink, backend=self.backend, progress_every=progress)
                self._run_task = asyncio.ensure_future(run(ctx))
            result = await self._run_task
        except asyncio.CancelledError:
            self.session.run_state = "stopped"
            self.post_message(SessionChanged())
            raise
        except (ProfileError, BackendUnavailable) as exc:
            self._fail_run("The run could not start", exc)
            return
        except Exception as exc:  # a bug or an unexpected backend error: show it, keep the console alive
            self._fail_run("The run failed", exc, fix="see the cause above; `slo-console --batch` prints the same")
            return
        finally:
            self._run_task = None
        self.last_result = result
        self.last_job = ("run", result)
        sink(summary_event(result))
        if result.interrupted:
            self.notify("Stopped: the tiles show the requests finished before the stop.", title="Run stopped")
        else:
            summary = result.summary
            self.notify(
                f"p99 {summary.p99_s:.3f} s, goodput {summary.goodput_rps:.2f} req/s over {summary.requests} "
                "requests. Press f to export a factsheet.",
                title="Run finished",
            )

    def _fail_run(self, title: str, exc: BaseException, fix: str | None = None) -> None:
        self.session.run_state = "failed"
        self.post_message(SessionChanged())
        self.notify_error(title, exc, fix)

    async def _stop_run_task(self) -> None:
        """Stop the run in flight; the backend returns what it measured (the simulator keeps its records)."""
        task = self._run_task
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def _apply_knobs(self, knobs: KnobsSpec) -> None:
        """New knobs for the next run: the simulator is rebuilt; a managed vLLM restarts with them."""
        self.profile = self.profile.model_copy(update={"knobs": knobs})
        self.session.knobs = knobs.model_dump()
        if self.config.backend == "vllm" and self.backend is not None and self.config.backend_factory is None:
            restart = getattr(self.backend, "restart", None)
            if restart is not None:
                await restart(knobs)
                return
        if self.config.backend in ("sim",) or self.config.backend_factory is not None:
            if self.backend is not None:
                await self.backend.close()
            self.backend = None

    # ------------------------------------------------------------ process view

    @on(Button.Pressed, "#process-buttons Button")
    def _process_button(self, event: Button.Pressed) -> None:
        action = event.button.id or ""
        knobs = None
        if action in ("start", "restart"):
            try:
                knobs = self.get_screen_main().query_one(KnobEditor).knobs(self.profile.knobs)
            except KnobsInvalid as exc:
                self.notify_error("Knobs not applied", exc)
                return
        if self.config.backend == "sim":
            if action == "restart":
                self.start_run(knobs)
            elif action == "stop":
                self.action_stop()
            return
        self._process_action(action, knobs)

    # ------------------------------------------------------------ actions

    def action_run(self) -> None:
        self.start_run()

    def action_stop(self) -> None:
        task = self._run_task
        if task is None or task.done():
            self.notify("Nothing is running. Press r to run the workload.", title="Stop")
            return
        task.cancel()

    def action_tune(self) -> None:
        self.action_show_tab("tuner")
        self._tune_job()

    def action_show_tab(self, tab: str) -> None:
        if tab in TABS:
            with contextlib.suppress(RuntimeError, NoMatches):
                self.get_screen_main().query_one(TabbedContent).active = tab

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_factsheet(self) -> None:
        if self.last_job is None:
            self.notify_error(
                "No run to summarise yet",
                RuntimeError("the factsheet summarises a finished or stopped run, tune or compare"),
                fix="let the run finish, or press s to stop it, then press f",
            )
            return
        job, result = self.last_job
        self._factsheet_job(job, result, self.config.out or default_out_dir())

    @work(thread=True, group="factsheet", exclusive=True, exit_on_error=False, description="factsheet export")
    def _factsheet_job(self, job: JobName, result: Any, out_dir: Path) -> None:
        # A thread: building it probes the host (GPU, CPU, git) and writes files, all blocking calls.
        try:
            paths = export_factsheet(job, result, out_dir, self.config, self.profile)
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
        self.last_export = (json_path, markdown_path)
        self.notify(f"{json_path}\n{markdown_path}", title="Factsheet written", timeout=10)

    async def action_quit(self) -> None:
        await self.shutdown()
        self.exit(ExitCode.OK)

    async def shutdown(self) -> None:
        """Stop the run and any server this console started, then let the app exit. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._generation += 1  # late events of the stopped run are not drawn
        await self._stop_run_task()
        backend = self.backend
        if backend is not None:
            if self.config.backend == "vllm":
                self.notify("Stopping vLLM…", title="Quit", timeout=BACKEND_CLOSE_TIMEOUT_S)
            try:
                # Before the load thread stops: an admission gateway serves on that thread's loop.
                await asyncio.wait_for(backend.close(), BACKEND_CLOSE_TIMEOUT_S)
            except Exception as exc:  # still exit; the process module's atexit hook is the last resort
                self.notify_error("Closing the backend failed", exc, None)
        self.load_thread.close()

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
            "Export factsheet", "Write factsheet.json and factsheet.md of the last run", self.action_factsheet
        )
        for tab in TABS:
            yield SystemCommand(f"Show {tab}", f"Switch to the {tab} tab", lambda tab=tab: self.action_show_tab(tab))
        yield SystemCommand("Help", "Key bindings and metric definitions", self.action_help)
        if self.config.backend == "vllm":
            yield SystemCommand(
                "Start vLLM", "Start vLLM with the edited knobs", lambda: self._process_button_by_id("start")
            )
            yield SystemCommand("Stop vLLM", "Stop the vLLM this console started", lambda: self._process_action("stop"))
            yield SystemCommand(
                "Restart vLLM", "Restart vLLM with the edited knobs", lambda: self._process_button_by_id("restart")
            )

    def _process_button_by_id(self, action: str) -> None:
        with contextlib.suppress(RuntimeError, NoMatches):
            self.get_screen_main().query_one(f"#process-buttons #{action}", Button).press()
