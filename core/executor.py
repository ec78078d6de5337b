"""Where a job's independent simulator runs go (issue 24): in this process one after another, in a local
process pool, or as Ray tasks on a cluster. One seam for `--job compare` (modes and static caps), `--job
capacity` (one bisection per mode), the tuner's simulator sweeps and the benchmarks.

    async with ExecutorSpec("local", workers=2).open(sink, job="compare") as executor:
        result = await executor.run("saber", run_mode_task, profile, "saber", seed)

A task is a module-level `async def` (so the pool and Ray can pickle it by name) whose arguments and result
pickle: a profile, a seed and a mode in; a summary or a run out. Each task seeds its own simulator, so a
task's result does not depend on where it ran or what ran beside it: a job's tables are the same with
--workers 1, --workers N and --executor ray (tests/test_executor.py proves it). Callers keep their own
order: `in_order` starts every task at once on a parallel executor and hands the results back in the
order they were asked for.

`--workers 1` is the serial path: each task awaited in this process, in order, as before this seam
existed. A parallel executor announces every finished task with a `task_done` event; Ctrl-C (the job's
task cancelled) cancels what is still queued and stops what is running (the pool's worker processes are
terminated, Ray tasks are cancelled with force).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from core.events import EventSink, make_event, null_sink

if TYPE_CHECKING:
    import multiprocessing.context
    from concurrent.futures import ProcessPoolExecutor

T = TypeVar("T")
Task = Callable[..., Awaitable[Any]]  # a module-level async function
ExecutorKind = Literal["local", "ray"]
EXECUTOR_KINDS: tuple[ExecutorKind, ...] = get_args(ExecutorKind)
RAY_EXTRA = "pip install 'slo-console[ray]'"


class RayMissing(ImportError):
    """--executor ray without Ray installed: the message names the extra that installs it."""


def ray_installed() -> bool:
    return importlib.util.find_spec("ray") is not None


def default_workers() -> int:
    """The local pool's size without --workers: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - platforms without affinity
        return max(1, os.cpu_count() or 1)


def _run_task(fn: Task, args: tuple[Any, ...]) -> tuple[Any, float, float]:
    """A task in a worker process or a Ray worker: its own event loop, run to the end. Returns the result, and
    the wall and CPU seconds it took there (the progress event's figures: a queued task's wait is not its cost)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = asyncio.run(fn(*args))
    return result, time.perf_counter() - wall, time.process_time() - cpu


class Executor:
    """Serial: each task awaited here, in the caller's event loop (`--workers 1`)."""

    parallel = False
    kind = "serial"

    def __init__(self, sink: EventSink = null_sink, job: str = "") -> None:
        self.sink = sink
        self.job = job
        self.started = 0
        self.done = 0

    async def run(
        self, label: str, fn: Task, *args: Any, demand: Mapping[str, Any] | None = None, urgency: float = 0.0
    ) -> Any:
        """`await fn(*args)` where this executor runs tasks; `label` names it in the progress events.
        `demand`: what the task holds while it runs, as Ray task options (`{"num_gpus": 1}`, a custom
        resource): Ray places and queues it by that; a local executor has one machine and ignores it.
        `urgency`: when tasks wait for a local worker, the most urgent starts first (then the first asked):
        a caller whose tasks form a chain (a bisection) gives its slowest chain the lead, so that the chain
        does not wait behind short tasks and end the job alone."""
        self.started += 1
        if not self.parallel:
            result = await fn(*args)
            self.done += 1
            return result
        async with self._slot(urgency):
            result, wall_s, cpu_s = await self._run(fn, args, demand)
        self.done += 1
        self.sink(
            make_event(
                "task_done",
                job=self.job,
                task=label,
                executor=self.kind,
                done=self.done,
                started=self.started,
                wall_s=wall_s,
                cpu_s=cpu_s,
            )
        )
        return result

    def slots(self) -> int:
        """How many tasks run at once (a caller with work to spare may start more than it needs)."""
        return 1

    def _slot(self, urgency: float) -> contextlib.AbstractAsyncContextManager[None]:
        """Held while a task runs; a parallel executor that queues its own tasks waits here for a free one."""
        return contextlib.nullcontext()

    async def _run(self, fn: Task, args: tuple[Any, ...], demand: Mapping[str, Any] | None) -> tuple[Any, float, float]:
        """A parallel executor's `_run_task(fn, args)` where it runs tasks."""
        raise NotImplementedError

    async def in_order(self, starts: Sequence[Callable[[], Awaitable[T]]]) -> AsyncIterator[T]:
        """Each awaitable's result, in the order given. Serial: each is started when the one before has
        finished (an interrupted run returns early and the caller stops, as before). Parallel: all start at
        once and each result is handed back when it and every one before it have finished."""
        if not self.parallel:
            for start in starts:
                yield await start()
            return
        tasks = [asyncio.ensure_future(start()) for start in starts]
        try:
            for task in tasks:
                yield await task
        finally:
            for task in tasks:
                task.cancel()
            # Let the cancelled ones finish unwinding (a cancelled Ray task is cancelled on the cluster there).
            await asyncio.gather(*tasks, return_exceptions=True)

    def close(self, *, cancelled: bool = False) -> None:
        return None


def _pool_worker_init() -> None:
    _end_with_parent()
    # The parent owns Ctrl-C: it cancels the job and terminates the workers, which must not print
    # KeyboardInterrupt tracebacks of their own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits the parent's running event loop and its signal wake-up socket; neither is its own.
    asyncio.events._set_running_loop(None)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)


def _end_with_parent() -> None:
    """A worker whose parent is killed outright (SIGKILL: no chance to end the pool) would wait on the task
    queue forever, since it holds the queue's write end itself. On Linux the kernel ends it with its parent
    (the command, or the fork server, which ends with the command)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the line above
        os._exit(1)


def pool_context(preload: Sequence[str] = ()) -> multiprocessing.context.BaseContext:
    """fork where it is safe (a single-threaded parent: the batch CLI): a worker starts in milliseconds with
    every module already imported. With threads (the console runs compare in a worker thread), forkserver
    with the task's modules preloaded: forking a threaded process can copy a held lock. spawn elsewhere.
    docs/scale-out.md has the start-up cost of each."""
    # Imported here, not with the module: multiprocessing and the process pool were ~1% of the start of every
    # command that imports this module (the batch CLI does, for --executor's choices) and most never start one.
    import multiprocessing

    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(preload))
    else:
        context = multiprocessing.get_context("spawn")
    _start_helper_processes(context)
    return context


def _start_helper_processes(context: multiprocessing.context.BaseContext) -> None:
    """Start multiprocessing's resource tracker (and the fork server) now, with a real stderr to inherit:
    the console's Textual replaces sys.stderr with a capture whose file descriptor is -1, which the tracker's
    start refuses ("bad value(s) in fds_to_keep")."""
    from multiprocessing import forkserver, resource_tracker

    try:
        usable = sys.stderr is not None and sys.stderr.fileno() >= 0
    except (AttributeError, OSError, ValueError):
        usable = False
    real = sys.__stderr__
    with contextlib.nullcontext() if usable or real is None else contextlib.redirect_stderr(real):
        resource_tracker.ensure_running()
        if context.get_start_method() == "forkserver":
            forkserver.ensure_running()


class UrgencyGate:
    """At most `slots` holders at once; when all are taken, the most urgent waiter goes next, then the one that
    asked first."""

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []  # a heap: (-urgency, arrival, future)
        self._arrivals = 0

    @contextlib.asynccontextmanager
    async def slot(self, urgency: float) -> AsyncIterator[None]:
        if self._free > 0 and not self._waiting:
            self._free -= 1
        else:
            handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            heapq.heappush(self._waiting, (-urgency, self._arrivals, handed))
            self._arrivals += 1
            try:
                await handed  # resolved by the holder that hands its slot on (`_release`)
            except asyncio.CancelledError:
                if handed.done() and not handed.cancelled():
                    self._release()  # the slot came, then the cancellation: pass it on
                raise  # (a waiter cancelled in the queue stays there, skipped by `_release`)
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self._waiting:
            _, _, handed = heapq.heappop(self._waiting)
            if not handed.done():
                handed.set_result(None)
                return
        self._free += 1


class ProcessExecutor(Executor):
    """A local pool of `workers` processes (`--workers N`, N > 1), started when the first task arrives."""

    parallel = True
    kind = "local"

    def __init__(self, workers: int, sink: EventSink = null_sink, job: str = "") -> None:
        super().__init__(sink, job)
        self.workers = workers
        self.pool: ProcessPoolExecutor | None = None
        self.abandoned = 0  # tasks cancelled while they ran
        # A task is handed to the pool only when a worker is free, so the order tasks start in is this gate's
        # (urgency first), not the pool's first-in first-out queue.
        self._gate = UrgencyGate(workers)

    def slots(self) -> int:
        return self.workers

    def _slot(self, urgency: float) -> contextlib.AbstractAsyncContextManager[None]:
        return self._gate.slot(urgency)

    async def _run(self, fn: Task, args: tuple[Any, ...], demand: Mapping[str, Any] | None) -> Any:
        if self.pool is None:
            from concurrent.futures import ProcessPoolExecutor  # the pool's imports: see pool_context

            context = pool_context([fn.__module__])
            self.pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_pool_worker_init)
        future = self.pool.submit(_run_task, fn, args)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            # A queued task is dropped; a running one cannot be stopped inside its process: the pool is then
            # ended at close instead of waited for (Ctrl-C, or a look-ahead probe nobody needs any more).
            if not future.cancel():
                self.abandoned += 1
            raise

    def close(self, *, cancelled: bool = False) -> None:
        pool, self.pool = self.pool, None
        if pool is None:
            return
        if not (cancelled or self.abandoned):
            pool.shutdown(wait=True)
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        # The pool's manager thread sees its workers end and reaps them itself (ProcessPoolExecutor's broken
        # pool path): it is waited for rather than raced. A second waitpid on a reaped worker fails, and
        # multiprocessing then reads the worker as alive (a suite run saw one "alive" after the close) and
        # would send a kill to a pid that may already be reused.
        if manager is not None:
            manager.join(timeout=10)
        # A worker busy on a loaded machine may take seconds to act on SIGTERM; one that still has not ended
        # is killed, so no worker outlives the job (a test saw 5 s pass at load 12 on 2 cores).
        for process in processes:
            if process.is_alive():
                process.kill()
        if manager is not None:
            manager.join(timeout=10)
        for process in processes:
            process.join(timeout=10)


class RayExecutor(Executor):
    """Ray tasks (`--executor ray`): a local Ray started for the job, or the cluster at `address`. Every node
    needs slo-console installed (the same version): a task is named by its module, not shipped as code."""

    parallel = True
    kind = "ray"

    def __init__(self, address: str | None, sink: EventSink = null_sink, job: str = "") -> None:
        super().__init__(sink, job)
        try:
            import ray
        except ImportError as exc:
            raise RayMissing(f"--executor ray needs Ray, which is not installed: {RAY_EXTRA}") from exc
        self.ray = ray
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            # Workers' output stays in Ray's logs: stdout is the batch contract's JSON Lines.
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.remote = ray.remote(num_cpus=1, max_retries=0)(_run_task)

    def slots(self) -> int:
        return int(self.ray.cluster_resources().get("CPU", 1))

    async def _run(self, fn: Task, args: tuple[Any, ...], demand: Mapping[str, Any] | None) -> Any:
        ref = (self.remote if demand is None else self.remote.options(**demand)).remote(fn, args)
        try:
            return await ref
        except asyncio.CancelledError:
            self.ray.cancel(ref, force=True)
            raise

    def close(self, *, cancelled: bool = False) -> None:
        if self.owns_ray and self.ray.is_initialized():
            self.ray.shutdown()
            self.owns_ray = False


@dataclass(frozen=True, slots=True)
class ExecutorSpec:
    """What the operator asked for (--executor, --workers, --ray-address; core/jobs/options.py)."""

    kind: ExecutorKind = "local"
    workers: int | None = None  # local: the pool's size (None: default_workers()); 1 is the serial path
    ray_address: str | None = None  # ray: None starts a local Ray; "auto" or ray://HOST:PORT joins a cluster

    def make(self, sink: EventSink = null_sink, job: str = "") -> Executor:
        if self.kind == "ray":
            return RayExecutor(self.ray_address, sink, job)
        workers = default_workers() if self.workers is None else self.workers
        return Executor(sink, job) if workers <= 1 else ProcessExecutor(workers, sink, job)

    @contextlib.asynccontextmanager
    async def open(self, sink: EventSink = null_sink, job: str = "") -> AsyncIterator[Executor]:
        executor = self.make(sink, job)
        cancelled = False
        try:
            yield executor
        except BaseException:
            cancelled = True
            raise
        finally:
            executor.close(cancelled=cancelled)


SERIAL = ExecutorSpec(workers=1)


def run_tasks(
    spec: ExecutorSpec, calls: Sequence[tuple[str, Task, tuple[Any, ...]]], sink: EventSink = null_sink
) -> list[Any]:
    """Outside an event loop (the benchmarks): every `(label, fn, args)` on `spec`'s executor, the results
    in the order of `calls`."""

    async def main() -> list[Any]:
        async with spec.open(sink) as executor:
            starts = [partial(executor.run, label, fn, *args) for label, fn, args in calls]
            async with contextlib.aclosing(executor.in_order(starts)) as results:
                return [result async for result in results]

    return asyncio.run(main())
