"""The console's process tab: the managed vLLM's state, command line and log tail, and its lifecycle
actions (start, stop, restart). The tab's buttons are wired in console/app.py (Textual's `@on` handlers
must be on the app class itself).

It is mixed into `SloConsoleApp` (console/app.py) and uses its session, profile, config and backend.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from textual import work
from textual.css.query import NoMatches

from console.messages import ServerStateChanged
from console.widgets.format import knobs_text
from console.widgets.process import ProcessView
from core.backend_api import BackendUnavailable
from core.profile import KnobsSpec, ProfileError


class ProcessTabMixin:
    """The process tab of `SloConsoleApp`."""

    def _show_process_facts(self) -> None:
        with contextlib.suppress(RuntimeError, NoMatches):
            view = self.get_screen_main().query_one(ProcessView)
            if self.config.backend == "sim":
                calibration = self.session.backend_facts.get("calibration") or self.profile.engine.calibration
                view.show_command(
                    "embedded simulator (no process to manage)\n"
                    f"calibration: {calibration}\n"
                    f"knobs: {knobs_text(self.profile.knobs.model_dump(), short=False)}\n"
                    "A knob edit restarts the simulated run with the new knobs."
                )
                view.show_state(self.session.run_state, "embedded simulator")
            else:
                self._poll_process()

    def _server_state_from_thread(self, state: Any, detail: str) -> None:
        # Called on the process watcher's thread: post_message is the thread-safe way into the app.
        self.post_message(ServerStateChanged(str(state), detail))

    def on_server_state_changed(self, message: ServerStateChanged) -> None:
        with contextlib.suppress(RuntimeError, NoMatches):
            self.get_screen_main().query_one(ProcessView).show_state(message.state, message.detail)
        if message.state == "crashed":
            self.notify(
                f"vLLM exited: {message.detail or 'no detail'}. Fix: read the log tail in the process tab (3), "
                "adjust the knobs, then Restart.",
                title="vLLM crashed",
                severity="error",
                timeout=15,
            )
        self._poll_process()

    @work(group="process-poll", exclusive=True, exit_on_error=False)
    async def _poll_process(self) -> None:
        server = getattr(self.backend, "server", None)
        process = getattr(server, "process", None)
        if process is None:
            with contextlib.suppress(RuntimeError, NoMatches):
                view = self.get_screen_main().query_one(ProcessView)
                view.show_state("stopped", "not started")
                view.show_command(f"vLLM will start with: {knobs_text(self.profile.knobs.model_dump(), short=False)}")
            return
        lines = await asyncio.to_thread(process.log_tail)
        with contextlib.suppress(RuntimeError, NoMatches):
            view = self.get_screen_main().query_one(ProcessView)
            view.show_state(str(process.state), process.state_detail)
            view.show_command(" ".join(process.argv) + (f"\nlog: {process.log_path}" if process.log_path else ""))
            view.show_log(lines)

    @work(group="process", exclusive=True, exit_on_error=False, description="vLLM lifecycle")
    async def _process_action(self, action: str, knobs: KnobsSpec | None = None) -> None:
        if self.backend is None:
            self.backend = self._make_backend()
        try:
            if action == "stop":
                await self._stop_run_task()
                await self.backend.close()
            elif action == "start":
                await self.backend.start(knobs)  # type: ignore[attr-defined]
            elif action == "restart":
                await self._stop_run_task()
                if knobs is not None:
                    self.profile = self.profile.model_copy(update={"knobs": knobs})
                    self.session.knobs = knobs.model_dump()
                await self.backend.restart(knobs)  # type: ignore[attr-defined]
        except (ProfileError, BackendUnavailable) as exc:
            self.notify_error(f"vLLM {action} failed", exc)
        self._poll_process()
