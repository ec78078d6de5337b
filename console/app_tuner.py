"""The console's SLO-Tuner job (key t): runs the registry's tune job (core/job_registry.py) and reports the outcome.

`TunerController` is owned by `SloConsoleApp` (console/app.py) and changes only the app's `ConsoleState`
(console/state.py): the session's tuner state, and the managed vLLM it drives (built through the run
controller, so quitting stops it like any other).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from console.messages import SessionChanged
from console.widgets.format import knobs_text
from core.backend_api import BackendUnavailable
from core.job_registry import JOBS, JobContext
from core.profile import ProfileError

if TYPE_CHECKING:
    from console.app import SloConsoleApp


class TunerController:
    """The tuner job."""

    def __init__(self, app: SloConsoleApp) -> None:
        self.app = app
        self.state = app.state

    def start(self) -> None:
        self.app.run_worker(self._tune, group="tune", exclusive=True, exit_on_error=False, description="SLO-Tuner")

    async def _tune(self) -> None:
        app, state = self.app, self.state
        # One engine at a time: the tuner restarts the server per segment, so the workload run stops first.
        await app.runs.stop_task()
        sink = app.runs.new_job_sink()
        tune = state.session.tune
        tune.reset()
        tune.active = True
        tune.started_wall_s = time.monotonic()
        app.post_message(SessionChanged())
        # The tuner drives the vLLM this console manages; elsewhere it builds its own backends per segment.
        backend = app.runs.backend() if state.config.backend == "vllm" else None
        live = state.live
        # The registry's tune job (the batch runner's); no journal: the console keeps the result itself.
        ctx = JobContext(
            state.profile,
            state.config,
            app.runs.from_load_thread(sink) if live else sink,
            backend=backend,
            tuner_spec=state.config.tuner_spec,
        )

        def job() -> Any:
            return JOBS["tune"].run(ctx)

        try:
            result = await (state.load_thread.run(job) if live else job())
            state.last_job = ("tune", result)  # `f` exports the tuned configuration's factsheet
        except (ProfileError, BackendUnavailable) as exc:
            app.notify_error("The tuner could not run", exc)
        except Exception as exc:
            app.notify_error("The tuner failed", exc, fix="see the cause above; `--batch --job tune` prints the same")
        finally:
            tune.active = False
            app.post_message(SessionChanged())
        if tune.finished and tune.summary is not None:
            gain = tune.summary.get("goodput_gain_x")
            app.notify(
                f"{tune.segments_used} segments; best {knobs_text((tune.best or {}).get('knobs'))}"
                + (f"; goodput ×{gain:.2f} over the baseline" if isinstance(gain, int | float) else ""),
                title="Tuning finished",
            )
