"""Factsheet export for a console session: the last finished job (a run, a tune or a compare) to
factsheet.json and .md.

No Textual here: the app calls it from a thread worker, tests call it directly. It goes through the jobs
registry's factsheet builders (core/jobs/registry.py), the batch runner's path, so the console and
`--batch --job J --out D` write the same factsheet for the same job.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from core.events import null_sink
from core.factsheet.render import write_factsheet
from core.job_registry import JOBS, JobContext
from core.jobs.options import JobName, OperatorOptions
from core.profile import Profile


def default_out_dir(now: datetime | None = None, root: Path | None = None) -> Path:
    """./runs/<timestamp>/: one folder per export, sortable by time."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return (root or Path("runs")) / stamp


def export_factsheet(
    job: JobName, result: Any, out_dir: Path, options: OperatorOptions, profile: Profile
) -> tuple[Path, Path]:
    """Write the factsheet of `job`'s `result` (factsheet.json and factsheet.md) under `out_dir` (created)
    and return their paths."""
    context = JobContext(profile, options, null_sink)
    json_path, markdown_path = write_factsheet(JOBS[job].factsheet(result, context), out_dir)
    return Path(json_path), Path(markdown_path)
