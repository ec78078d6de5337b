"""Pid files for the servers slo-console starts, so a later run can find one an earlier run left behind.

`ServerProcess` registers each server it starts (`<cache>/servers/<pgid>.json`: the owning slo-console's pid
and start time, the server's process group, port, argv and log) and removes the file when it stops it. A
file whose owner is gone while its process group still has live members is a stale server: slo-console
was killed in a way that skipped its clean-up (the supervisor normally prevents even that), or the machine
was suspended mid-stop. `stale_servers()` reports those and deletes files whose groups are gone. A server
is never killed on this evidence alone: the report names the group and the command that stops it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

REGISTRY_DIR = "servers"


def registry_dir() -> Path:
    from core.serve.cache_dir import cache_root

    return cache_root() / REGISTRY_DIR


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[19]) if len(fields) > 19 and fields[0] != "Z" else None


@dataclass(frozen=True, slots=True)
class StaleServer:
    pgid: int
    members: list[int]
    owner_pid: int
    port: int | None
    log_path: str | None
    started_at: str | None
    path: Path

    def describe(self) -> str:
        where = f" on 127.0.0.1:{self.port}" if self.port else ""
        log = f", log {self.log_path}" if self.log_path else ""
        return (
            f"a server started by an earlier slo-console (pid {self.owner_pid}, now gone) at {self.started_at} is "
            f"still running{where}: process group {self.pgid} ({len(self.members)} processes{log}); "
            f"stop it with: kill -- -{self.pgid}"
        )


def register(pgid: int, port: int | None, argv: Sequence[str], log_path: Path | None) -> Path | None:
    """Record a server this process started; returns the pid file (None if it cannot be written)."""
    record = {
        "pgid": pgid,
        "owner_pid": os.getpid(),
        "owner_start_ticks": process_start_ticks(os.getpid()),
        "port": port,
        "argv": list(argv),
        "log_path": None if log_path is None else str(log_path),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = registry_dir() / f"{pgid}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record) + "\n")
    except OSError:
        return None  # a read-only cache costs only the stale-server report
    return path


def unregister(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def _owner_alive(record: dict) -> bool:
    ticks = process_start_ticks(int(record.get("owner_pid", 0)))
    return ticks is not None and ticks == record.get("owner_start_ticks")


def stale_servers(group_members: Callable[[int], list[int]]) -> list[StaleServer]:
    """Registered servers whose owner is gone but whose process group lives; forgets groups that are gone."""
    found: list[StaleServer] = []
    directory = registry_dir()
    if not directory.is_dir():
        return found
    for path in sorted(directory.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            pgid = int(record["pgid"])
        except (OSError, ValueError, KeyError, TypeError):
            unregister(path)  # unreadable: nothing to report from it
            continue
        if _owner_alive(record):
            continue  # a running slo-console's server (this one's, or another's)
        members = group_members(pgid)
        if not members:
            unregister(path)
            continue
        found.append(
            StaleServer(
                pgid=pgid,
                members=members,
                owner_pid=int(record.get("owner_pid", 0)),
                port=record.get("port"),
                log_path=record.get("log_path"),
                started_at=record.get("started_at"),
                path=path,
            )
        )
    return found
