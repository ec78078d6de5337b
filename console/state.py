"""What the console's parts share, declared in one place.

`SloConsoleApp` (console/app.py) owns one `ConsoleState`; the controllers that run its jobs (console/app_run.py,
app_modes.py, app_process.py, app_tuner.py) read and change it, and only this. Anything a job needs from
another job (the backend it built, the run in flight, the profile a knob edit or a mode switch replaced) is a
field here, so a reader sees every piece of shared state and who may change it without reading four classes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from console.session import Session
from core.backend_api import Backend
from core.backends.load_thread import LoadThread
from core.jobs import RunResult
from core.jobs.options import JobName
from core.profile import Profile

if TYPE_CHECKING:
    from console.app import ConsoleConfig
    from console.app_gateway import GatewayFacts


@dataclass
class ConsoleState:
    """The console's shared, mutable state. Changed only on the UI loop (workers hop back before they write)."""

    config: ConsoleConfig  # what the operator asked for; never changed
    # The profile the next run uses: a knob edit (Process tab) or a mode switch (Modes tab) replaces it.
    profile: Profile
    # The event stream folded for the panels (console/session.py); every job's events land here.
    session: Session
    # Live runs generate load and stamp chunks on a loop of their own, never on the UI loop.
    load_thread: LoadThread = field(default_factory=LoadThread)
    # The backend runs, the tuner and the process tab share: built once (make_backend), closed on quit or
    # when a knob edit or mode switch needs a new one.
    backend: Backend | None = None
    run_task: asyncio.Task[RunResult] | None = None  # the workload run in flight, if any
    # Bumped whenever a job starts or the console closes: events of a superseded job are dropped, never
    # mixed into the new one's picture.
    generation: int = 0
    last_result: RunResult | None = None  # the last finished or stopped run
    # The last finished job and its result (a RunResult, TuneResult or CompareResult): what `f` exports.
    last_job: tuple[JobName, Any] | None = None
    last_export: tuple[Path, Path] | None = None  # factsheet.json and .md of the last export
    closed: bool = False  # the console shut down its run and backend (quit)
    # --backend url pointed at an admission gateway (console/app_gateway.py): what it said it can do.
    gateway: GatewayFacts | None = None

    @classmethod
    def from_config(cls, config: ConsoleConfig) -> ConsoleState:
        profile = config.load_profile()  # open_console loaded it in its mode: returned as it is
        slo = profile.slo
        session = Session(
            profile_name=profile.name,
            backend_kind=config.backend,
            slo_e2e_s=slo.e2e_s if slo else None,
            slo_ttft_s=slo.ttft_s if slo else None,
            slo_tpot_s=slo.tpot_s if slo else None,
            knobs=profile.knobs.model_dump(),
            speed=config.speed,
            scheduling_mode=profile.mode,
        )
        return cls(config=config, profile=profile, session=session)

    @property
    def live(self) -> bool:
        """A real server (managed vLLM or a URL) rather than the embedded simulator."""
        return self.config.backend != "sim"

    @property
    def rebuilds_backend(self) -> bool:
        """Knob edits and mode switches build a new backend (the simulator, or one a test injected) rather
        than restarting a server or swapping a gateway's policy."""
        return self.config.backend == "sim" or self.config.backend_factory is not None

    def next_generation(self) -> int:
        self.generation += 1
        return self.generation
