"""The tuning journal: one JSON line per finished segment, appended and fsynced as it finishes.

A run killed at any moment (Ctrl-C, SIGKILL, power) leaves every finished segment on disk. `--resume`
replays the search: the search is deterministic, so it asks for the same segments in the same order, and
each one already in the journal is taken from there instead of being measured again. The first line is a
header naming what the run was (profile hash, backend, algorithm, seed); resuming a different run is
refused, since its measurements would answer another question. A torn last line (killed mid-write) is
dropped and overwritten.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from core.durable_files import JsonlAppender, whole_lines
from core.profile import ProfileError
from core.tune.score import Segment

JOURNAL_NAME = "tune-journal.jsonl"
FORMAT_VERSION = 1


class Journal:
    def __init__(self, path: Path, header: dict[str, Any], *, resume: bool) -> None:
        self.path = path
        self.header = {"kind": "header", "format": FORMAT_VERSION, **header}
        self.segments: dict[str, Segment] = {}
        self.archived: Path | None = None
        self._file: JsonlAppender | None = None
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume and path.exists() and path.stat().st_size > 0:
            self._load_for_resume()
        else:
            if path.exists() and path.stat().st_size > 0:
                self.archived = self._archive_old()
            self._file = JsonlAppender(path, truncate=True, sync=True)
            self._write(self.header)

    # ------------------------------------------------------------ reading

    def _load_for_resume(self) -> None:
        good: list[bytes] = []
        found_header: dict[str, Any] | None = None
        # A last line without its newline is the torn tail of a killed write (core/durable_files.py): dropped.
        for number, raw in enumerate(whole_lines(self.path.read_bytes()), start=1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
            except json.JSONDecodeError:
                raise ProfileError(
                    f"{self.path}: line {number} is not JSON; the journal is damaged, move it away to start over"
                ) from None
            good.append(raw)
            if entry.get("kind") == "header":
                found_header = entry
            elif entry.get("kind") == "segment":
                segment = Segment.from_json(entry)
                self.segments[segment.key] = segment
        if found_header is None:
            raise ProfileError(f"{self.path}: no header line; not a tune journal, give another --out or drop --resume")
        mismatched = [
            name
            for name in ("profile_hash", "backend", "algorithm", "seed", "guided")
            if found_header.get(name) != self.header.get(name)
        ]
        if mismatched:
            detail = ", ".join(f"{n} {found_header.get(n)!r} -> {self.header.get(n)!r}" for n in mismatched)
            raise ProfileError(
                f"{self.path}: --resume of a different run ({detail}); resume with the same profile and options, "
                "or drop --resume to start a new journal"
            )
        # Rewrite without the torn tail, then keep appending.
        tmp = self.path.with_suffix(".tmp")
        tmp.write_bytes(b"".join(line + b"\n" for line in good))
        os.replace(tmp, self.path)
        self._file = JsonlAppender(self.path, sync=True)

    def _archive_old(self) -> Path:
        """A new run never overwrites measurements: the previous journal is kept under a numbered name."""
        n = 1
        while True:
            candidate = self.path.with_name(f"{self.path.stem}.{n}{self.path.suffix}")
            if not candidate.exists():
                os.replace(self.path, candidate)
                return candidate
            n += 1

    def lookup(self, key: str) -> Segment | None:
        return self.segments.get(key)

    # ------------------------------------------------------------ writing

    def _write(self, entry: dict[str, Any]) -> None:
        assert self._file is not None
        # One line per system call, fsynced: a kill leaves every earlier line whole (core/durable_files.py).
        self._file.write_line(json.dumps(entry, separators=(",", ":"), allow_nan=False, default=_json_default))

    def append(self, segment: Segment) -> None:
        self.segments[segment.key] = segment
        self._write({"kind": "segment", **_finite(segment.to_json())})

    def note(self, kind: str, **fields: Any) -> None:
        """A non-segment line (e.g. the run's end) for people reading the journal."""
        self._write({"kind": kind, **_finite(fields)})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: write null (read back as NaN / -inf by Segment.from_json)."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
