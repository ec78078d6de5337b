"""The console's Modes tab: switching the scheduling mode (a simulator rerun, or the live gateway's policy
swap) and comparing the modes on the simulator (key c).

It is mixed into `SloConsoleApp` (console/app.py) and uses its session, profile, config and backend.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from textual import work

from console.messages import SessionChanged
from console.widgets.modes import ModeChosen
from core.events import Event
from core.job_registry import JOBS, JobContext
from core.profile import Profile


class ModeSwitchMixin:
    """Scheduling-mode switching and comparison of `SloConsoleApp`."""

    def on_mode_chosen(self, message: ModeChosen) -> None:
        self.switch_mode(message.mode)

    def switch_mode(self, name: str) -> None:
        """Simulator: rerun in mode `name`. Live: the gateway in front of the server swaps its policy (it is
        put in front of the running server if there was none); the server is not restarted."""
        previous = self.profile.mode
        self.profile = self.profile.model_copy(update={"mode": name})
        self.session.scheduling_mode = name
        if self.config.backend == "sim" or self.config.backend_factory is not None:
            self._rerun_in_mode()
            return
        from core.backends.gateway_backend import GatewayBackend

        if isinstance(self.backend, GatewayBackend):
            self._swap_gateway_mode(self.backend, name, previous)
            return
        if self.backend is not None:
            self.backend = GatewayBackend(self.backend, self.profile, name)  # type: ignore[assignment]
            note = "the admission gateway goes in front of the running server from the next run"
        else:
            note = "the next run starts with it"
        self.post_message(SessionChanged())
        self.notify(f"{note}; the server keeps running.", title=f"Mode: {name}")

    def _swap_gateway_mode(self, backend: Any, name: str, previous: str) -> None:
        ui_loop = asyncio.get_running_loop()

        def done(exc: BaseException | None) -> None:  # runs on the gateway's loop: hop back without blocking
            ui_loop.call_soon_threadsafe(self._gateway_mode_swapped, name, previous, exc)

        backend.swap_mode(name, done)

    def _gateway_mode_swapped(self, name: str, previous: str, exc: BaseException | None) -> None:
        if exc is not None:  # ProfileError (a mode this profile cannot build) or a closed gateway
            self.profile = self.profile.model_copy(update={"mode": previous})
            self.session.scheduling_mode = previous
            self.post_message(SessionChanged())
            self.notify_error(f"Mode {name} not switched", exc, None)
            return
        self.post_message(SessionChanged())
        note = "the gateway swapped its policy; held requests were offered to the new mode"
        self.notify(f"{note}; the server keeps running.", title=f"Mode: {name}")

    @work(group="run", exclusive=True, exit_on_error=False, description="rerun in another mode")
    async def _rerun_in_mode(self) -> None:
        await self._stop_run_task()
        if self.backend is not None:
            await self.backend.close()
            self.backend = None
        self.start_run()

    def action_compare(self) -> None:
        self.action_show_tab("modes")
        self.session.compare_state = "running"
        self.post_message(SessionChanged())
        self._compare_job(self.profile, self._generation)

    @work(thread=True, group="compare", exclusive=True, exit_on_error=False, description="compare modes")
    def _compare_job(self, profile: Profile, generation: int) -> None:
        # A thread with its own event loop: the simulator runs flat out and must not stall the UI.
        def sink(event: Event) -> None:
            self.call_from_thread(self._fold_compare_event, event)

        compare = JOBS["compare"]  # the registry's compare job (the batch runner's)
        try:
            result = asyncio.run(compare.run(JobContext(profile, self.config, sink)))
        except Exception as exc:
            self.call_from_thread(self._compare_failed, exc)
            return
        self.last_job = ("compare", result)  # `f` exports the compare factsheet
        sink(compare.summary(result))

    def _fold_compare_event(self, event: Event) -> None:
        self.session.apply(event, wall_s=time.monotonic())
        self.post_message(SessionChanged())

    def _compare_failed(self, exc: BaseException) -> None:
        self.session.compare_state = "failed"
        self.post_message(SessionChanged())
        self.notify_error("The compare job failed", exc, "`slo-console --batch --job compare` prints the same")
