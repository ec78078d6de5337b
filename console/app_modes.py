"""The console's Modes tab: switching the scheduling mode (a simulator rerun, or the live gateway's policy
swap) and comparing the modes on the simulator (key c).

`ModesController` is owned by `SloConsoleApp` (console/app.py) and changes only the app's `ConsoleState`
(console/state.py): the profile's mode, the session's mode and compare rows, and the backend (a gateway put
in front of a running live server).
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from console.messages import SessionChanged
from core.events import Event
from core.job_registry import JOBS, JobContext
from core.profile import Profile, SchedulingMode, parse_scheduling_mode

if TYPE_CHECKING:
    from console.app import SloConsoleApp


class ModesController:
    """Scheduling-mode switching and comparison."""

    def __init__(self, app: SloConsoleApp) -> None:
        self.app = app
        self.state = app.state

    def switch(self, name: str) -> None:
        """Simulator: rerun in mode `name`. Live: the gateway in front of the server swaps its policy (it is
        put in front of the running server if there was none); the server is not restarted."""
        state = self.state
        previous = state.profile.mode
        mode = parse_scheduling_mode(name, "Modes tab")  # the tab lists only MODES: a bad name is a bug
        state.profile = state.profile.with_mode(mode)
        state.session.scheduling_mode = mode
        if state.rebuilds_backend:
            self.app.run_worker(
                self._rerun, group="run", exclusive=True, exit_on_error=False, description="rerun in another mode"
            )
            return
        from core.backends.factory import gateway_in_front
        from core.backends.gateway_backend import GatewayBackend

        if isinstance(state.backend, GatewayBackend):
            self._swap_gateway_mode(state.backend, name, previous)
            return
        if state.backend is not None:
            state.backend = gateway_in_front(state.backend, state.profile, mode)
            note = "the admission gateway goes in front of the running server from the next run"
        else:
            note = "the next run starts with it"
        self.app.post_message(SessionChanged())
        self.app.notify(f"{note}; the server keeps running.", title=f"Mode: {name}")

    def _swap_gateway_mode(self, backend: Any, name: str, previous: SchedulingMode) -> None:
        ui_loop = asyncio.get_running_loop()

        def done(exc: BaseException | None) -> None:  # runs on the gateway's loop: hop back without blocking
            ui_loop.call_soon_threadsafe(self._gateway_mode_swapped, name, previous, exc)

        backend.swap_mode(name, done)

    def _gateway_mode_swapped(self, name: str, previous: SchedulingMode, exc: BaseException | None) -> None:
        state = self.state
        if exc is not None:  # ProfileError (a mode this profile cannot build) or a closed gateway
            state.profile = state.profile.with_mode(previous)
            state.session.scheduling_mode = previous
            self.app.post_message(SessionChanged())
            self.app.notify_error(f"Mode {name} not switched", exc, None)
            return
        self.app.post_message(SessionChanged())
        note = "the gateway swapped its policy; held requests were offered to the new mode"
        self.app.notify(f"{note}; the server keeps running.", title=f"Mode: {name}")

    async def _rerun(self) -> None:
        await self.app.runs.stop_task()
        await self.app.runs.drop_backend()
        self.app.runs.start()

    # ------------------------------------------------------------ compare (key c)

    def compare(self) -> None:
        state = self.state
        state.session.compare_state = "running"
        self.app.post_message(SessionChanged())
        self.app.run_worker(
            partial(self._compare, state.profile),
            thread=True,
            group="compare",
            exclusive=True,
            exit_on_error=False,
            description="compare modes",
        )

    def _compare(self, profile: Profile) -> None:
        # A thread with its own event loop: the simulator runs flat out and must not stall the UI.
        config = self.state.config

        def sink(event: Event) -> None:
            self.app.call_from_thread(self._fold_compare_event, event)

        compare = JOBS["compare"]  # the registry's compare job (the batch runner's)
        try:
            result = asyncio.run(compare.run(JobContext(profile, config, sink)))
        except Exception as exc:
            self.app.call_from_thread(self._compare_failed, exc)
            return
        self.app.call_from_thread(self._compare_finished, result)
        sink(compare.summary(result))

    def _compare_finished(self, result: Any) -> None:
        self.state.last_job = ("compare", result)  # `f` exports the compare factsheet

    def _fold_compare_event(self, event: Event) -> None:
        self.state.session.apply(event, wall_s=time.monotonic())
        self.app.post_message(SessionChanged())

    def _compare_failed(self, exc: BaseException) -> None:
        self.state.session.compare_state = "failed"
        self.app.post_message(SessionChanged())
        self.app.notify_error("The compare job failed", exc, "`slo-console --batch --job compare` prints the same")
