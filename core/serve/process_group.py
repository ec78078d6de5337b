"""A server's process group: who is still in it, signalling it as a whole, waiting until it is gone.

Never by process name: the group is the session the server was started in (see process.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group. Reads /proc on Linux; elsewhere a signal-0 probe."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after "(comm)": state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
