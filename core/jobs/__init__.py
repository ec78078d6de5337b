"""Jobs: the work a user asks for (run a workload, tune, calibrate, compare, capacity), written once for the
batch CLI and the console.

run.py       the run job: a profile's workload on a backend, events on a sink, a `RunResult`
options.py   `OperatorOptions`: what the operator asked for, the one dataclass both front ends build from
registry.py  `JOBS`: every job by name (run, tune, calibrate, compare, capacity), its summary, factsheet, report
"""

from core.jobs.run import (
    LIVE_WINDOW_S,
    PROGRESS_EVERY_REQUESTS,
    RunOptions,
    RunResult,
    run_workload,
    summary_event,
)

__all__ = [
    "LIVE_WINDOW_S",
    "PROGRESS_EVERY_REQUESTS",
    "RunOptions",
    "RunResult",
    "run_workload",
    "summary_event",
]
