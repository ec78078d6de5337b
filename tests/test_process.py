"""Process manager against harmless fake children (a few lines of python), not vLLM.

The fake server answers GET /v1/models on 127.0.0.1 like vLLM's readiness endpoint and can spawn a
grandchild (as vLLM spawns its EngineCore), ignore SIGTERM, or die at once with an error in its log.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.backend_api import BackendUnavailable
from core.serve.process import (
    ArgvForPort,
    ServerProcess,
    ServerStartError,
    ServerState,
    stop_all_servers,
)
from core.serve.process_group import group_members
from core.serve.server_log import telling_log_line

FAKE_SERVER = r"""
import http.server, os, signal, subprocess, sys, time
port = int(sys.argv[1]); mode = sys.argv[2]
print("fake server starting", flush=True)
if mode == "fail":
    print("INFO some progress", flush=True)
    print("api_server.py: error: unrecognized arguments: --bogus-flag", flush=True)
    print("DeprecationWarning: noise after the cause", flush=True)
    sys.exit(2)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "slow":
    time.sleep(float(sys.argv[3]))
# A grandchild in the same group, like vLLM's EngineCore: it must die with the server.
ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if mode == "stubborn" else "pass"
child = subprocess.Popen([sys.executable, "-c", f"import signal, time; {ignore}; time.sleep(600)"])
print(f"grandchild {child.pid}", flush=True)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/v1/models"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b'{"data": [{"id": "fake"}]}' if ok else b"")
    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def fake(mode: str, *extra: str) -> ArgvForPort:
    return lambda host, port: [sys.executable, "-c", FAKE_SERVER, str(port), mode, *extra]


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    """Servers made by a test; whatever happens, they are stopped and their groups checked empty."""
    made: list[ServerProcess] = []
    yield made
    for server in made:
        server.stop()
        if server.pid is not None:
            assert group_members(server.pid) == [], "process group left behind"


def make(servers: list[ServerProcess], mode: str, log_dir: Path, *extra: str, **kwargs: object) -> ServerProcess:
    states: list[ServerState] = []
    server = ServerProcess(
        fake(mode, *extra),
        log_dir=log_dir,
        log_name="fake",
        on_state=lambda state, detail: states.append(state),
        **kwargs,  # type: ignore[arg-type]
    )
    server.states = states  # type: ignore[attr-defined]
    servers.append(server)
    return server


def grandchild_pid(server: ServerProcess) -> int:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in server.log_tail(50):
            if line.startswith("grandchild "):
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError("fake server never reported its grandchild")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_start_waits_for_readiness_on_a_free_loopback_port(servers: list, log_dir: Path) -> None:
    server = make(servers, "slow", log_dir, "1.0")
    server.start()
    assert server.state is ServerState.READY and server.states == [ServerState.STARTING, ServerState.READY]
    assert server.base_url.startswith("http://127.0.0.1:") and server.port
    assert server.startup_s is not None and server.startup_s >= 1.0
    assert os.getpgid(server.pid) == server.pid  # its own process group
    # ...in this process's session: a session of its own is a scheduler autogroup of its own, and a busy vLLM
    # CPU server there starved this process's client for seconds (core/serve/process.py's docstring).
    assert os.getsid(server.pid) == os.getsid(0)
    assert server.log_path is not None and "fake server starting" in server.log_path.read_text()


def test_stop_kills_the_whole_group_including_grandchildren(servers: list, log_dir: Path) -> None:
    server = make(servers, "ok", log_dir)
    server.start()
    grandchild = grandchild_pid(server)
    assert alive(grandchild)
    server.stop()
    assert server.state is ServerState.STOPPED
    assert not alive(grandchild) and group_members(server.pid) == []
    server.stop()  # idempotent


def test_a_child_that_ignores_sigterm_is_killed(servers: list, log_dir: Path) -> None:
    server = make(servers, "stubborn", log_dir, stop_timeout_s=1.0)
    server.start()
    grandchild = grandchild_pid(server)
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 10
    assert server.returncode == -signal.SIGKILL
    assert not alive(grandchild)


def test_immediate_exit_is_a_one_line_start_error_with_the_log_tail(servers: list, log_dir: Path) -> None:
    server = make(servers, "fail", log_dir)
    with pytest.raises(ServerStartError) as caught:
        server.start()
    error = caught.value
    message = str(error)
    assert isinstance(error, BackendUnavailable)
    assert "\n" not in message
    assert "exited with code 2 during start-up" in message
    assert "unrecognized arguments: --bogus-flag" in message  # the telling line, not the noise after it
    assert str(server.log_path) in message
    assert error.returncode == 2 and any("--bogus-flag" in line for line in error.log_tail)
    assert server.state is ServerState.STOPPED


def test_not_ready_in_time_is_a_start_error_and_leaves_nothing(servers: list, log_dir: Path) -> None:
    server = make(servers, "slow", log_dir, "30", startup_timeout_s=1.5)
    with pytest.raises(ServerStartError, match="not ready after 2 s"):
        server.start()
    assert group_members(server.pid) == []


def test_sigkill_mid_run_is_detected_and_restart_works(servers: list, log_dir: Path) -> None:
    server = make(servers, "ok", log_dir)
    server.start()
    grandchild = grandchild_pid(server)
    first_port = server.port
    os.kill(server.pid, signal.SIGKILL)  # only the leader: the watcher must clean up the rest
    assert server.wait_crashed(5.0)
    assert server.crashed and server.returncode == -signal.SIGKILL
    assert "killed by signal 9" in server.state_detail
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild), "the crashed server's children were left running"
    server.restart()
    assert server.state is ServerState.READY and server.starts == 2
    assert server.port != first_port or server.port is not None
    assert server.states[-4:] == [ServerState.CRASHED, ServerState.STOPPED, ServerState.STARTING, ServerState.READY]


def test_context_manager_and_atexit_hook_stop_everything(servers: list, log_dir: Path) -> None:
    with make(servers, "ok", log_dir) as server:
        pid = server.pid
        assert server.is_running()
    assert group_members(pid) == []
    other = make(servers, "ok", log_dir)
    other.start()
    stop_all_servers()  # what atexit runs at interpreter exit
    assert group_members(other.pid) == []


def test_stop_from_another_thread_cancels_a_waiting_start(servers: list, log_dir: Path) -> None:
    server = make(servers, "slow", log_dir, "30")
    threading.Timer(1.0, server.stop).start()
    started = time.monotonic()
    with pytest.raises(ServerStartError, match="cancelled"):
        server.start()
    assert time.monotonic() - started < 10
    assert group_members(server.pid) == []


def test_a_missing_executable_is_a_start_error(log_dir: Path) -> None:
    server = ServerProcess(lambda host, port: ["/nonexistent/python", str(port)], log_dir=log_dir)
    with pytest.raises(ServerStartError, match="cannot execute /nonexistent/python"):
        server.start()


def test_telling_line_skips_noise_and_vllm_prefixes() -> None:
    lines = [
        "(APIServer pid=12) INFO 11-21 ready soon",
        "(APIServer pid=12) ValueError: max_num_batched_tokens (512) is smaller than max_model_len (1024)",
        "  warnings.warn(",
        "/x.py:1: UserWarning: resource_tracker: There appear to be 1 leaked semaphore objects",
    ]
    assert telling_log_line(lines).startswith("ValueError: max_num_batched_tokens (512)")
    assert telling_log_line(["just a line"]) == "just a line"
    assert telling_log_line([]) == ""


OWNER = r"""
import pathlib, sys, time
sys.path.insert(0, sys.argv[1])
from core.serve.process import ServerProcess
fake_server, log_dir = sys.argv[2], pathlib.Path(sys.argv[3])
server = ServerProcess(lambda host, port: [sys.executable, "-c", fake_server, str(port), "ok"], log_dir=log_dir)
server.start()
print(server.pid, flush=True)
time.sleep(600)
"""


def start_owner(log_dir: Path, tmp_path: Path) -> tuple[Any, int]:
    """Another python that starts a fake server (OWNER): the process and the server's group id."""
    import subprocess

    repo = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "SLO_CONSOLE_CACHE": str(tmp_path / "cache")}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, repo, FAKE_SERVER, str(log_dir)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert owner.stdout is not None
    return owner, int(owner.stdout.readline())


def wait_group_gone_or_fail(pgid: int, timeout_s: float, message: str) -> None:
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert group_members(pgid) == [], message


def test_a_server_dies_with_its_owner_even_on_sigkill(log_dir: Path, tmp_path: Path) -> None:
    owner, pgid = start_owner(log_dir, tmp_path)
    try:
        assert group_members(pgid), "the server never started"
        registered = list((tmp_path / "cache" / "servers").glob("*.json"))
        assert [p.stem for p in registered] == [str(pgid)]
        owner.kill()  # SIGKILL: no atexit, no finally in the owner
        owner.wait()
        wait_group_gone_or_fail(pgid, 10, "the server outlived the slo-console that started it")
    finally:
        owner.kill()


def test_a_server_goes_when_its_owner_and_its_supervisor_are_both_sigkilled(log_dir: Path, tmp_path: Path) -> None:
    # What Ray does when a task's worker ends: the worker is killed and its direct children, the supervisor
    # among them, are SIGKILLed too. Neither can stop the group; the supervisor's warden does.
    owner, pgid = start_owner(log_dir, tmp_path)
    try:
        assert len(group_members(pgid)) >= 3, "supervisor, warden, server (and its grandchild) never started"
        os.kill(owner.pid, signal.SIGSTOP)  # frozen: its crash watcher cannot stop the group for it
        os.kill(pgid, signal.SIGKILL)  # the supervisor
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        wait_group_gone_or_fail(pgid, 15, "the server outlived its killed owner and supervisor")
    finally:
        owner.kill()


def test_a_stale_server_from_an_earlier_run_is_reported_not_killed(
    servers: list, log_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import json
    import subprocess

    from core.serve.registry import stale_servers

    monkeypatch.setenv("SLO_CONSOLE_CACHE", str(tmp_path / "cache"))
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        registry = tmp_path / "cache" / "servers"
        registry.mkdir(parents=True)
        # Its owner: a pid that is not running any more.
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        record = {"pgid": orphan.pid, "owner_pid": gone.pid, "owner_start_ticks": 1, "port": 8123, "argv": ["vllm"]}
        (registry / f"{orphan.pid}.json").write_text(json.dumps(record))
        (registry / "999999999.json").write_text(json.dumps({**record, "pgid": 999_999_999}))  # group gone

        found = stale_servers(group_members)
        assert [s.pgid for s in found] == [orphan.pid]
        assert f"kill -- -{orphan.pid}" in found[0].describe()
        assert not (registry / "999999999.json").exists()  # forgotten: nothing left to report

        server = make(servers, "ok", log_dir)
        with caplog.at_level("WARNING", logger="slo_console"):
            server.start()
        assert [s.pgid for s in server.stale] == [orphan.pid]
        assert any(f"process group {orphan.pid}" in r.getMessage() for r in caplog.records)
        assert orphan.poll() is None  # reported, never killed on this evidence
    finally:
        orphan.kill()
        orphan.wait()


def test_a_server_started_from_a_worker_thread_outlives_the_thread(servers: list, log_dir: Path) -> None:
    # asyncio.to_thread starts servers from executor threads that end with their loop; the server must not.
    server = make(servers, "ok", log_dir)
    starter = threading.Thread(target=server.start)
    starter.start()
    starter.join()
    time.sleep(1.0)
    assert server.is_running() and server.state is ServerState.READY
