"""An event loop on a thread of its own, for live load generation inside an interactive program.

The console's UI loop redraws panels, handles keys and folds events; a load client sharing that loop would
send late and stamp chunks late whenever a redraw runs. `LoadThread.run(factory)` runs `factory()` (a
coroutine: a workload run, a tuning job) on a private loop in another thread and lets the caller await the
result from its own loop. Cancelling the awaiting task cancels the load task and still returns its result,
so a backend that answers cancellation with what it measured (every live backend here) keeps doing so.

Callbacks the job makes (event sinks, state changes) run on the load thread: hop to the UI loop with
`loop.call_soon_threadsafe` (never a blocking call into the UI, or redraws would pace the client again).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoadThread:
    """A daemon thread running one asyncio loop; started on first use, stopped by `close()`."""

    def __init__(self, name: str = "slo-console-load") -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(target=self._main, args=(loop, ready), name=self.name, daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    @staticmethod
    def _main(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(RuntimeError):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def run(self, factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run `factory()` on the load loop and return its result here (see the module docstring)."""
        loop = self._ensure()
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        started: concurrent.futures.Future[asyncio.Task[T]] = concurrent.futures.Future()

        def copy_outcome(task: asyncio.Task[T]) -> None:
            if task.cancelled():
                done.cancel()
            elif task.exception() is not None:
                done.set_exception(task.exception())  # type: ignore[arg-type]
            else:
                done.set_result(task.result())

        def start() -> None:
            try:
                task = loop.create_task(factory())
            except BaseException as exc:  # the factory itself failed: report it to the caller
                started.set_exception(exc)
                done.set_exception(exc)
                return
            task.add_done_callback(copy_outcome)
            started.set_result(task)

        loop.call_soon_threadsafe(start)
        try:
            return await asyncio.shield(asyncio.wrap_future(done))
        except asyncio.CancelledError:
            current = asyncio.current_task()
            task = await asyncio.wrap_future(started)
            loop.call_soon_threadsafe(task.cancel)
            if current is not None:
                current.uncancel()  # the load task answers the cancellation; its answer is ours
            return await asyncio.wrap_future(done)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the loop (after what is running on it has been cancelled by its owner) and join the thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout_s)
