"""The console's workload run (keys r and s): builds the backend, runs the profile's workload in a worker,
folds its events into the session, and stops it keeping what it measured.

`RunController` is owned by `SloConsoleApp` (console/app.py); it reads and changes only the app's declared
`ConsoleState` (console/state.py). The other jobs (tuner, process tab, mode switch) stop a run and share the
backend through it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from console.messages import SessionChanged
from console.session import finite
from console.widgets.format import slo_verdict_text
from core.backend_api import Backend, BackendUnavailable
from core.compare import speculation_of
from core.events import Event
from core.job_registry import JOBS, JobContext
from core.jobs import summary_event
from core.profile import KnobsSpec, ProfileError

if TYPE_CHECKING:
    from console.app import SloConsoleApp

EventSink = Callable[[Event], None]


class RunController:
    """Runs and stops the workload; owns the backend's life cycle (built once, closed on quit)."""

    def __init__(self, app: SloConsoleApp) -> None:
        self.app = app
        self.state = app.state

    # ------------------------------------------------------------ the backend

    def make_backend(self) -> Backend:
        """The backend the operator asked for, built by `make_backend` (the batch runner's builder too), or
        the one a test injected."""
        config = self.state.config
        if config.backend_factory is not None:
            return config.backend_factory(self.state.profile)
        from core.backends.factory import make_backend

        return make_backend(
            config.backend,  # type: ignore[arg-type]
            self.state.profile,
            seed=config.seed,
            url=config.url,
            speed=config.speed,
            on_server_state=self.app.server_state_from_thread,
            on_advice=lambda text: self.app.notify(text, title="Your server", severity="warning", timeout=20),
        )

    def backend(self) -> Backend:
        """The shared backend, built on first use."""
        if self.state.backend is None:
            self.state.backend = self.make_backend()
        return self.state.backend

    async def drop_backend(self) -> None:
        """Close the backend so the next run builds a new one (new knobs, another mode)."""
        backend, self.state.backend = self.state.backend, None
        if backend is not None:
            await backend.close()

    async def apply_knobs(self, knobs: KnobsSpec) -> None:
        """New knobs for the next run: the simulator is rebuilt; a managed vLLM restarts with them."""
        state = self.state
        state.profile = state.profile.model_copy(update={"knobs": knobs})
        state.session.knobs = knobs.model_dump()
        if state.rebuilds_backend:
            await self.drop_backend()
            return
        restart = getattr(state.backend, "restart", None)
        if state.config.backend == "vllm" and restart is not None:
            await restart(knobs)

    # ------------------------------------------------------------ the event stream

    def sink_for(self, generation: int) -> EventSink:
        """Fold events into the session while `generation` is current; drop a superseded job's events."""
        state = self.state

        def sink(event: Event) -> None:
            if generation != state.generation:
                return
            state.session.apply(event, wall_s=time.monotonic())
            self.app.post_message(SessionChanged())

        return sink

    def new_job_sink(self) -> EventSink:
        """A sink for a job that starts now (the previous job's late events are dropped from here on)."""
        return self.sink_for(self.state.next_generation())

    @staticmethod
    def from_load_thread(sink: EventSink) -> EventSink:
        """A sink the load thread can call: the event is folded on the UI loop, without waiting for it."""
        ui_loop = asyncio.get_running_loop()
        return lambda event: ui_loop.call_soon_threadsafe(sink, event)

    # ------------------------------------------------------------ running

    def start(self, knobs: KnobsSpec | None = None) -> None:
        """Run the workload (a running one stops first), with `knobs` applied first when given."""
        self.app.run_worker(
            partial(self._run, knobs), group="run", exclusive=True, exit_on_error=False, description="run the workload"
        )

    async def _run(self, knobs: KnobsSpec | None) -> None:
        state = self.state
        await self.stop_task()
        sink = self.new_job_sink()
        try:
            if knobs is not None:
                await self.apply_knobs(knobs)
            backend = self.backend()
            state.session.reset_run()
            state.session.knobs = state.profile.knobs.model_dump()
            state.session.run_state = "starting"
            self.app.process.show_facts()
            config, profile = state.config, state.profile
            # The registry's run job (the batch runner's) on the backend this console holds.
            run = JOBS["run"].run
            ctx = JobContext(
                profile,
                config,
                self.from_load_thread(sink) if state.live else sink,
                backend=backend,
                progress_every=config.progress_every,
            )
            if state.live:
                state.run_task = asyncio.ensure_future(state.load_thread.run(lambda: run(ctx)))
            else:
                state.run_task = asyncio.ensure_future(run(ctx))
            result = await state.run_task
        except asyncio.CancelledError:
            state.session.run_state = "stopped"
            self.app.post_message(SessionChanged())
            raise
        except (ProfileError, BackendUnavailable) as exc:
            self._fail("The run could not start", exc)
            return
        except Exception as exc:  # a bug or an unexpected backend error: show it, keep the console alive
            self._fail("The run failed", exc, fix="see the cause above; `slo-console --batch` prints the same")
            return
        finally:
            state.run_task = None
        state.last_result = result
        state.last_job = ("run", result)  # `f` exports this run's factsheet
        state.session.speculation = speculation_of(backend, profile.knobs)
        sink(summary_event(result))
        if result.interrupted:
            self.app.notify("Stopped: the tiles show the requests finished before the stop.", title="Run stopped")
        else:
            summary = result.summary
            p99 = finite(summary.p99_s)
            verdict = slo_verdict_text(p99, state.session.slo_e2e_s)
            if p99 is None:
                said = "No request completed in the measured window: nothing to judge against the SLO."
            else:
                slo = f" (SLO {verdict[0]}: {verdict[1]} {state.session.slo_e2e_s:.2f} s)" if verdict else ""
                said = (
                    f"p99 {p99:.3f} s{slo}, goodput {summary.goodput_rps:.2f} req/s over {summary.requests} requests."
                )
            self.app.notify(f"{said} Press f to export a factsheet.", title="Run finished")
            # What the batch prints on stderr besides the verdict (failed requests and their cause, nothing
            # measured): the same report, so the console and `--batch` cannot tell a user different things.
            for warning in JOBS["run"].report(result, ctx).warnings:
                self.app.notify(warning, title="About this run", severity="warning", timeout=30)

    def _fail(self, title: str, exc: BaseException, fix: str | None = None) -> None:
        self.state.session.run_state = "failed"
        self.app.post_message(SessionChanged())
        self.app.notify_error(title, exc, fix)

    def stop(self) -> None:
        """Key s: stop the run in flight; say so when nothing runs."""
        task = self.state.run_task
        if task is None or task.done():
            self.app.notify("Nothing is running. Press r to run the workload.", title="Stop")
            return
        task.cancel()

    async def stop_task(self) -> None:
        """Stop the run in flight and wait for it; the backend returns what it measured (the simulator keeps
        its records)."""
        task = self.state.run_task
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
