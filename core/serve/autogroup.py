"""Whether a server on this machine runs in another scheduler autogroup than slo-console (Linux only).

Linux puts each session (a terminal, a tmux pane, `setsid`) in an autogroup of its own when
`kernel.sched_autogroup_enabled` is 1, the default, and shares the CPU between autogroups before it
shares it between their threads. On the 2-core CPU-only machine a busy vLLM CPU server in an autogroup of
its own starved slo-console's load client for seconds (event-loop stalls up to 15 s, requests timing out
while connecting; docs/gateway.md, "Client starvation under vLLM's own autogroup"). Servers slo-console
starts share its session (core/serve/process.py); one the user started elsewhere and names with
`--backend url` may not, and that is what `separate_autogroup_warning` tells them, in one line.

Everything here reads /proc and answers None where it cannot tell (another OS, a remote host, a server
owned by another user): a warning is advice, never a refusal.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from urllib.parse import urlsplit

PROC = Path("/proc")
LISTEN = "0A"  # the TCP state column of /proc/net/tcp for a listening socket


def autogroups_enabled() -> bool:
    try:
        return (PROC / "sys/kernel/sched_autogroup_enabled").read_text().strip() == "1"
    except OSError:
        return False


ROOT_AUTOGROUP = "/autogroup-0"


def autogroup(pid: int) -> str | None:
    """The autogroup a process runs in ("/autogroup-42"), or None where the kernel does not say.

    A process that no `setsid` since boot has moved (pid 1 and what a daemon starts without a session of its
    own, as a CI runner may) runs in the kernel's default autogroup, the root task group, and its file is
    *empty* (kernel/sched/autogroup.c prints nothing for it): that is `ROOT_AUTOGROUP`, not "unknown". A
    server in an autogroup of its own competes with such a client as one more scheduling entity: stop 33's CI
    run, its client in the root group, was starved by vLLM started in a session of its own.
    """
    try:
        text = (PROC / str(pid) / "autogroup").read_text()
    except OSError:
        return None
    fields = text.split()
    return fields[0] if fields else ROOT_AUTOGROUP


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on `port` on any local address (IPv4 and IPv6)."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def listening_pid(port: int) -> int | None:
    """A process holding a socket that listens on `port` on this machine, or None (none, or not readable)."""
    inodes = {f"socket:[{inode}]" for inode in _listening_inodes(port)}
    if not inodes:
        return None
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
        except OSError:  # gone, or another user's
            continue
        if inodes.intersection(links):
            return int(entry.name)
    return None


def _local_port(url: str) -> int | None:
    """The port of a URL whose host is this machine's loopback, or None."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if host != "localhost":
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return None
        except ValueError:
            return None
    try:
        return parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None


def separate_autogroup_warning(url: str, *, enabled: bool | None = None) -> str | None:
    """One line of advice when the server at `url` runs on this machine in another autogroup, else None."""
    if not (autogroups_enabled() if enabled is None else enabled):
        return None
    port = _local_port(url)
    pid = listening_pid(port) if port is not None else None
    if pid is None:
        return None
    theirs, ours = autogroup(pid), autogroup(os.getpid())
    if theirs is None or ours is None or theirs == ours:
        return None
    return (
        f"the server at {url} (pid {pid}) runs in another scheduler autogroup ({theirs}) than slo-console ({ours}):"
        " on a CPU-only machine a busy server there can starve this client for seconds and inflate its"
        " latencies; start it from this shell (`vllm serve ... &`) or turn autogroups off"
        " (`sysctl kernel.sched_autogroup_enabled=0`); see docs/live-vllm.md"
    )
