"""The executor seam (core/executor.py, issue 24): the same tables from a process pool as from one process,
results handed back in the order asked, progress as tasks finish, Ctrl-C ends the workers, and the options
that choose it. Ray: tests/test_executor_ray.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from subprocess import DEVNULL
from typing import Any

import pytest

from core.capacity import find_capacity, run_capacity
from core.capacity import format_table as capacity_table
from core.compare import compare_summary_event, format_table, run_compare
from core.events import Event
from core.executor import SERIAL, ExecutorSpec, RayMissing
from core.jobs.options import OperatorOptions, UsageError
from core.profile import Profile, ProfileError, load_profile
from core.tune.job import run_tune
from tests.fakes import run_batch

POOL = ExecutorSpec(workers=2)
ROOT = Path(__file__).resolve().parent.parent


def small_saber_w1() -> Profile:
    profile = load_profile("saber-w1")
    return profile.model_copy(update={"saber": profile.saber.model_copy(update={"static_caps": [10, 40, 70]})})


def without_wall(value: Any) -> Any:
    """An event with its wall-clock fields dropped: the only figures that may differ between executors."""
    if isinstance(value, dict):
        return {k: without_wall(v) for k, v in value.items() if not k.endswith("wall_s") and k != "ts"}
    if isinstance(value, list):
        return [without_wall(v) for v in value]
    return value


def printed_table(stderr: str) -> list[str]:
    """The compare table a batch run logs on stderr (the lines after its heading) and the verdict line."""
    lines = stderr.splitlines()
    heading = next(i for i, line in enumerate(lines) if ": compare, seed " in line)
    table = []
    for line in lines[heading + 1 :]:
        if line.startswith("slo-console: "):
            break
        table.append(line)
    return [*table, lines[-1]]


async def compare_on(spec: ExecutorSpec, profile: Profile) -> tuple[Any, list[Event]]:
    events: list[Event] = []
    async with spec.open(events.append, "compare") as executor:
        result = await run_compare(profile, requests=200, sink=events.append, executor=executor)
    return result, events


def assert_compare_as_serial(spec: ExecutorSpec) -> None:
    """Compare on `spec` gives the serial table, summary and events (plus one `task_done` per task)."""
    profile = small_saber_w1()
    serial, serial_events = asyncio.run(compare_on(SERIAL, profile))
    other, other_events = asyncio.run(compare_on(spec, profile))
    assert format_table(other) == format_table(serial)
    assert without_wall(compare_summary_event(other)) == without_wall(compare_summary_event(serial))
    # Rows in the same order, whatever finished first; a parallel executor adds one progress event per task.
    rows = [without_wall(e) for e in serial_events]
    assert [without_wall(e) for e in other_events if e["event"] != "task_done"] == rows
    done = [e for e in other_events if e["event"] == "task_done"]
    assert len(done) == 4 + 3 and {e["executor"] for e in done} == {spec.kind}  # 4 modes, 3 static caps
    assert all(e["cpu_s"] > 0 and e["wall_s"] > 0 for e in done)  # measured where the task ran
    assert not any(e["event"] == "task_done" for e in serial_events)
    # The factsheet's run keeps its records; the request records are the serial run's.
    mode = profile.mode
    assert [r.e2e_s for r in other.runs[mode].records] == [r.e2e_s for r in serial.runs[mode].records]


def test_compare_on_two_workers_gives_the_serial_table_byte_for_byte() -> None:
    assert_compare_as_serial(POOL)


def test_capacity_on_two_workers_gives_the_serial_table_and_probes() -> None:
    profile = load_profile("quickstart")

    async def capacity(spec: ExecutorSpec) -> list[Any]:
        async with spec.open() as executor:
            return await run_capacity(
                profile, modes=["fcfs", "saber", "adaserve"], requests=300, rel_tol=0.1, executor=executor
            )

    serial = asyncio.run(capacity(SERIAL))
    pooled = asyncio.run(capacity(POOL))
    assert capacity_table(profile, pooled) == capacity_table(profile, serial)
    assert all(r.capacity_rps > 0 for r in serial)  # bisected, not given up at the bracket
    assert [without_wall(r.fields()) for r in pooled] == [without_wall(r.fields()) for r in serial]


def test_a_guided_tune_on_two_workers_takes_the_serial_segments() -> None:
    profile = load_profile("profiles/slo-tuner-paper.yaml")
    spec = profile.tuner.model_copy(
        update={"algorithm": "guided", "segment_budget": 6, "sim_min_requests": 120, "sim_min_duration_s": 8.0}
    )

    async def tune(executor_spec: ExecutorSpec) -> Any:
        async with executor_spec.open() as executor:
            return await run_tune(profile, sink=lambda e: None, spec=spec, executor=executor)

    serial, pooled = asyncio.run(tune(SERIAL)), asyncio.run(tune(POOL))
    assert serial.sim_segments > 20  # the guide swept the space: the part that runs side by side

    def trail(result: Any) -> list[tuple[str, float, float]]:
        return [(s.key, s.score, s.p99_s) for s in result.history]

    assert trail(pooled) == trail(serial)
    assert (pooled.sim_segments, pooled.final.point) == (serial.sim_segments, serial.final.point)


# ------------------------------------------------------------------ the executor itself


async def sleepy(seconds: float, answer: str) -> str:
    await asyncio.sleep(seconds)
    return answer


async def refuses(message: str) -> None:
    raise ProfileError(message)


async def pid_then_sleep(seconds: float) -> int:
    await asyncio.sleep(seconds)
    return os.getpid()


def test_results_come_back_in_the_order_asked_and_progress_as_tasks_finish() -> None:
    events: list[Event] = []

    async def main() -> list[str]:
        async with POOL.open(events.append, "test") as executor:
            starts = [
                lambda: executor.run("slow", sleepy, 1.0, "first"),
                lambda: executor.run("fast", sleepy, 0.05, "second"),
            ]
            async with contextlib.aclosing(executor.in_order(starts)) as results:
                return [answer async for answer in results]

    assert asyncio.run(main()) == ["first", "second"]
    assert [(e["task"], e["done"]) for e in events] == [("fast", 1), ("slow", 2)]


def test_a_tasks_error_reaches_the_caller_with_its_type() -> None:
    async def main() -> None:
        async with POOL.open() as executor:
            await executor.run("refuses", refuses, "no such mode here")

    with pytest.raises(ProfileError, match="no such mode here"):
        asyncio.run(main())


def test_cancelling_the_job_terminates_the_pools_workers() -> None:
    processes: list[Any] = []

    async def main() -> None:
        async with POOL.open() as executor:
            started = time.monotonic()
            job = asyncio.ensure_future(
                asyncio.gather(executor.run("a", pid_then_sleep, 60.0), executor.run("b", pid_then_sleep, 60.0))
            )
            await asyncio.sleep(1.0)
            assert executor.pool is not None
            processes.extend(executor.pool._processes.values())
            job.cancel()
            with pytest.raises(asyncio.CancelledError):
                await job
            assert time.monotonic() - started < 30

    asyncio.run(main())
    assert len(processes) == 2 and not any(p.is_alive() for p in processes)


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(child) for child in path.read_text().split()] if path.exists() else []


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan that nobody has reaped yet is gone all the same)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_killing_the_command_outright_ends_its_workers() -> None:
    command = [sys.executable, "-m", "console", "--batch", "--profile", "saber-w1", "--job", "compare"]
    proc = subprocess.Popen([*command, "--workers", "2"], cwd=ROOT, stdout=DEVNULL, stderr=DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while len(children_of(proc.pid)) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = children_of(proc.pid)
        assert len(workers) == 2, "the pool never started"
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while any(running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(running(pid) for pid in workers)


def test_one_worker_is_the_serial_path_in_this_process() -> None:
    async def main() -> int:
        async with ExecutorSpec(workers=1).open() as executor:
            assert not executor.parallel
            return await executor.run("here", pid_then_sleep, 0.0)

    assert asyncio.run(main()) == os.getpid()


# ------------------------------------------------------------------ options


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (OperatorOptions(workers=0), "--workers must be at least 1"),
        (OperatorOptions(ray_address="auto"), "--ray-address is for --executor ray"),
    ],
)
def test_bad_executor_options_are_usage_errors(options: OperatorOptions, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        options.check()


def test_executor_ray_without_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("core.jobs.options.ray_installed", lambda: False)
    with pytest.raises(UsageError, match=r"pip install 'slo-console\[ray\]'"):
        OperatorOptions(job="compare", executor="ray").check()
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # `import ray` fails as if not installed
    with pytest.raises(RayMissing, match=r"pip install 'slo-console\[ray\]'"):
        ExecutorSpec("ray").make()


def test_batch_compare_with_workers_1_and_2_prints_the_same_table() -> None:
    args = ("--profile", "saber-w2", "--job", "compare", "--requests", "120")
    one, two = run_batch(*args, "--workers", "1"), run_batch(*args, "--workers", "2")
    assert one.returncode == two.returncode == 0, two.stderr
    assert printed_table(two.stderr) == printed_table(one.stderr)
    assert len(printed_table(one.stderr)) == 1 + 5 + 1  # header, 4 modes and the best static cap, verdict
    summaries = [json.loads(proc.stdout.splitlines()[-1]) for proc in (one, two)]
    assert without_wall(summaries[1]) == without_wall(summaries[0])


def test_capacity_looking_ahead_asks_the_same_probes_and_finds_the_same_capacity() -> None:
    profile = load_profile("quickstart")

    async def capacity(spec: ExecutorSpec, lookahead: bool) -> tuple[Any, int]:
        async with spec.open() as executor:
            found = await find_capacity(
                profile, "fcfs", requests=300, rel_tol=0.02, executor=executor, lookahead=lookahead
            )
            return found, executor.started

    serial, _ = asyncio.run(capacity(SERIAL, False))
    ahead, started = asyncio.run(capacity(POOL, True))
    assert serial.capacity_rps > 0 and len(serial.probes) >= 5  # a bisection of several steps to look ahead in
    assert started > len(ahead.probes)  # it did start probes nobody asked for yet
    assert without_wall(ahead.fields()) == without_wall(serial.fields())


def test_tasks_waiting_for_a_worker_start_most_urgent_first_then_in_the_order_asked() -> None:
    from core.executor import UrgencyGate

    async def scenario() -> list[str]:
        gate = UrgencyGate(1)
        started: list[str] = []
        release = asyncio.Event()

        async def task(name: str, urgency: float) -> None:
            async with gate.slot(urgency):
                started.append(name)
                if name == "first":
                    await release.wait()

        first = asyncio.ensure_future(task("first", 0.0))
        await asyncio.sleep(0)
        waiting = [
            asyncio.ensure_future(task(name, urgency))
            for name, urgency in [("slow-a", 0.1), ("chain", 0.9), ("gone", 5.0), ("slow-b", 0.1), ("mid", 0.5)]
        ]
        await asyncio.sleep(0)
        waiting[2].cancel()  # cancelled while it waits: skipped, its place passes on
        release.set()
        await asyncio.gather(first, *waiting, return_exceptions=True)
        return started

    assert asyncio.run(scenario()) == ["first", "chain", "mid", "slow-a", "slow-b"]


def test_a_task_cancelled_as_its_slot_arrives_hands_the_slot_on() -> None:
    from core.executor import UrgencyGate

    async def scenario() -> list[str]:
        gate = UrgencyGate(1)
        started: list[str] = []

        async def task(name: str) -> None:
            async with gate.slot(0.0):
                started.append(name)

        async with gate.slot(0.0):
            doomed = asyncio.ensure_future(task("doomed"))
            after = asyncio.ensure_future(task("after"))
            await asyncio.sleep(0)
        # The holder has handed its slot to `doomed`, which has not run yet: cancelled now, it must pass it on.
        doomed.cancel()
        await asyncio.wait_for(asyncio.gather(doomed, after, return_exceptions=True), timeout=10)
        return started

    assert asyncio.run(scenario()) == ["after"]


def test_an_adopted_saber_offline_phase_is_used_instead_of_profiling_again() -> None:
    from core.control.saber.speed_model import SpeedProfile, adopt_offline_phase, offline_phase
    from core.profile import load_calibration

    profile = load_profile("quickstart")
    calibration = load_calibration(profile)
    adopted = SpeedProfile(samples=[])

    def simulate(*_: Any) -> Any:
        raise AssertionError("profiled again")

    adopt_offline_phase(profile, calibration, adopted, loads=(1, 2, 97), seed=12345)
    assert offline_phase(profile, calibration, simulate, loads=(1, 2, 97), seed=12345) is adopted
    with pytest.raises(AssertionError, match="profiled again"):  # another seed is another phase
        offline_phase(profile, calibration, simulate, loads=(1, 2, 97), seed=12346)
