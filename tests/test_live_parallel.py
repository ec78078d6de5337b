"""Live segments side by side (core/tune/live_parallel.py, issue 24 item 3), over scripted servers: each
segment starts a real child process through the real launcher (ServerProcess: own process group, the
supervisor, a grandchild like vLLM's EngineCore) and serves the segment's load with the simulator, so its
numbers are the same wherever and whenever it runs. Here Ray's part is played by `InProcessSlots` (tasks as
coroutines, at most N at once, as Ray queues tasks by a cluster's slots); tests/test_live_parallel_ray.py
runs the same on a local Ray, and tests/test_live_parallel_live.py on two real vLLM CPU servers."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from core.backend_api import BackendUnavailable
from core.events import null_sink
from core.executor import Executor
from core.profile import Profile, load_calibration, load_profile
from core.serve.cpu_binding import OMP_BIND_ENV
from core.serve.process import ServerProcess
from core.serve.process_group import group_members
from core.tune.job import TuneResult, run_tune
from core.tune.live_parallel import (
    ENV_CPU_SLOTS,
    LIVE_SLOT_RESOURCE,
    _task_profile,
    cpu_slot,
    slot_demand,
)

PAPER = "profiles/slo-tuner-paper.yaml"

SCRIPTED_SERVER = r"""
import http.server, subprocess, sys
port = int(sys.argv[1])
# A grandchild in the server's group, as vLLM's EngineCore is: it must go when the segment's server goes.
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b'{"data": [{"id": "scripted"}]}')
    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


class ScriptedServedBackend:
    """VllmBackend's lifecycle over a scripted server: `start` launches it through ServerProcess with the
    profile's server env (where a CPU slot's core binding goes), `run` holds the server `hold_s` seconds of
    real time and serves the plan with the simulator, `stop` stops the group. Every start and stop is a line
    in `log` (a file any process on the machine can append to: Ray workers do)."""

    def __init__(self, log: Path, hold_s: float, profile: Profile) -> None:
        self.log = log
        self.hold_s = hold_s
        self.profile = profile
        self.calibration = load_calibration(profile)
        self.process: ServerProcess | None = None
        self.knobs: Any = None

    def describe(self) -> dict[str, Any]:
        return {"backend": "vllm", "engine": "scripted"}

    def _note(self, **fields: Any) -> None:
        with self.log.open("a") as handle:
            handle.write(json.dumps({"t": time.time(), "pid": os.getpid(), **fields}) + "\n")

    async def start(self, knobs: Any) -> None:
        self.knobs = knobs
        self.process = ServerProcess(
            lambda host, port: [sys.executable, "-c", SCRIPTED_SERVER, str(port)],
            env=self.profile.server.env,
            log_dir=self.log.parent / "server-logs",
            log_name="scripted",
            startup_timeout_s=120.0,
        )
        await asyncio.to_thread(self.process.start)
        self._note(event="start", pgid=self.process.pid, bind=self.profile.server.env.get(OMP_BIND_ENV))

    async def run(self, plan: Any, observer: Any = None) -> Any:
        from core.backends.sim import SimBackend

        await asyncio.sleep(self.hold_s)
        return await SimBackend(self.calibration, self.knobs, seed=0).run(plan, observer)

    async def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            await asyncio.to_thread(process.stop)
            self._note(event="stop", pgid=process.pid)

    async def close(self) -> None:
        await self.stop()


def scripted_backend(log: Path, hold_s: float, profile: Profile) -> ScriptedServedBackend:
    """A segment task's server factory (module level, so it travels to a Ray worker)."""
    return ScriptedServedBackend(log, hold_s, profile)


class NoVllmBackend:
    """A node without vLLM: the probe at start fails as VllmServer's does (a BackendUnavailable, one line)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    def describe(self) -> dict[str, Any]:
        return {"backend": "vllm", "engine": "missing"}

    async def start(self, knobs: Any) -> None:
        raise BackendUnavailable("no vLLM found; run scripts/install-vllm-cpu.sh (CPU)")

    async def stop(self) -> None:
        return None

    async def close(self) -> None:
        return None


class InProcessSlots(Executor):
    """Ray's part in the fast tests: tasks run as coroutines here, at most `slots` at once; `ray` answers
    the one question the runner asks a cluster (its resources)."""

    parallel = True
    kind = "ray"

    def __init__(self, slots: int, sink: Any = null_sink) -> None:
        super().__init__(sink, "tune")
        self.ray = SimpleNamespace(cluster_resources=lambda: {"CPU": 2.0, LIVE_SLOT_RESOURCE: float(slots)})
        self.slots_total = slots
        self.gate: asyncio.Semaphore | None = None
        self.demands: list[Any] = []

    async def _run(self, fn: Any, args: tuple[Any, ...], demand: Any) -> tuple[Any, float, float]:
        self.demands.append(demand)
        self.gate = self.gate or asyncio.Semaphore(self.slots_total)
        async with self.gate:
            started = time.perf_counter()
            return await fn(*args), time.perf_counter() - started, 0.0


def small_spec(profile: Profile, steps: int = 2) -> Any:
    # Segments in the simulator's virtual time (a fraction of a second of wall time each): the scripted
    # server's hold sets the pace.
    changes = {"algorithm": "hillclimb", "steps": steps, "warmup_s": 5.0, "measure_s": 20.0}
    return profile.tuner.model_copy(update=changes)


def lines(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def most_at_once(log: Path) -> int:
    """The most scripted servers that were up at the same moment."""
    running = peak = 0
    for entry in sorted(lines(log), key=lambda e: (e["t"], e["event"] == "start")):
        running += 1 if entry["event"] == "start" else -1
        peak = max(peak, running)
    return peak


def assert_no_server_left(log: Path, timeout_s: float = 30.0) -> None:
    groups = {e["pgid"] for e in lines(log) if e["event"] == "start"}
    deadline = time.monotonic() + timeout_s
    while any(group_members(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert groups and not any(group_members(g) for g in groups), "a segment's server outlived it"


def trail(result: TuneResult) -> list[tuple[str, float, float]]:
    return [(s.key, s.score, s.p99_s) for s in result.history]


async def tune_on_slots(
    profile: Profile, spec: Any, executor: Executor, log: Path, hold_s: float, sink: Any = null_sink, **options: Any
) -> TuneResult:
    """A live tune whose segments go to `executor`'s slots, each on a scripted server holding `hold_s`."""
    make_server = functools.partial(scripted_backend, log, hold_s)
    return await run_tune(
        profile, backend_kind="vllm", sink=sink, spec=spec, executor=executor, make_server=make_server, **options
    )


def start_ray_with_two_slots() -> None:
    """A local Ray with two serving slots and a core set for each (its workers inherit the variable)."""
    import ray

    os.environ[ENV_CPU_SLOTS] = "0 1"
    ray.init(
        num_cpus=2,
        resources={LIVE_SLOT_RESOURCE: 2},
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )


def serial_tune(profile: Profile, spec: Any, log: Path) -> TuneResult:
    backend = ScriptedServedBackend(log, 0.0, profile)
    return asyncio.run(run_tune(profile, backend_kind="vllm", sink=lambda e: None, backend=backend, spec=spec))


@pytest.fixture
def cpu_slots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two core sets on this "node", their locks in a directory of the test's own."""
    monkeypatch.setenv(ENV_CPU_SLOTS, "0 1")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    yield


# ------------------------------------------------------------------ slots


def test_a_segment_asks_for_a_gpu_where_the_cluster_has_one_else_a_cpu_slot_else_says_how_to_add_one() -> None:
    assert slot_demand({"CPU": 64, "GPU": 8, LIVE_SLOT_RESOURCE: 2}) == {"num_gpus": 1}
    assert slot_demand({"CPU": 2, LIVE_SLOT_RESOURCE: 2}) == {"resources": {LIVE_SLOT_RESOURCE: 1}}
    with pytest.raises(BackendUnavailable, match=r"ray start --resources '\{\"vllm_slot\": 1\}'"):
        slot_demand({"CPU": 2})


def test_cpu_slots_go_one_per_segment_and_come_back(cpu_slots: None) -> None:
    with cpu_slot() as first, cpu_slot() as second:
        assert (first, second) == ("0", "1")
        with pytest.raises(BackendUnavailable, match="every core set"), cpu_slot(patience_s=0.2):
            pass
    with cpu_slot() as again:
        assert again == "0"


HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_a_core_set_held_a_moment_longer_by_another_process_is_waited_for(tmp_path: Path, cpu_slots: None) -> None:
    """A set released a moment ago can still be held by a child another thread forked before the release,
    until it reaches exec: the segment waits for it rather than failing (a suite run failed here)."""
    with cpu_slot() as first:
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD_LOCK, str(tmp_path / "slo-console-vllm-cpu-1.lock"), "0.5"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            started = time.monotonic()
            with cpu_slot() as second:
                waited = time.monotonic() - started
        finally:
            holder.wait(timeout=30)
    assert (first, second) == ("0", "1")
    assert waited > 0.1  # it did wait for the holder, which let go when it ended


def test_without_cpu_slots_vllm_binds_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_CPU_SLOTS, raising=False)
    with cpu_slot() as bind:
        assert bind is None


def test_a_segment_task_serves_on_a_free_port_and_its_slots_cores_unless_the_profile_binds_them() -> None:
    profile = load_profile(PAPER)
    pinned = profile.model_copy(update={"server": profile.server.model_copy(update={"port": 8000})})
    served = _task_profile(pinned, "1")
    assert served.server.port == 0 and served.server.env[OMP_BIND_ENV] == "1"
    own = profile.model_copy(update={"server": profile.server.model_copy(update={"env": {OMP_BIND_ENV: "3"}})})
    assert _task_profile(own, "1").server.env[OMP_BIND_ENV] == "3"
    assert OMP_BIND_ENV not in _task_profile(profile, None).server.env


# ------------------------------------------------------------------ the tuner


def test_a_hill_climb_measures_each_neighbourhood_side_by_side_and_takes_the_serial_segments(
    tmp_path: Path, cpu_slots: None
) -> None:
    profile = load_profile(PAPER)
    spec = small_spec(profile, steps=1)
    serial = serial_tune(profile, spec, tmp_path / "serial.jsonl")
    log = tmp_path / "parallel.jsonl"
    events: list[Any] = []
    executor = InProcessSlots(2, events.append)
    result = asyncio.run(tune_on_slots(profile, spec, executor, log, 0.5, events.append))
    assert trail(result) == trail(serial) and result.final is not None
    assert result.final.point == serial.final.point  # type: ignore[union-attr]
    assert result.backend["executor"] == "ray" and result.backend["slots"] == 2
    # Two at a time, never more than the slots, each server on a core set of its own.
    assert most_at_once(log) == 2
    starts = [e for e in lines(log) if e["event"] == "start"]
    assert len(starts) == result.segments_used and {e["bind"] for e in starts} == {"0", "1"}
    assert all(d == {"resources": {LIVE_SLOT_RESOURCE: 1}} for d in executor.demands)
    done = [e for e in events if e["event"] == "task_done"]
    assert len(done) == result.segments_used and all(e["task"].startswith("live segment") for e in done)
    assert_no_server_left(log)


def test_an_interrupted_parallel_tune_keeps_finished_segments_and_its_resume_gives_the_same_answer(
    tmp_path: Path, cpu_slots: None
) -> None:
    profile = load_profile(PAPER)
    spec = small_spec(profile, steps=2)
    whole = serial_tune(profile, spec, tmp_path / "serial.jsonl")
    journal = tmp_path / "tune-journal.jsonl"
    log = tmp_path / "parallel.jsonl"

    async def tune(resume: bool) -> TuneResult:
        return await tune_on_slots(profile, spec, InProcessSlots(2), log, 0.3, journal_path=journal, resume=resume)

    def journaled() -> int:
        return sum(1 for line in journal.read_text().splitlines() if '"kind":"segment"' in line)

    async def interrupted() -> TuneResult:
        run = asyncio.ensure_future(tune(resume=False))
        deadline = time.monotonic() + 120
        # Until the first step's first pairs are in; a run that ended first (an error) is awaited below and
        # raises it, rather than the test waiting forever (a suite run once hung here).
        while (not journal.exists() or journaled() < 3) and not run.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if run.done():
            result = await run  # raises what ended it, if it raised
            raise AssertionError(f"the tune ended before 3 segments were journaled: {result}")
        run.cancel()  # Ctrl-C mid-step: two segments are measuring
        return await run

    first = asyncio.run(interrupted())
    assert first.interrupted
    kept = journaled()
    # Cancelled inside the first step (its 8 segments are not all in): the finished ones were journaled as
    # each finished, not when the step's last one did.
    assert 3 <= kept < 8
    assert_no_server_left(log)
    resumed = asyncio.run(tune(resume=True))
    assert not resumed.interrupted and resumed.segments_resumed == kept
    assert trail(resumed) == trail(whole)  # the same segments, so the same answer
    assert resumed.final is not None and resumed.final.point == whole.final.point  # type: ignore[union-attr]
    assert_no_server_left(log)
