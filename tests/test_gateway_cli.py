"""`slo-console gateway` as a user runs it: a subprocess in front of a scripted upstream, exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys

import aiohttp

from tests.fakes import REPO
from tests.fakeserver import FakeOpenAIServer, StreamReply


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "console", "gateway", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_usage_and_unreachable_upstream_exit_codes() -> None:
    cases = [
        (cli("--port", "0", "--upstream", "not-a-url"), 2, "is not a URL"),
        (cli("--port", "0", "--upstream", "http://127.0.0.1:9", "--mode", "nope"), 2, "is not a scheduling mode"),
        (cli("--port", "0", "--upstream", "http://127.0.0.1:9"), 3, "upstream unreachable"),
        (cli("--port", "0"), 2, "--upstream"),
        (cli("--port", "0", "--upstream", "http://127.0.0.1:9", "--one-replica"), 2, "--one-replica is for --launch"),
    ]
    for argv, code, message in cases:
        done = subprocess.run(argv, capture_output=True, text=True, env=env(), cwd=REPO, timeout=60)
        assert done.returncode == code, (argv, done.stderr)
        assert message in done.stderr


def test_serves_an_openai_client_and_reports_its_counters_on_sigterm() -> None:
    async def scenario() -> None:
        async with FakeOpenAIServer(StreamReply()) as fake:
            process = await asyncio.create_subprocess_exec(
                *cli("--profile", "quickstart", "--upstream", fake.base_url, "--port", "0", "--log-requests"),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env(),
                cwd=REPO,
                start_new_session=True,
            )
            try:
                assert process.stderr is not None and process.stdout is not None
                line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
                match = re.search(r"serving on (http://\S+)", line)
                assert match, line
                assert "uvloop loop" in line  # uvloop is a dependency: the standalone gateway serves on it
                url = match.group(1)
                body = {"model": "fake-model", "prompt": "hi", "max_tokens": 3, "stream": True}
                async with aiohttp.ClientSession() as session:
                    async with session.post(url + "/v1/completions", json=body) as response:
                        assert response.status == 200
                        assert (await response.read()).rstrip().endswith(b"data: [DONE]")
                    async with session.get(url + "/gateway/stats") as response:
                        stats = await response.json()
                assert (stats["received"], stats["completed"], stats["mode"]) == (1, 1, "fcfs")
                process.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(process.wait(), 30) == 0
                events = [json.loads(x) for x in (await process.stdout.read()).decode().splitlines()]
                names = [e["event"] for e in events]
                assert names == ["gateway_started", "gateway_request", "gateway_stopped"]
                assert events[-1]["completed"] == 1 and events[-1]["received"] == 1
            finally:
                if process.returncode is None:
                    os.killpg(process.pid, signal.SIGKILL)
                    await process.wait()

    asyncio.run(scenario())


def test_settle_heap_takes_the_start_up_heap_out_of_the_collectors_view() -> None:
    import gc

    from core.gateway.standalone import settle_heap

    before = gc.get_freeze_count()
    try:
        settle_heap()
        assert gc.get_freeze_count() > max(before, 1000)  # the imported modules' objects at least
        assert len(gc.get_objects(generation=2)) < gc.get_freeze_count()
    finally:
        gc.unfreeze()
