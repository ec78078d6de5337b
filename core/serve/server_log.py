"""A server's log file: its last lines, and the one line that best explains a failure."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

LOG_TAIL_LINES = 20


_ERROR_HINT = re.compile(r"error|exception|errno|refus|fail|denied|not found|invalid|killed", re.IGNORECASE)
_NOISE = re.compile(r"DeprecationWarning|warnings\.warn|UserWarning|^\s*\^+\s*$|leaked semaphore|nanobind")
_VLLM_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s*")


def telling_log_line(lines: Sequence[str], max_len: int = 300) -> str:
    """The line that best explains a failure: the last one that reads like an error, else the last one."""
    cleaned = [_VLLM_PREFIX.sub("", line).strip() for line in lines]
    cleaned = [line for line in cleaned if line and not _NOISE.search(line)]
    if not cleaned:
        return ""
    for line in reversed(cleaned):
        if _ERROR_HINT.search(line) and not line.startswith(("File ", "Traceback")):
            return line[:max_len]
    return cleaned[-1][:max_len]


def read_log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> list[str]:
    if path is None:
        return []
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]
