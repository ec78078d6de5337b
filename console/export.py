"""Factsheet export for a console session: the last run (and the tuning, if one ran) to factsheet.json and .md.

No Textual here: the app calls it from a thread worker, tests call it directly. It goes through
core.factsheet.run.factsheet_for_run, the batch runner's path, so the console and `--batch --out` write the
same factsheet for the same run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from core.factsheet.run import write_run_factsheet
from core.jobs import RunResult


def default_out_dir(now: datetime | None = None, root: Path | None = None) -> Path:
    """./runs/<timestamp>/: one folder per export, sortable by time."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    return (root or Path("runs")) / stamp


def tuning_section(
    steps: Sequence[Mapping[str, Any]],
    baseline: Mapping[str, Any] | None,
    best: Mapping[str, Any] | None,
    summary: Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """The factsheet's tuning input, from the tuner events the console saw (None when no tuner ran)."""
    if not steps and not summary:
        return None
    summary = summary or {}
    section: dict[str, Any] = {"tuner": f"slo-tuner {summary.get('algorithm', 'hillclimb')}"}
    if baseline is not None:
        section["baseline"] = dict(baseline)
    if best is not None:
        section["tuned"] = dict(best)
    section["trajectory"] = [dict(step) for step in steps]
    section["segments"] = summary.get("segments_used", len(steps))
    if summary.get("wall_s") is not None:
        section["wall_time_s"] = summary["wall_s"]
    return section


def export_factsheet(
    result: RunResult,
    out_dir: Path,
    command_line: Sequence[str],
    *,
    tuning: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write factsheet.json and factsheet.md under `out_dir` (created) and return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, markdown_path = write_run_factsheet(result, out_dir, command_line, tuning=tuning)
    return Path(json_path), Path(markdown_path)
