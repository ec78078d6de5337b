"""Lifecycle of one server child process: start, wait until ready, watch, stop, restart. Never leaks it.

The child runs in a process group of its own (`process_group=0`), so it and everything it spawns (vLLM's
EngineCore and workers, the multiprocessing resource tracker) share one group that we signal as a whole: a
Ctrl-C in the terminal does not reach it directly (it is not in the foreground group), and stopping it never
depends on process names. argv is always a list, never a shell string.

A group, not a session of its own (`start_new_session`, used until 2026-11-26): Linux puts each session in a
scheduler autogroup (`kernel.sched_autogroup_enabled`, on by default), and on this 2-core machine (kernel
6.18) a vLLM CPU server in an autogroup of its own starved slo-console's own process, the load client and
the gateway, for seconds at a time while it was busy: a 10 ms sleep loop beside them woke up to 11.5 s late
(runnable, not sleeping), the event loop stalled up to 15 s at the 99th percentile, and requests timed out
connecting to the gateway and the gateway to vLLM (10 s connect timeouts; CI failed on it). The same load
with vLLM in slo-console's session: no stall over 0.2 s, the event loop's worst 71 ms, every request served
(docs/gateway.md, "Client starvation under vLLM's own autogroup").

States: stopped -> starting -> ready -> (crashed | stopped). A callback sees every change; it runs on the
thread that caused it (the crash watcher is a background thread), so a UI must hop to its own loop.

Nothing is left running: `stop()` sends SIGTERM to the group, waits, then SIGKILL; a context manager and
an atexit hook stop whatever is still alive at normal exit, on an exception and on Ctrl-C (which unwinds
as KeyboardInterrupt). `install_termination_handlers()` extends that to SIGTERM/SIGHUP for entry points.
On Linux the group's leader is a small supervisor (core/serve/supervise.py) that stops the group when this
process dies by any means, SIGKILL included. Each server is registered in a pid file (core/serve/registry.py)
so a later start reports a server an earlier slo-console left running.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO

from core.backend_api import BackendUnavailable
from core.serve import registry
from core.serve.process_group import group_members, signal_group, wait_group_gone
from core.serve.server_log import LOG_TAIL_LINES, read_log_tail, telling_log_line

log = logging.getLogger("slo_console")

LOOPBACK = "127.0.0.1"
DEFAULT_READY_PATHS = ("/v1/models", "/health")
READY_POLL_S = 0.5
WATCH_POLL_S = 0.2
SUPERVISOR = Path(__file__).with_name("supervise.py")
# How long the supervisor lets the group shut down after SIGTERM before SIGKILL, when slo-console is gone.
SUPERVISOR_GRACE_S = 5.0


def supervised() -> bool:
    """Whether servers run under the supervisor (Linux: it reads /proc)."""
    return sys.platform.startswith("linux") and SUPERVISOR.is_file()


class ServerState(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    CRASHED = "crashed"


StateCallback = Callable[[ServerState, str], None]
ArgvForPort = Callable[[str, int], Sequence[str]]


class ServerStartError(BackendUnavailable):
    """The server did not become ready. `str()` is one line: the cause, the telling log line, the log path.

    The last lines of the log are in `log_tail` for a UI that has room to show them.
    """

    def __init__(self, cause: str, log_tail: list[str], log_path: Path | None, returncode: int | None = None) -> None:
        self.cause = cause
        self.log_tail = log_tail
        self.log_path = log_path
        self.returncode = returncode
        telling = telling_log_line(log_tail)
        parts = [cause]
        if telling:
            parts.append(f"log says: {telling}")
        if log_path is not None:
            parts.append(f"full log: {log_path}")
        super().__init__("; ".join(parts))


def free_port(host: str = LOOPBACK) -> int:
    """A port nobody listens on right now (the OS picks it; the server binds it shortly after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


_live_servers: weakref.WeakSet[ServerProcess] = weakref.WeakSet()


@atexit.register
def stop_all_servers() -> None:
    """Stop every server this process started and has not stopped (runs at interpreter exit)."""
    for server in list(_live_servers):
        with contextlib.suppress(Exception):
            server.stop()


def install_termination_handlers() -> None:
    """Make SIGTERM and SIGHUP unwind like Ctrl-C (so atexit stops the servers). For entry points only.

    Leaves a handler someone else installed alone; must be called from the main thread.
    """

    def _raise_exit(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _raise_exit)


class ServerProcess:
    """One child server in its own process group, with readiness, crash watch, logs and clean stop.

    `argv_for(host, port)` builds the command line once the port is known, so a restart (or a retry after
    losing a port race) can get a fresh port. `port=0` picks a free loopback port per start.
    """

    def __init__(
        self,
        argv_for: ArgvForPort,
        *,
        host: str = LOOPBACK,
        port: int = 0,
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        log_name: str = "server",
        ready_paths: Sequence[str] = DEFAULT_READY_PATHS,
        startup_timeout_s: float = 300.0,
        stop_timeout_s: float = 20.0,
        on_state: StateCallback | None = None,
    ) -> None:
        self._argv_for = argv_for
        self.host = host
        self.requested_port = port
        self.env = dict(env or {})
        self.log_dir = log_dir
        self.log_name = log_name
        self.ready_paths = tuple(ready_paths)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._callbacks: list[StateCallback] = [on_state] if on_state else []
        self._lock = threading.RLock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_handle: object | None = None
        self._watcher: threading.Thread | None = None
        self._stopping = threading.Event()
        self.state = ServerState.STOPPED
        self.state_detail = ""
        self.port: int | None = None
        self.argv: list[str] = []
        self.log_path: Path | None = None
        self.startup_s: float | None = None
        self.starts = 0
        self._lifeline: int | None = None  # write end of the supervisor's lifeline pipe
        self._pid_file: Path | None = None
        # Servers an earlier slo-console left running, found at the last start (reported, not killed).
        self.stale: list[registry.StaleServer] = []

    # ------------------------------------------------------------ observation

    def add_state_callback(self, callback: StateCallback) -> None:
        self._callbacks.append(callback)

    def _set_state(self, state: ServerState, detail: str = "") -> None:
        self.state = state
        self.state_detail = detail
        for callback in list(self._callbacks):
            with contextlib.suppress(Exception):  # a broken listener must not break the lifecycle
                callback(state, detail)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit status once the child has exited (negative: killed by that signal); None while alive."""
        return None if self._proc is None else self._proc.poll()

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("server has not been started")
        return f"http://{self.host}:{self.port}"

    @property
    def crashed(self) -> bool:
        return self.state is ServerState.CRASHED

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        return read_log_tail(self.log_path, lines)

    # ------------------------------------------------------------ start

    def start(self) -> None:
        """Launch and block until ready; raise `ServerStartError` (child stopped) when it cannot be."""
        with self._lock:
            if self.is_running():
                raise RuntimeError(f"{self.log_name} is already running (pid {self.pid}); stop() it first")
            attempts = 2 if self.requested_port == 0 else 1
            for attempt in range(attempts):
                try:
                    self._start_once()
                    return
                except ServerStartError as exc:
                    lost_port_race = any("address already in use" in line.lower() for line in exc.log_tail)
                    if attempt + 1 < attempts and lost_port_race:
                        continue  # someone took our free port between picking and binding it
                    raise

    def _open_log(self, port: int) -> Path:
        log_dir = self.log_dir
        if log_dir is None:
            from core.serve.cache_dir import cache_root

            log_dir = cache_root() / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return log_dir / f"{self.log_name}-{stamp}-{port}-{os.getpid()}-{self.starts}.log"

    def _start_once(self) -> None:
        self._stopping.clear()
        self.starts += 1
        port = self.requested_port or free_port(self.host)
        self.port = port
        self.argv = [str(a) for a in self._argv_for(self.host, port)]
        self.log_path = self._open_log(port)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self._report_stale()
        self._set_state(ServerState.STARTING, f"{self.argv[0]} on {self.host}:{port}")
        started = time.monotonic()
        with self.log_path.open("wb") as log_file:
            log_file.write(f"# argv: {self.argv!r}\n".encode())
            log_file.flush()
            try:
                self._proc = self._launch(log_file, env)
            except OSError as exc:
                self._set_state(ServerState.STOPPED, str(exc))
                raise ServerStartError(
                    f"cannot execute {self.argv[0]} ({exc.strerror}); check the server python path",
                    [],
                    self.log_path,
                ) from exc
        _live_servers.add(self)
        self._pid_file = registry.register(self._proc.pid, port, self.argv, self.log_path)
        try:
            self._wait_ready(started)
        except BaseException as exc:
            # Timeout, early exit, Ctrl-C while waiting: never leave a half-started server behind.
            returncode = self.returncode
            self._kill_group()
            self._set_state(ServerState.STOPPED, str(exc))
            if isinstance(exc, ServerStartError) and exc.returncode is None:
                exc.returncode = returncode
            raise
        self.startup_s = time.monotonic() - started
        self._set_state(ServerState.READY, f"{self.base_url} ready in {self.startup_s:.1f} s")
        self._watcher = threading.Thread(target=self._watch, name=f"{self.log_name}-watch", daemon=True)
        self._watcher.start()

    def _launch(self, log_file: IO[bytes], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start the child in a process group of its own; under the supervisor where available."""
        argv = self.argv
        pass_fds: tuple[int, ...] = ()
        if supervised():
            if shutil.which(argv[0]) is None:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", argv[0])
            read_end, self._lifeline = os.pipe()  # both non-inheritable; the supervisor gets the read end
            grace = min(SUPERVISOR_GRACE_S, self.stop_timeout_s / 2)
            argv = [sys.executable, str(SUPERVISOR), str(read_end), f"{grace:g}", "--", *argv]
            pass_fds = (read_end,)
        try:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                process_group=0,  # own process group, same session: see the module docstring
                close_fds=True,
                pass_fds=pass_fds,
            )
        except OSError:
            self._close_lifeline()
            raise
        finally:
            for fd in pass_fds:
                os.close(fd)

    def _close_lifeline(self) -> None:
        if self._lifeline is not None:
            with contextlib.suppress(OSError):
                os.close(self._lifeline)
            self._lifeline = None

    def _report_stale(self) -> None:
        self.stale = registry.stale_servers(group_members)
        for stale in self.stale:
            log.warning("%s", stale.describe())

    def _probe_ready(self) -> bool:
        for path in self.ready_paths:
            try:
                with urllib.request.urlopen(self.base_url + path, timeout=2.0) as response:
                    if response.status == 200:
                        return True
            except (urllib.error.URLError, OSError, ValueError):
                continue
        return False

    def _wait_ready(self, started: float) -> None:
        assert self._proc is not None
        deadline = started + self.startup_timeout_s
        while True:
            returncode = self._proc.poll()
            if returncode is not None:
                raise ServerStartError(
                    f"{self.log_name} exited with code {returncode} during start-up",
                    self.log_tail(),
                    self.log_path,
                    returncode,
                )
            if self._stopping.is_set():
                raise ServerStartError(f"{self.log_name} start cancelled (stop() was called)", [], self.log_path)
            if self._probe_ready():
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"{self.log_name} not ready after {self.startup_timeout_s:.0f} s "
                    f"(no 200 from {', '.join(self.ready_paths)}); raise startup_timeout_s or read the log",
                    self.log_tail(),
                    self.log_path,
                )
            time.sleep(READY_POLL_S)

    # ------------------------------------------------------------ watch

    def _watch(self) -> None:
        proc = self._proc
        while proc is not None and not self._stopping.is_set():
            returncode = proc.poll()
            if returncode is not None:
                with self._lock:
                    if self._stopping.is_set() or proc is not self._proc:
                        return
                    # The leader died on its own: say so at once (the log tail is read before the
                    # children's shutdown chatter lands in it), then take its children with it.
                    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
                    tail = telling_log_line(self.log_tail())
                    detail = f"{self.log_name} died mid-run ({how})" + (f": {tail}" if tail else "")
                    self._set_state(ServerState.CRASHED, detail)
                    self._kill_group()
                return
            time.sleep(WATCH_POLL_S)

    def wait_crashed(self, timeout_s: float) -> bool:
        """Block until the watcher has seen the child die (True) or the timeout passes (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.state is ServerState.CRASHED:
                return True
            time.sleep(0.05)
        return self.state is ServerState.CRASHED

    # ------------------------------------------------------------ stop

    def _kill_group(self) -> None:
        """SIGTERM the whole group, wait, then SIGKILL what is left; reap the leader."""
        proc = self._proc
        if proc is None:
            return
        pgid = proc.pid  # process_group=0: the leader's pid is the group id
        if group_members(pgid):
            signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_timeout_s
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            if not wait_group_gone(pgid, max(0.0, deadline - time.monotonic())):
                signal_group(pgid, signal.SIGKILL)
                wait_group_gone(pgid, 10.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
        self._close_lifeline()
        registry.unregister(self._pid_file)
        self._pid_file = None
        _live_servers.discard(self)

    def stop(self) -> None:
        """Stop the server and everything it spawned. Safe to call twice, or after a crash.

        Callable from another thread while `start()` waits for readiness: the start then gives up.
        """
        self._stopping.set()  # before the lock, which a waiting start() holds
        with self._lock:
            if self._proc is not None:
                self._kill_group()
            watcher = self._watcher
            if watcher is not None and watcher is not threading.current_thread():
                watcher.join(timeout=2.0)
            self._watcher = None
            if self.state is not ServerState.STOPPED:
                self._set_state(ServerState.STOPPED, "" if self.returncode is None else f"exit code {self.returncode}")

    def restart(self, argv_for: ArgvForPort | None = None) -> None:
        """Stop, optionally switch to a new command line (new knobs), start again."""
        with self._lock:
            self.stop()
            if argv_for is not None:
                self._argv_for = argv_for
            self.start()

    def __enter__(self) -> ServerProcess:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __del__(self) -> None:  # last resort; stop() is the contract
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None and not sys.is_finalizing():
            with contextlib.suppress(Exception):
                signal_group(proc.pid, signal.SIGKILL)
