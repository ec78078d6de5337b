"""`--executor ray` (core/executor.py, issue 24 item 2): compare's table from Ray tasks on a local Ray is the
serial table, a cancelled job cancels its Ray tasks, and the batch CLI keeps stdout to JSON Lines. CI installs
Ray for these (.ci/run); without it they are skipped."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from core.executor import ExecutorSpec
from tests import test_executor
from tests.fakes import run_batch
from tests.test_executor import assert_compare_as_serial, printed_table, sleepy

ray = pytest.importorskip("ray")
RAY = ExecutorSpec("ray")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    # The test module's own tasks travel by value: Ray's workers do not import the tests package.
    ray.cloudpickle.register_pickle_by_value(test_executor)
    try:
        yield
    finally:
        ray.shutdown()


def test_compare_as_ray_tasks_gives_the_serial_table() -> None:
    assert_compare_as_serial(RAY)
    assert ray.is_initialized()  # the executor joined the running Ray and left it running


def test_cancelling_the_job_cancels_its_ray_tasks() -> None:
    async def main() -> None:
        async with RAY.open() as executor:
            job = asyncio.ensure_future(
                asyncio.gather(executor.run("a", sleepy, 120.0, "a"), executor.run("b", sleepy, 120.0, "b"))
            )
            await asyncio.sleep(3.0)
            job.cancel()
            with pytest.raises(asyncio.CancelledError):
                await job

    started = time.monotonic()
    asyncio.run(main())
    # Both CPUs come back: the sleeping tasks were stopped, not left to run out their two minutes.
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() - started < 60:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU", 0) == 2
    assert time.monotonic() - started < 60


def test_batch_compare_on_ray_prints_json_lines_and_the_serial_table() -> None:
    args = ("--profile", "saber-w2", "--job", "compare", "--requests", "120")
    serial, on_ray = run_batch(*args, "--workers", "1"), run_batch(*args, "--executor", "ray")
    assert serial.returncode == on_ray.returncode == 0, on_ray.stderr
    events: list[dict[str, Any]] = [json.loads(line) for line in on_ray.stdout.splitlines()]  # nothing else
    assert any(e["event"] == "task_done" and e["executor"] == "ray" for e in events)
    assert printed_table(on_ray.stderr) == printed_table(serial.stderr)
