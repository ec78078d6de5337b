"""Where the soak's load comes from (benchmarks/soak.py): the open-loop client and the misbehaving upstream.

By default each runs in a process of its own (`ProcessLoad`), so the gateway's process runs the gateway
alone, as in production, and the added latency the soak measures is the gateway's, not the time the client
or the upstream took on a shared event loop. `InProcessLoad` runs both on the gateway's own loop (the soak's
first form; `--in-process`).

A worker process is `python supervise.py LIFELINE -- python -m benchmarks.soak_load ROLE ARGS` (argv lists
only): core/serve/supervise.py leads its process group and stops the group when the soak's process is gone
by any means, SIGKILL included (the lifeline pipe's write end closes with it). The worker talks over its
stdin/stdout: one word a line for each step, then its record pickled back (benchmarks/soak_ledger.py). Each
side draws the same seeded schedule, so only the records travel.

Steps: upstream `ready URL` ... `stop` -> record; client `warm` <- `go` (the soak counts memory in between),
`drained` (every request but the deferred ended, or DRAIN_S passed) <- `ended` (the gateway was told the load
ended, so the deferred are answered), `done` -> record.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import pickle
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from benchmarks.soak_faults import CLIENT_TIMEOUT_S, FAULTS, Upstream, arrival_gaps, draw_faults, send_one
from benchmarks.soak_ledger import ClientRecord, ErrorLogs, UpstreamRecord, cpu_s, open_fds
from core.serve.process import SUPERVISOR

REPO = Path(__file__).resolve().parents[1]  # a worker runs there, so `benchmarks` imports
DRAIN_S = 15.0  # after the arrivals, how long open requests may take to end
START_S = 60.0  # a worker's start-up (interpreter and imports) on a loaded machine, at most
WARM_S = 30.0  # the warm-up requests (one hangs until the gateway's 3 s upstream deadline)
GRACE_S = 2.0  # the supervisor's SIGTERM-to-SIGKILL grace when the soak's process is gone
SLACK_S = 30.0  # a step that should take well under a second: how long before the soak gives up on it

Step = Callable[[], Awaitable[None]]


async def drive(
    url: str,
    faults: Sequence[str],
    gaps: np.ndarray,
    max_seconds: float,
    record: ClientRecord,
    warmed: Step,
    drained: Step,
) -> None:
    """The client: warm-up, then open-loop arrivals at the seeded gaps for at most `max_seconds`, each request
    with its fault; `warmed` and `drained` are the steps above (each returns when the soak says go on)."""

    async def client(session: aiohttp.ClientSession, index: int, fault: str) -> None:
        # A deferred request is answered when the load ends: its client waits for the whole run.
        wait_s = max_seconds + DRAIN_S if fault == "deferred" else CLIENT_TIMEOUT_S
        record.on_sent(index, await send_one(session, url, index, fault, wait_s))

    # No session deadline (aiohttp's default is 300 s): a deferred request waits for the whole run.
    no_deadline = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=no_deadline) as session:
        # Warm-up, not counted: one request of each fault (but `deferred`) fills the caches its code path keeps
        # for good (compiled patterns, exception classes), so the live-memory count after the run sees only
        # what the run left.
        warm = [name for name in FAULTS if name != "deferred"]
        await asyncio.gather(*(client(session, len(faults) + k, name) for k, name in enumerate(warm)))
        await warmed()
        open_clients: set[asyncio.Task[None]] = set()
        deferred: set[asyncio.Task[None]] = set()
        start = due = time.perf_counter()
        for index, fault in enumerate(faults):
            due += gaps[index]
            if time.perf_counter() - start > max_seconds:
                break
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(client(session, index, fault))
            group = deferred if fault == "deferred" else open_clients
            group.add(task)
            task.add_done_callback(group.discard)
            record.sent += 1
        # Everything but the deferred requests ends by itself; then the load is over and they are answered.
        deadline = time.perf_counter() + DRAIN_S
        while open_clients and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)
        await drained()
        remaining = open_clients | deferred
        if remaining:
            await asyncio.wait(remaining, timeout=max(0.1, deadline - time.perf_counter()))
        for task in remaining:
            task.cancel()
        await asyncio.gather(*remaining, return_exceptions=True)


# ---------------------------------------------------------------- the load on the gateway's own loop


class InProcessLoad:
    """Client and upstream on the soak's (the gateway's) event loop."""

    def __init__(self, requests: int, rate: float, seed: int, faulty: bool, max_seconds: float) -> None:
        self._faults, self._gaps = draw_faults(requests, seed, faulty), arrival_gaps(requests, rate, seed)
        self._max_seconds = max_seconds
        self.client_record, self.upstream_record = ClientRecord(requests), UpstreamRecord(requests)
        self._upstream = Upstream(on_served=self.upstream_record.on_served)
        self._upstream_started = False
        self._task: asyncio.Task[None] | None = None
        self._reached = {step: asyncio.Event() for step in ("warm", "drained")}
        self._allowed = {step: asyncio.Event() for step in ("go", "ended")}

    async def start_upstream(self) -> str:
        await self._upstream.start()
        self._upstream_started = True
        return self._upstream.url

    async def start_client(self, url: str) -> None:
        async def step(reached: str, allowed: str) -> None:
            self._reached[reached].set()
            await self._allowed[allowed].wait()

        drive_it = drive(url, self._faults, self._gaps, self._max_seconds, self.client_record,
                         lambda: step("warm", "go"), lambda: step("drained", "ended"))  # fmt: skip
        self._task = asyncio.create_task(drive_it)
        await self._until("warm")

    async def run_arrivals(self) -> None:
        self._allowed["go"].set()
        await self._until("drained")

    async def finish(self) -> None:
        self._allowed["ended"].set()
        assert self._task is not None
        await self._task

    async def _until(self, step: str) -> None:
        assert self._task is not None
        reached = asyncio.create_task(self._reached[step].wait())
        await asyncio.wait({reached, self._task}, return_when=asyncio.FIRST_COMPLETED)
        if not reached.done():
            reached.cancel()
            await asyncio.gather(reached, return_exceptions=True)
            self._task.result()  # the client's exception, if it raised one
            raise RuntimeError(f"the soak's client ended before '{step}'")

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._upstream_started:
            await self._upstream.stop()

    def records(self) -> tuple[ClientRecord, UpstreamRecord]:
        return self.client_record, self.upstream_record


# ---------------------------------------------------------------- the load in processes of its own


class Worker:
    """The soak's side of one worker process: its pipes and its lifeline."""

    def __init__(self, role: str, process: asyncio.subprocess.Process, lifeline: int) -> None:
        self.role, self.process, self._lifeline = role, process, lifeline

    @classmethod
    async def start(cls, role: str, args: list[str], cpu: int | None) -> Worker:
        pin: list[str] = []
        if cpu is not None:
            taskset = shutil.which("taskset")
            if taskset is None:
                raise RuntimeError("pinning the soak's processes to cores needs taskset (util-linux)")
            pin = [taskset, "-c", str(cpu)]
        read_end, lifeline = os.pipe()  # both non-inheritable; the supervisor gets the read end
        argv = [sys.executable, str(SUPERVISOR), str(read_end), f"{GRACE_S:g}", "--",
                *pin, sys.executable, "-m", "benchmarks.soak_load", role, *args]  # fmt: skip
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,  # stderr: the soak's own, so a worker's traceback is seen
                cwd=REPO,
                pass_fds=(read_end,),
                # Its own process group: stopped as a whole, never by name. A session of its own because uvloop's
                # subprocess_exec takes no process_group (ValueError); that puts it in another scheduler autogroup
                # (core/serve/process.py's docstring), which shifts the soak's latency figures, not its accounting.
                start_new_session=True,
            )
        except BaseException:
            os.close(lifeline)
            raise
        finally:
            os.close(read_end)
        return cls(role, process, lifeline)

    async def expect(self, word: str, timeout_s: float) -> str:
        """The worker's next line, which must start with `word`; returns the rest of it."""
        assert self.process.stdout is not None
        try:
            line = (await asyncio.wait_for(self.process.stdout.readline(), timeout_s)).decode().strip()
        except TimeoutError:
            late = f"the soak's {self.role} process did not say '{word}' within {timeout_s:.0f} s"
            raise RuntimeError(late) from None
        if line.split(" ", 1)[0] != word:
            raise RuntimeError(f"the soak's {self.role} process said {line!r}, not '{word}' (its stderr is above)")
        return line.removeprefix(word).strip()

    async def send(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(word.encode() + b"\n")
        await self.process.stdin.drain()

    async def record(self, timeout_s: float) -> Any:
        assert self.process.stdout is not None
        size = int(await self.expect("record", timeout_s))
        return pickle.loads(await asyncio.wait_for(self.process.stdout.readexactly(size), timeout_s))

    async def close(self, timeout_s: float) -> None:
        """Wait `timeout_s` for the worker to end; then close the lifeline (its supervisor stops the group:
        SIGTERM, GRACE_S, SIGKILL) and, should even that not end it, SIGKILL the group ourselves."""
        try:
            try:
                await asyncio.wait_for(self.process.wait(), timeout_s)
            except TimeoutError:
                self._close_lifeline()
                try:
                    await asyncio.wait_for(self.process.wait(), GRACE_S + 3.0)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.process.pid, signal.SIGKILL)  # the group it leads (start_new_session)
                    await self.process.wait()
        finally:
            self._close_lifeline()
            if self.process.stdin is not None:
                self.process.stdin.close()

    def _close_lifeline(self) -> None:
        if self._lifeline >= 0:
            os.close(self._lifeline)
            self._lifeline = -1


async def first_spawn() -> None:
    """Start and wait for one trivial process, so that what a loop opens once for good at its first
    subprocess is open before the soak counts descriptors: uvloop keeps one (/dev/null) from then on."""
    pipe = asyncio.subprocess.PIPE  # as the workers are started: the descriptor comes with the first pipe
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", "", stdin=pipe, stdout=pipe)
    await process.communicate()


class ProcessLoad:
    """Client and upstream each in a process of its own; `cpus`: the cores to pin them to (client, upstream)."""

    def __init__(
        self, requests: int, rate: float, seed: int, faulty: bool, max_seconds: float, cpus: tuple[int, int] | None
    ) -> None:
        self._args = [str(requests), repr(rate), str(seed), "faulty" if faulty else "fault-free", repr(max_seconds)]
        self._requests, self._max_seconds = requests, max_seconds
        self._cpus = cpus or (None, None)
        self._client: Worker | None = None
        self._upstream: Worker | None = None
        self._done = False
        self._records: tuple[ClientRecord, UpstreamRecord] | None = None

    async def start_upstream(self) -> str:
        self._upstream = await Worker.start("upstream", [str(self._requests)], self._cpus[1])
        return await self._upstream.expect("ready", START_S)

    async def start_client(self, url: str) -> None:
        self._client = await Worker.start("client", [url, *self._args], self._cpus[0])
        await self._client.expect("warm", START_S + WARM_S)

    async def run_arrivals(self) -> None:
        assert self._client is not None
        await self._client.send("go")
        await self._client.expect("drained", self._max_seconds + DRAIN_S + SLACK_S)

    async def finish(self) -> None:
        assert self._client is not None
        await self._client.send("ended")
        await self._client.expect("done", DRAIN_S + SLACK_S)
        self._done = True

    async def stop(self) -> None:
        """Collect both records when the run got to its end; in any case leave no worker behind."""
        try:
            if self._done and self._client is not None and self._upstream is not None:
                client_record = await self._client.record(SLACK_S)
                await self._upstream.send("stop")
                self._records = (client_record, await self._upstream.record(SLACK_S))
        finally:
            for worker in (self._client, self._upstream):
                if worker is not None:
                    await worker.close(SLACK_S if self._records else 0.0)

    def records(self) -> tuple[ClientRecord, UpstreamRecord]:
        if self._records is None:
            raise RuntimeError("the soak's workers sent no records")
        return self._records


# ---------------------------------------------------------------- inside a worker process


class _Channel:
    """A worker's side of its pipes: words in on stdin, words and its record out on the stdout it was
    started with (anything else it prints goes to stderr)."""

    def __init__(self, role: str) -> None:
        self.role = role
        self._out = os.fdopen(os.dup(1), "wb")
        os.dup2(2, 1)

    def say(self, line: str) -> None:
        self._out.write(line.encode() + b"\n")
        self._out.flush()

    async def expect(self, word: str) -> None:
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != word:  # end of file: the soak is gone
            raise SystemExit(f"soak {self.role} process: expected '{word}', got {line!r}")

    def send_record(self, record: ClientRecord | UpstreamRecord) -> None:
        data = pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
        self._out.write(f"record {len(data)}\n".encode() + data)
        self._out.flush()


def _settle() -> None:
    """Start-up's objects out of the collector's view, as the gateway does (core/gateway/standalone.py
    settle_heap): a full collection then walks only what requests allocated, so it stalls this worker less."""
    gc.collect()
    gc.freeze()


async def _serve_upstream(channel: _Channel, requests: int) -> None:
    errors = ErrorLogs()
    errors.attach()
    record = UpstreamRecord(requests)
    tasks_before, fds_before = len(asyncio.all_tasks()), open_fds()
    upstream = Upstream(on_served=record.on_served)
    await upstream.start()
    _settle()
    channel.say(f"ready {upstream.url}")
    started_cpu_s = cpu_s()
    try:
        await channel.expect("stop")
    finally:
        await upstream.stop()
    record.error_logs, record.cpu_s = errors.lines, cpu_s() - started_cpu_s
    await asyncio.sleep(0.2)  # closed transports release their sockets on the next loop iterations
    record.tasks, record.fds = (tasks_before, len(asyncio.all_tasks())), (fds_before, open_fds())
    channel.send_record(record)


async def _drive_client(channel: _Channel, url: str, args: list[str]) -> None:
    requests, rate, seed, faulty, max_seconds = int(args[0]), float(args[1]), int(args[2]), args[3], float(args[4])
    errors = ErrorLogs()
    errors.attach()
    faults, gaps = draw_faults(requests, seed, faulty == "faulty"), arrival_gaps(requests, rate, seed)
    record = ClientRecord(requests)

    started_cpu_s = 0.0

    async def step(reached: str, allowed: str) -> None:
        nonlocal started_cpu_s
        channel.say(reached)
        await channel.expect(allowed)
        started_cpu_s = started_cpu_s or cpu_s()  # at the first arrival

    _settle()
    tasks_before, fds_before = len(asyncio.all_tasks()), open_fds()
    await drive(url, faults, gaps, max_seconds, record, lambda: step("warm", "go"), lambda: step("drained", "ended"))
    record.error_logs, record.cpu_s = errors.lines, cpu_s() - started_cpu_s
    await asyncio.sleep(0.2)
    record.tasks, record.fds = (tasks_before, len(asyncio.all_tasks())), (fds_before, open_fds())
    channel.say("done")
    channel.send_record(record)


def main(argv: list[str]) -> None:
    role, *args = argv
    channel = _Channel(role)
    if role == "upstream":
        asyncio.run(_serve_upstream(channel, int(args[0])))
    elif role == "client":
        asyncio.run(_drive_client(channel, args[0], args[1:]))
    else:
        raise SystemExit(f"usage: python -m benchmarks.soak_load upstream|client ARGS (not {role!r})")


if __name__ == "__main__":
    main(sys.argv[1:])
