"""Building and running the console: `create_app(...)`, the one factory the CLI (`run_app`) and the tests
use (posting's pattern), and `run_app`, the CLI's entry without --batch."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
from pathlib import Path

from console.app import CONSOLE_PROGRESS_EVERY, BackendFactory, ConsoleConfig, SloConsoleApp
from core.exit_codes import ExitCode
from core.jobs.options import OperatorOptions
from core.profile import Profile, ProfileError, SchedulingMode, TunerSpec


def create_app(
    profile: str | Profile = "quickstart",
    backend: str = "sim",
    *,
    url: str | None = None,
    seed: int | None = None,
    requests: int | None = None,
    duration_s: float | None = None,
    out: Path | None = None,
    speed: float | None = 1.0,
    autostart: bool = True,
    command_line: list[str] | None = None,
    progress_every: int = CONSOLE_PROGRESS_EVERY,
    backend_factory: BackendFactory | None = None,
    tuner_spec: TunerSpec | None = None,
    mode: SchedulingMode | None = None,
) -> SloConsoleApp:
    """Build the console from keyword options (the tests' way; the CLI builds an `OperatorOptions`). Raises
    ProfileError (one line: file, field, fix) for a bad profile or options.

    `speed`: the simulator's pace against wall time; None, 0 or inf runs it flat out.
    """
    options = OperatorOptions(
        profile=profile,
        backend=backend,  # type: ignore[arg-type]
        url=url,
        mode=mode,
        seed=seed,
        requests=requests,
        duration_s=duration_s,
        out=out,
        speed=speed,
        command_line=command_line or ["slo-console"],
    )
    return open_console(
        options,
        autostart=autostart,
        progress_every=progress_every,
        backend_factory=backend_factory,
        tuner_spec=tuner_spec,
    )


def open_console(options: OperatorOptions, **console: object) -> SloConsoleApp:
    """The console for `options` (checked, the profile loaded in its mode); `console`: ConsoleConfig's own
    settings (autostart, progress_every, backend_factory, tuner_spec)."""
    options.check()
    speed = options.speed
    if speed is not None and (speed <= 0 or speed == float("inf")):
        speed = None
    fields = {f.name: getattr(options, f.name) for f in dataclasses.fields(OperatorOptions)}
    fields.update(profile=options.load_profile(), speed=speed)
    return SloConsoleApp(ConsoleConfig(**fields, **console))  # type: ignore[arg-type]


def run_app(options: OperatorOptions) -> int:
    """The CLI's entry without --batch: open the console, return an exit code (core/exit_codes.py)."""
    try:
        app = open_console(options)
    except ProfileError as exc:
        print(f"slo-console: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        code = app.run()
    finally:
        # If the app ended without its quit action (an exception, a signal), still stop what it started.
        if not app.state.closed and app.state.backend is not None:
            with contextlib.suppress(Exception):
                asyncio.run(app.state.backend.close())
    return code if isinstance(code, int) else ExitCode.OK
