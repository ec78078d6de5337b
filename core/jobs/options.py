"""What the operator asked for: one dataclass the batch CLI and the console both build from.

`slo-console [--batch] --profile P --job J --backend B --url U --mode M --seed N --requests N --duration S
--out D --resume --speed X --workers N --executor E --ray-address A` becomes one `OperatorOptions`
(console/cli.py `options_from_args`); the console's own settings extend it (console/app.py `ConsoleConfig`).
`check()` refuses bad usage in one line (exit 2) before anything starts, and `load_profile()` is the one
place the scheduling mode joins the profile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from core.executor import EXECUTOR_KINDS, RAY_EXTRA, ExecutorKind, ExecutorSpec, ray_installed
from core.profile import Profile, ProfileError, SchedulingMode, load_profile, parse_scheduling_mode

DEFAULT_PROFILE = "quickstart"
JobName = Literal["run", "tune", "calibrate", "compare", "capacity"]
JOB_NAMES: tuple[JobName, ...] = get_args(JobName)
BackendKind = Literal["sim", "vllm", "url"]
BACKEND_KINDS: tuple[BackendKind, ...] = get_args(BackendKind)


class UsageError(ProfileError):
    """The command line asks for something that cannot work (exit code 2); one line naming the fix."""


@dataclass(slots=True)
class OperatorOptions:
    profile: str | Profile = DEFAULT_PROFILE  # a shipped name, a YAML path, or a loaded profile (tests)
    job: JobName = "run"
    backend: BackendKind = "sim"
    url: str | None = None  # --backend url: the running server
    mode: SchedulingMode | None = None  # None: the profile's own mode
    seed: int | None = None  # None: the profile's seed
    requests: int | None = None  # None: the profile's
    duration_s: float | None = None  # stop sending after this many seconds
    out: Path | None = None  # events, requests, summary and factsheet go here
    resume: bool = False  # --job tune: continue the journal in `out`
    speed: float | None = 1.0  # the console's simulator pace against wall time; None: flat out
    # Where compare, capacity and the tuner's simulator runs go (core/executor.py): a local pool of `workers`
    # processes (None: one per CPU; 1: one after another in this process), or Ray tasks.
    workers: int | None = None
    executor: ExecutorKind = "local"
    ray_address: str | None = None  # --executor ray: a running cluster ("auto", ray://HOST:10001); None: local
    command_line: list[str] = field(default_factory=lambda: ["slo-console"])

    def check(self) -> None:
        """Raise UsageError for options that contradict each other or are out of range."""
        if self.job not in JOB_NAMES:
            raise UsageError(f"--job {self.job}: not a job; choose one of: {', '.join(JOB_NAMES)}")
        if self.backend not in BACKEND_KINDS:
            raise UsageError(f"--backend {self.backend}: not a backend; choose one of: {', '.join(BACKEND_KINDS)}")
        if self.mode is not None:
            parse_scheduling_mode(self.mode)
        if self.backend == "url" and not self.url:
            raise UsageError("--backend url needs --url http://HOST:PORT of a running server")
        if self.url and self.backend != "url":
            raise UsageError(f"--url is for --backend url (not {self.backend}); add --backend url or drop --url")
        if self.requests is not None and self.requests < 1:
            raise UsageError(f"--requests must be at least 1 (got {self.requests})")
        if self.duration_s is not None and not (0 < self.duration_s < math.inf):
            raise UsageError(f"--duration must be positive, finite seconds (got {self.duration_s})")
        if self.seed is not None and self.seed < 0:
            raise UsageError(f"--seed must be 0 or more (got {self.seed})")
        if self.resume and self.job != "tune":
            raise UsageError("--resume continues a tune's journal; use it with --job tune")
        if self.workers is not None and self.workers < 1:
            raise UsageError(f"--workers must be at least 1 (got {self.workers}); 1 runs one simulation at a time")
        if self.executor not in EXECUTOR_KINDS:
            raise UsageError(f"--executor {self.executor}: choose one of: {', '.join(EXECUTOR_KINDS)}")
        if self.workers is not None and self.executor == "ray":
            raise UsageError("--workers sizes the local pool; on Ray each run takes one CPU of the cluster: drop it")
        if self.ray_address and self.executor != "ray":
            raise UsageError("--ray-address is for --executor ray; add --executor ray or drop --ray-address")
        if self.executor == "ray" and not ray_installed():
            raise UsageError(f"--executor ray needs Ray, which is not installed: {RAY_EXTRA}")

    def executor_spec(self) -> ExecutorSpec:
        return ExecutorSpec(self.executor, self.workers, self.ray_address)

    def load_profile(self) -> Profile:
        """The profile the job runs: loaded (if named) and in the asked-for scheduling mode. Raises
        ProfileError (exit 2) with one line for a bad profile or mode."""
        profile = self.profile if isinstance(self.profile, Profile) else load_profile(self.profile)
        mode = None if self.mode is None else parse_scheduling_mode(self.mode)
        return profile.with_mode(mode)

    @property
    def profile_label(self) -> str:
        return self.profile.name if isinstance(self.profile, Profile) else str(self.profile)
