"""The console's SLO-Tuner job (key t): runs `core.tune.job.run_tune` and reports the outcome.

It is mixed into `SloConsoleApp` (console/app.py) and uses its session, profile, config and backend.
"""

from __future__ import annotations

import time
from typing import Any

from textual import work

from console.messages import SessionChanged
from console.widgets.format import knobs_text
from core.backend_api import BackendUnavailable
from core.job_registry import JOBS, JobContext
from core.profile import ProfileError


class TunerJobMixin:
    """The tuner job of `SloConsoleApp`."""

    @work(group="tune", exclusive=True, exit_on_error=False, description="SLO-Tuner")
    async def _tune_job(self) -> None:
        # One engine at a time: the tuner restarts the server per segment, so the workload run stops first.
        await self._stop_run_task()
        self._generation += 1
        sink = self._sink_for(self._generation)
        self.session.tune.reset()
        self.session.tune.active = True
        self.session.tune.started_wall_s = time.monotonic()
        self.post_message(SessionChanged())
        backend = None
        if self.config.backend == "vllm":
            # The tuner drives the vLLM this console manages, so quitting stops it like any other.
            if self.backend is None:
                self.backend = self._make_backend()
            backend = self.backend
        live = self._live()
        # The registry's tune job (the batch runner's); no journal: the console keeps the result itself.
        ctx = JobContext(
            self.profile,
            self.config,
            self._from_load_thread(sink) if live else sink,
            backend=backend,
            tuner_spec=self.config.tuner_spec,
        )

        def tune() -> Any:
            return JOBS["tune"].run(ctx)

        try:
            result = await (self.load_thread.run(tune) if live else tune())
            self.last_job = ("tune", result)  # `f` exports the tuned configuration's factsheet
        except (ProfileError, BackendUnavailable) as exc:
            self.notify_error("The tuner could not run", exc)
        except Exception as exc:
            self.notify_error("The tuner failed", exc, fix="see the cause above; `--batch --job tune` prints the same")
        finally:
            self.session.tune.active = False
            self.post_message(SessionChanged())
        tune = self.session.tune
        if tune.finished and tune.summary is not None:
            gain = tune.summary.get("goodput_gain_x")
            self.notify(
                f"{tune.segments_used} segments; best {knobs_text((tune.best or {}).get('knobs'))}"
                + (f"; goodput ×{gain:.2f} over the baseline" if isinstance(gain, int | float) else ""),
                title="Tuning finished",
            )
