"""The advice `--backend url` gives when its local server runs in another scheduler autogroup (Linux /proc).

A listener started in a session of its own (as from another terminal) is found by its port and told apart
from one started in this process's session (as `--backend vllm` starts vLLM); a remote host, a port no one
listens on and autogroups switched off give no advice.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.serve import autogroup as autogroup_module
from core.serve.autogroup import (
    ROOT_AUTOGROUP,
    autogroup,
    autogroups_enabled,
    listening_pid,
    separate_autogroup_warning,
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/autogroup").is_file(), reason="no autogroups on this kernel")

LISTENER = (
    "import socket, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "print(s.getsockname()[1], flush=True); time.sleep(60)\n"
)


def start_listener(own_session: bool) -> tuple[subprocess.Popen[str], int]:
    placement: dict[str, object] = {"start_new_session": True} if own_session else {"process_group": 0}
    proc = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True, **placement)  # type: ignore[call-overload]
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


@pytest.fixture
def listeners() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_a_server_in_a_session_of_its_own_gets_the_advice(listeners: list) -> None:
    proc, port = start_listener(own_session=True)
    listeners.append(proc)
    assert listening_pid(port) == proc.pid
    assert autogroup(proc.pid) is not None and autogroup(proc.pid) != autogroup(os.getpid())
    advice = separate_autogroup_warning(f"http://127.0.0.1:{port}/", enabled=True)
    assert advice is not None and f"(pid {proc.pid})" in advice and "sched_autogroup_enabled=0" in advice
    assert separate_autogroup_warning(f"http://localhost:{port}", enabled=True) == advice.replace(
        f"http://127.0.0.1:{port}/", f"http://localhost:{port}"
    )
    # Autogroups switched off: the kernel shares the CPU between threads, nothing to advise.
    assert separate_autogroup_warning(f"http://127.0.0.1:{port}", enabled=False) is None


def test_the_root_autogroup_is_a_group_not_unknown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What CI sees: its runner starts pytest without a session of its own, so pytest's autogroup file is empty
    # (the kernel's default group) while a server started with `setsid` has one; the advice must still come.
    for pid, text in {"1": "", "2": "/autogroup-7 nice 0\n"}.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "autogroup").write_text(text)
    monkeypatch.setattr(autogroup_module, "PROC", tmp_path)
    assert autogroup(1) == ROOT_AUTOGROUP and autogroup(2) == "/autogroup-7" and autogroup(3) is None
    monkeypatch.setattr(autogroup_module, "listening_pid", lambda port: 2)
    monkeypatch.setattr(autogroup_module.os, "getpid", lambda: 1)
    advice = separate_autogroup_warning("http://127.0.0.1:8000", enabled=True)
    assert advice is not None and "(/autogroup-7) than slo-console (/autogroup-0)" in advice
    monkeypatch.setattr(autogroup_module, "listening_pid", lambda port: 1)  # both in the root group
    assert separate_autogroup_warning("http://127.0.0.1:8000", enabled=True) is None


def test_a_server_in_this_session_gets_none(listeners: list) -> None:
    proc, port = start_listener(own_session=False)
    listeners.append(proc)
    assert listening_pid(port) == proc.pid and autogroup(proc.pid) == autogroup(os.getpid())
    assert separate_autogroup_warning(f"http://127.0.0.1:{port}", enabled=True) is None


def test_no_advice_for_a_remote_host_or_a_port_no_one_listens_on(listeners: list) -> None:
    proc, port = start_listener(own_session=True)
    listeners.append(proc)
    assert separate_autogroup_warning(f"http://10.1.2.3:{port}", enabled=True) is None
    assert separate_autogroup_warning(f"http://example.invalid:{port}", enabled=True) is None
    proc.kill()
    proc.wait()
    assert listening_pid(port) is None
    assert separate_autogroup_warning(f"http://127.0.0.1:{port}", enabled=True) is None


def test_make_backend_hands_the_advice_to_its_caller(listeners: list) -> None:
    from core.backends.factory import make_backend
    from core.profile import load_profile

    proc, port = start_listener(own_session=True)
    listeners.append(proc)
    told: list[str] = []
    profile = load_profile("quickstart")
    make_backend("url", profile, url=f"http://127.0.0.1:{port}", on_advice=told.append)
    expected = separate_autogroup_warning(f"http://127.0.0.1:{port}")
    assert (expected is not None) == autogroups_enabled()  # the kernel's switch as this machine has it
    assert told == ([expected] if expected is not None else [])
    told.clear()
    make_backend("sim", profile, on_advice=told.append)
    assert told == []
