"""The console's process tab: the managed vLLM's state, command line and log tail, and its lifecycle
actions (start, stop, restart). The tab's buttons are wired in console/app.py (Textual's `@on` handlers
must be on a DOM node).

`ProcessController` is owned by `SloConsoleApp` (console/app.py) and changes only the app's `ConsoleState`
(console/state.py): the profile's knobs on a restart, and the backend it starts and stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from functools import partial
from typing import TYPE_CHECKING

from textual.css.query import NoMatches

from console.widgets.format import knobs_text
from console.widgets.process import ProcessView
from core.backend_api import BackendUnavailable
from core.profile import KnobsSpec, ProfileError

if TYPE_CHECKING:
    from console.app import SloConsoleApp


class ProcessController:
    """What the process tab shows and the managed server's start, stop and restart."""

    def __init__(self, app: SloConsoleApp) -> None:
        self.app = app
        self.state = app.state

    def _view(self) -> ProcessView:
        return self.app.get_screen_main().query_one(ProcessView)

    def show_facts(self) -> None:
        state = self.state
        with contextlib.suppress(RuntimeError, NoMatches):
            self._view().show_knobs(state.profile.knobs.model_dump())
        if state.live:
            self.poll()
            return
        with contextlib.suppress(RuntimeError, NoMatches):
            view = self._view()
            calibration = state.session.backend_facts.get("calibration") or state.profile.engine.calibration
            view.show_command(
                "embedded simulator (no process to manage)\n"
                f"calibration: {calibration}\n"
                f"knobs: {knobs_text(state.profile.knobs.model_dump(), short=False)}\n"
                "A knob edit restarts the simulated run with the new knobs."
            )
            view.show_state(state.session.run_state, "embedded simulator")

    def server_state_changed(self, state: str, detail: str) -> None:
        with contextlib.suppress(RuntimeError, NoMatches):
            self._view().show_state(state, detail)
        if state == "crashed":
            self.app.notify(
                f"vLLM exited: {detail or 'no detail'}. Fix: read the log tail in the process tab (3), "
                "adjust the knobs, then Restart.",
                title="vLLM crashed",
                severity="error",
                timeout=15,
            )
        self.poll()

    def poll(self) -> None:
        """Re-read the managed server's state, command line and log tail (off the UI loop)."""
        self.app.run_worker(self._poll, group="process-poll", exclusive=True, exit_on_error=False)

    async def _poll(self) -> None:
        server = getattr(self.state.backend, "server", None)
        process = getattr(server, "process", None)
        gateway = self.state.gateway
        if process is None and gateway is not None:
            with contextlib.suppress(RuntimeError, NoMatches):
                view = self._view()
                view.show_state("ready", f"a {gateway.describe()} fronts the server")
                restart = "swaps the server" if gateway.replica_swap else "cannot swap the server (no --launch)"
                view.show_command(
                    f"A {gateway.describe()} fronts the server.\n"
                    f"knobs in force: {knobs_text(self.state.session.knobs, short=False)}\n"
                    f"'Restart with these knobs' asks the gateway for a replica swap: it {restart}."
                )
            return
        if process is None:
            with contextlib.suppress(RuntimeError, NoMatches):
                view = self._view()
                view.show_state("stopped", "not started")
                knobs = knobs_text(self.state.profile.knobs.model_dump(), short=False)
                view.show_command(f"vLLM will start with: {knobs}")
            return
        lines = await asyncio.to_thread(process.log_tail)
        with contextlib.suppress(RuntimeError, NoMatches):
            view = self._view()
            view.show_state(str(process.state), process.state_detail)
            view.show_command(" ".join(process.argv) + (f"\nlog: {process.log_path}" if process.log_path else ""))
            view.show_log(lines)

    def action(self, action: str, knobs: KnobsSpec | None = None) -> None:
        """A lifecycle button: start, stop or restart (restart and start with the edited knobs). Behind an
        admission gateway a restart is the gateway's replica swap (console/app_gateway.py)."""
        if self.state.gateway is not None and action == "restart" and knobs is not None:
            self.app.gateway.swap(knobs)
            return
        if not self.state.live:
            if action == "restart":
                self.app.runs.start(knobs)
            elif action == "stop":
                self.app.runs.stop()
            return
        self.app.run_worker(
            partial(self._server_action, action, knobs),
            group="process",
            exclusive=True,
            exit_on_error=False,
            description="vLLM lifecycle",
        )

    async def _server_action(self, action: str, knobs: KnobsSpec | None) -> None:
        state, runs = self.state, self.app.runs
        backend = runs.backend()
        try:
            if action == "stop":
                await runs.stop_task()
                await backend.close()
            elif action == "start":
                await backend.start(knobs)  # type: ignore[attr-defined]
            elif action == "restart":
                await runs.stop_task()
                if knobs is not None:
                    state.profile = state.profile.model_copy(update={"knobs": knobs})
                    state.session.knobs = knobs.model_dump()
                await backend.restart(knobs)  # type: ignore[attr-defined]
        except (ProfileError, BackendUnavailable) as exc:
            self.app.notify_error(f"vLLM {action} failed", exc)
        self.show_facts()
