"""Files a killed run cannot leave half-written: whole JSON lines, and whole-file replacement.

slo-console may be killed at any instant (SIGKILL, Ctrl-C, power), and whatever it was writing in --out
must still read back:

- JSON Lines (events.jsonl, requests.jsonl, tune-journal.jsonl) are appended one line per `os.write` on an
  unbuffered O_APPEND descriptor: there is no user-space buffer to be torn between two system calls, and
  nothing waits in one to be lost when the process dies. Every line but the last is whole. The last can be
  cut at a page boundary: Linux copies a write into the page cache one page (folio) at a time and stops
  between two when a fatal signal is pending (mm/filemap.c, generic_perform_write), so a SIGKILL landing
  inside a write that spans a page boundary leaves the line's first part on disk, with no newline and the
  file's size a multiple of the page size (measured: 1 kill in 60 of a writer of lines up to 3 kB). No
  system call appends atomically past that, so readers drop a last line without its newline: the tune
  journal does on `--resume` (core/tune/journal.py); `whole_lines` below is that rule for any other reader.
- Whole files (summary.json, factsheet.json/.md, calibration.yaml, sweep.json) are written to a temporary
  file beside the target and moved over it with `os.replace`, which is atomic on POSIX: a reader sees the
  old file or the new one, never an empty or truncated one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


class JsonlAppender:
    """Appends whole lines to a file; `sync=True` also fsyncs each (the tune journal: it survives power loss)."""

    def __init__(self, path: Path, *, truncate: bool = False, sync: bool = False) -> None:
        self.path = path
        self.sync = sync
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
        self._fd: int | None = os.open(path, flags, 0o644)

    def write_line(self, line: str) -> None:
        """One line (without its newline) in one system call."""
        if self._fd is None:
            raise ValueError(f"{self.path}: written after close")
        data = (line + "\n").encode("utf-8")
        written = os.write(self._fd, data)
        while written < len(data):  # a short write (disk nearly full): finish the line before anything else
            written += os.write(self._fd, data[written:])
        if self.sync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def replace_atomically(path: Path, text: str) -> Path:
    """Write `text` to `path` through a temporary file in the same directory and `os.replace` (atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with partial.open("w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
    return path


def whole_lines(data: bytes) -> list[bytes]:
    """The complete lines of a JSON Lines file's bytes: a last line without its newline (torn by a kill, see
    above) is dropped."""
    lines = data.split(b"\n")
    return lines[:-1]  # the piece after the last newline: empty, or a torn line
