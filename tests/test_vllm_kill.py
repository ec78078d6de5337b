"""SIGKILL of `slo-console --batch --backend vllm` mid-run: nothing orphaned, nothing measured lost. And SIGKILL
of the vLLM behind the gateway mid-run: every request the gateway received is accounted for.

Against a REAL vLLM (the CPU build, the built-in tiny model); skipped unless SLO_CONSOLE_VLLM_PYTHON is set.
The run is frozen (SIGSTOP) so the server's count of finished requests can be read while the client cannot
finish more, then killed with SIGKILL: no atexit, no finally, no signal handler runs in slo-console.
vLLM's processes are found by the process group slo-console registered for the server (its pid file in the
cache), never by name.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from core.backends.launched_replicas import LaunchedReplicas
from core.control.concurrency_cap import ConcurrencyCapPolicy
from core.gateway.server import Gateway
from core.profile import load_profile
from core.serve.process_group import group_members
from core.serve.prom import parse_metrics
from core.serve.registry import registry_dir
from tests.fakes import REPO
from tests.test_replica_swap_live import _profile_file

CLIENTS = 8  # the profile's closed-loop clients: at most this many requests are in flight

pytestmark = pytest.mark.vllm  # skipped without a vLLM python (tests/conftest.py)


def registered_server(owner_pid: int, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in registry_dir().glob("*.json"):
            try:
                record = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if record.get("owner_pid") == owner_pid:
                return record
        time.sleep(0.5)
    raise AssertionError(f"slo-console (pid {owner_pid}) registered no server in {timeout_s:.0f} s")


def lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_sigkill_mid_run_leaves_no_vllm_and_keeps_every_finished_request(tmp_path: Path) -> None:
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "console", "--batch", "--profile", str(REPO / "profiles" / "vllm-cpu-tiny.yaml")]
    argv += ["--backend", "vllm", "--requests", "100000", "--duration", "600", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pgid = None
    try:
        server = registered_server(run.pid, timeout_s=300)
        pgid = int(server["pgid"])
        assert group_members(pgid), "the registered process group is empty"
        # Let it measure for a while: at least 40 requests written as they finished.
        deadline = time.monotonic() + 300
        while len(lines(out / "requests.jsonl")) < 40 and time.monotonic() < deadline:
            assert run.poll() is None, run.stderr.read().decode() if run.stderr else ""
            time.sleep(0.5)
        os.kill(run.pid, signal.SIGSTOP)  # the client can finish no more requests from here
        metrics = parse_metrics(httpx.get(f"http://127.0.0.1:{server['port']}/metrics", timeout=30).text)
        assert metrics.e2e_latency_s is not None
        finished_at_server = metrics.e2e_latency_s.count  # vLLM's e2e histogram counts finished requests
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=10)
        killed_at = time.monotonic()
        while group_members(pgid) and time.monotonic() - killed_at < 10:
            time.sleep(0.1)
        assert group_members(pgid) == [], f"vLLM outlived slo-console: pids {group_members(pgid)} still running"

        written = lines(out / "requests.jsonl")  # every line parses: nothing half-written
        ok = [r for r in written if r["status"] == "ok"]
        assert finished_at_server >= 40
        # Every request the server finished was recorded, except those whose last bytes were still on the way
        # to the frozen client (at most one per client).
        assert finished_at_server - CLIENTS <= len(ok) <= finished_at_server
        assert len({r["request_id"] for r in written}) == len(written)
    finally:
        if run.poll() is None:
            run.kill()
        if pgid is not None and group_members(pgid):
            os.killpg(pgid, signal.SIGKILL)  # never leave a server behind, even when the test fails


async def _client_until(url: str, model: str, stop: asyncio.Event, outcomes: list[str]) -> None:
    """Closed loop until `stop`; each request ends as 'ok' (200 and the stream's [DONE]) or 'failed'."""
    body = {"model": model, "prompt": "hello " * 16, "max_tokens": 32, "ignore_eos": True, "stream": True}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        while not stop.is_set():
            try:
                async with session.post(url + "/v1/completions", json=body) as response:
                    data = await response.read()
                    whole = response.status == 200 and data.rstrip().endswith(b"data: [DONE]")
                    outcomes.append("ok" if whole else "failed")
            except aiohttp.ClientError:
                outcomes.append("failed")  # the stream cut short by the dying upstream
            if outcomes[-1] == "failed":
                await asyncio.sleep(0.05)  # a dead upstream answers at once: do not spin


def test_sigkill_of_vllm_behind_the_gateway_accounts_for_every_request(tmp_path: Path) -> None:
    """vLLM is SIGKILLed under steady load from CLIENTS clients: the requests in flight fail, every later one
    fails fast (none hangs), and the gateway's account matches what the clients saw, request for request."""
    profile = load_profile(_profile_file(tmp_path))
    outcomes: list[str] = []
    found: dict[str, Any] = {}

    async def scenario() -> None:
        replicas = LaunchedReplicas(profile, sink=lambda _event: None)
        try:
            first = await replicas.start_first()
            pgid = replicas.servers[0].process.pid  # type: ignore[union-attr]  # the server leads its group
            found["pgid"] = pgid
            async with Gateway([first], ConcurrencyCapPolicy(cap=8), profile=profile) as gateway:
                async with aiohttp.ClientSession() as session, session.get(first + "/v1/models") as response:
                    model = (await response.json())["data"][0]["id"]
                stop = asyncio.Event()
                clients = [
                    asyncio.create_task(_client_until(gateway.base_url, model, stop, outcomes)) for _ in range(3)
                ]
                deadline = time.monotonic() + 120
                while gateway.stats.completed < 10:
                    assert time.monotonic() < deadline, f"no steady load: {gateway.stats.as_dict()}"
                    await asyncio.sleep(0.1)
                found["completed_at_kill"] = gateway.stats.completed
                found["open_at_kill"] = gateway.stats.open()  # read, held or in flight upstream
                os.killpg(pgid, signal.SIGKILL)
                await asyncio.sleep(5)  # the clients keep sending to the dead upstream
                stop.set()
                await asyncio.wait_for(asyncio.gather(*clients), 60)  # nobody waits forever
                await gateway.settle(30)
                found["stats"] = gateway.stats.as_dict()
                found["accounted"] = gateway.stats.accounted()
        finally:
            await replicas.close()

    asyncio.run(scenario())
    stats = found["stats"]
    print(f"vLLM killed with {found['open_at_kill']} open; gateway {stats}; clients saw {len(outcomes)}")
    assert found["accounted"] and stats["received"] == len(outcomes)
    assert stats["completed"] == outcomes.count("ok")
    assert stats["failed"] + stats["rejected"] + stats["deferred"] == outcomes.count("failed")
    # The kill cut what was in flight, and nothing new completed on a dead server.
    assert stats["completed"] - found["completed_at_kill"] <= 3  # the 3 clients
    assert outcomes.count("failed") >= found["open_at_kill"] + 10
    assert group_members(found["pgid"]) == []
