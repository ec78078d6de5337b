"""The console's SLO-Tuner job (key t): runs `core.tune.job.run_tune` and reports the outcome.

`TunerController` is owned by `SloConsoleApp` (console/app.py) and changes only the app's `ConsoleState`
(console/state.py): the session's tuner state, and the managed vLLM it drives (built through the run
controller, so quitting stops it like any other).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from console.messages import SessionChanged
from console.widgets.format import knobs_text
from core.backends.base import BackendUnavailable
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
        try:
            from core.tune.job import run_tune
        except ImportError as exc:
            app.notify_error(
                "The SLO-Tuner is not in this build",
                exc,
                fix="update slo-console; until then `r` measures one configuration at a time",
            )
            return
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
        profile, config, live = state.profile, state.config, state.live
        tune_sink = app.runs.from_load_thread(sink) if live else sink

        def job() -> Any:
            return run_tune(
                profile,
                backend_kind=config.backend,
                sink=tune_sink,
                seed=config.seed,
                backend=backend,
                spec=config.tuner_spec,
            )

        try:
            await (state.load_thread.run(job) if live else job())
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
