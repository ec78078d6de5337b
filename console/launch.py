"""Building and running the console: `create_app(...)`, the one factory the CLI (`run_app`) and the tests
use (posting's pattern), and `run_app`, the CLI's entry without --batch."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

from console.app import CONSOLE_PROGRESS_EVERY, EXIT_OK, EXIT_USAGE, BackendFactory, ConsoleConfig, SloConsoleApp
from core.profile import Profile, ProfileError, TunerSpec, load_profile


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
    mode: str | None = None,
) -> SloConsoleApp:
    """Build the console. Raises ProfileError (one line: file, field, fix) for a bad profile.

    `speed`: the simulator's pace against wall time; None, 0 or inf runs it flat out.
    """
    loaded = profile if isinstance(profile, Profile) else load_profile(profile)
    if mode is not None:
        from core.control.modes import MODES

        if mode not in MODES:
            raise ProfileError(f"--mode {mode}: not available; choose one of: {', '.join(MODES)}")
    if speed is not None and (speed <= 0 or speed == float("inf")):
        speed = None
    return SloConsoleApp(
        ConsoleConfig(
            profile=loaded,
            backend=backend,
            url=url,
            seed=seed,
            requests=requests,
            duration_s=duration_s,
            out=out,
            speed=speed,
            autostart=autostart,
            command_line=command_line or ["slo-console"],
            progress_every=progress_every,
            backend_factory=backend_factory,
            tuner_spec=tuner_spec,
            mode=mode,
        )
    )


def run_app(args: argparse.Namespace) -> int:
    """The CLI's entry without --batch: open the console, return an exit code from the documented set."""
    if args.backend == "url" and not args.url:
        print("slo-console: --backend url needs --url http://HOST:PORT of a running server", file=sys.stderr)
        return EXIT_USAGE
    try:
        app = create_app(
            args.profile,
            args.backend,
            url=args.url,
            seed=args.seed,
            requests=args.requests,
            duration_s=args.duration_s,
            out=args.out,
            speed=args.speed,
            command_line=["slo-console", *sys.argv[1:]],
            mode=getattr(args, "mode", None),
        )
    except ProfileError as exc:
        print(f"slo-console: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        code = app.run()
    finally:
        # If the app ended without its quit action (an exception, a signal), still stop what it started.
        if not app.state.closed and app.state.backend is not None:
            with contextlib.suppress(Exception):
                asyncio.run(app.state.backend.close())
    return code if isinstance(code, int) else EXIT_OK
