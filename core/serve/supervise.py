"""A tiny supervisor between slo-console and a server it starts: the server dies with slo-console, always.

Run by `ServerProcess` as `python supervise.py LIFELINE_FD GRACE_S -- ARGV...` (standard library only, so it
starts in tens of milliseconds with any interpreter). It is the leader of the server's process group: it
starts ARGV in that group and watches two things:

- the lifeline: the read end of a pipe whose write end only slo-console holds. When slo-console exits by
  any means, SIGKILL included, the kernel closes the write end and the read end reports end-of-file;
- the server: when it exits, the supervisor exits with the same status (a signal death is re-raised), so
  the crash watcher in `ServerProcess` sees the server's own exit.

On end-of-file, SIGTERM, SIGINT or SIGHUP it stops the whole group: SIGTERM, GRACE_S seconds for vLLM's API
server, engine core and workers to exit, then SIGKILL to whatever is left.

The supervisor can itself be killed outright: a Ray worker that ends (a cancelled or crashed task) has its
direct children SIGKILLed by Ray (its `kill_child_processes_on_worker_exit`, on by default), and that is the
supervisor, not the server. So the supervisor first forks a warden into the group, holding the read end of a
pipe whose write end only the supervisor holds: when the supervisor is gone by any means, the warden reads
end-of-file and stops the group the same way. A normal stop's SIGTERM to the group ends the warden with it.

Why a lifeline pipe and not PR_SET_PDEATHSIG: Linux sends the parent-death signal when the *thread* that
forked the child ends, not the process, and slo-console starts servers from worker threads
(`asyncio.to_thread`, whose threads end with each `asyncio.run`): with PR_SET_PDEATHSIG a server started in
one `asyncio.run` died at its end (seen in tests/test_vllm_live.py). The pipe follows the process: its write
end closes only when the last thread of slo-console is gone, and if slo-console died before the supervisor
got here, the first read already reports end-of-file.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from types import FrameType

POLL_S = 0.2


class _Stop(Exception):
    """Raised by the signal handler: stop the group."""


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    raise _Stop(signum)


def _group_alive(pgid: int, self_pid: int) -> bool:
    """Any live member of the group besides this supervisor (reads /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == self_pid:
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def _stop_group(child: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # our own SIGTERM to the group must not interrupt us
    pgid = os.getpgrp()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if child is not None:
            child.poll()  # reap the server so it does not linger as a zombie member
        if not _group_alive(pgid, os.getpid()):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)  # the supervisor too: it has nothing left to do


def _start_warden(grace_s: float) -> int:
    """Fork the warden (see the module docstring); return the pipe end the supervisor keeps open for life."""
    read_end, write_end = os.pipe()  # not inherited by the server (os.pipe's ends are non-inheritable)
    if os.fork() == 0:
        try:
            os.close(write_end)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)  # the group's SIGTERM on a normal stop ends the warden too
            while True:
                try:
                    if not os.read(read_end, 1):
                        break  # the supervisor is gone without stopping the group
                except InterruptedError:
                    continue
            _stop_group(None, grace_s)
        finally:
            os._exit(0)
    os.close(read_end)
    return write_end


def _exit_like(returncode: int) -> None:
    if returncode < 0:
        signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    sys.exit(returncode)


def main(argv: list[str]) -> None:
    lifeline, grace_s, separator, *command = argv
    if separator != "--" or not command:
        sys.exit("usage: supervise.py LIFELINE_FD GRACE_S -- ARGV...")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    child: subprocess.Popen[bytes] | None = None
    fd = int(lifeline)
    try:
        _start_warden(float(grace_s))
        child = subprocess.Popen(command, close_fds=True)
        while True:
            returncode = child.poll()
            if returncode is not None:
                _stop_group(child, float(grace_s))  # the server's own children, if it left any
                _exit_like(returncode)
            readable, _, _ = select.select([fd], [], [], POLL_S)
            if readable and not os.read(fd, 1):
                raise _Stop(0)  # end of file: slo-console is gone
    except _Stop:
        _stop_group(child, float(grace_s))
        sys.exit(0 if child is None else 128 + signal.SIGTERM)


if __name__ == "__main__":
    main(sys.argv[1:])
