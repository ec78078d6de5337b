"""One run of a load plan against a live server (`UrlBackend.run`): the open- or closed-loop sending,
requests in flight, /metrics sampling, liveness checks after transport errors, and the outcome's notes.

Open loop: each request is sent at its scheduled `arrival_s` on a monotonic clock, whatever the server
does; the achieved schedule error is measured and reported. Closed loop: `concurrency` clients each send
their next request when the previous one ends, plus think time. The duration window, the request count,
warm-up and think time follow the sending rules the simulator's clients follow too
(core/workload/sending.py)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, Protocol

import httpx
import numpy as np

from core.backend_api import EngineSample, LoadPlan, RunObserver, RunOutcome
from core.backends.http_client import StreamingClient
from core.records import RequestRecord, RequestSpec, Status
from core.serve.prom import MetricsUnavailable, VllmMetrics, fetch_metrics
from core.workload.sending import is_warmup, may_take, next_send_s, within_duration

# A liveness check after a transport failure must answer fast; a busy server still accepts connections.
LIVENESS_TIMEOUT_S = 2.0
# Request bodies built before the timed loop starts (as `vllm bench serve` builds its prompts first); an
# open-ended plan builds the rest on the fly.
PREBUILD_LIMIT = 20_000
# The client is falling behind its schedule when the p99 of (actual send - scheduled send) exceeds this.
SCHEDULE_ERROR_WARN_S = 0.010


def _percentiles(values: list[float]) -> dict[str, float]:
    array = np.asarray(values, dtype=float)
    return {
        "p50": float(np.percentile(array, 50)),
        "p99": float(np.percentile(array, 99)),
        "max": float(array.max()),
    }


class LoadTarget(Protocol):
    """The server a run sends to (`UrlBackend`, core/backends/live.py, which starts the run)."""

    base_url: str
    metrics_interval_s: float | None


class LoadRun:
    """One run of a load plan against the server: the sending loop, in-flight requests, sampling."""

    def __init__(
        self,
        backend: LoadTarget,
        http: httpx.AsyncClient,
        client: StreamingClient,
        plan: LoadPlan,
        observer: RunObserver | None,
    ) -> None:
        self.backend = backend
        self.http = http
        self.client = client
        self.plan = plan
        self.observer = observer
        client.on_transport_error = self._on_transport_error
        self.start = 0.0
        self.records: list[RequestRecord] = []
        self.samples: list[EngineSample] = []
        self.tasks: set[asyncio.Task[Any]] = set()
        self.requests: Iterator[tuple[RequestSpec, bytes | None]] = iter(())
        self.sent = 0
        self.not_sent = 0
        self.measuring = False  # a measured (not warm-up) request has been sent
        self.schedule_errors: list[float] = []
        self.queue_waits: list[float] = []
        self.server_lost: str | None = None
        self.lost = asyncio.Event()  # wakes sleeping senders when the server is found dead
        self.liveness_check: asyncio.Task[None] | None = None
        self.metrics_first: VllmMetrics | None = None
        self.metrics_last: VllmMetrics | None = None
        self.metrics_errors = 0
        self.metrics_disabled: str | None = None

    def now(self) -> float:
        return time.perf_counter() - self.start

    # -- the run ----------------------------------------------------------------------------------

    def _prebuild(self) -> None:
        """Build the plan's request bodies before the clock starts (up to PREBUILD_LIMIT)."""
        plan = self.plan
        specs = iter(plan.requests)
        limit = PREBUILD_LIMIT if plan.max_requests is None else min(PREBUILD_LIMIT, plan.max_requests)
        ready: list[tuple[RequestSpec, bytes | None]] = []
        for spec in itertools.islice(specs, limit):
            ready.append((spec, self.client.encode_body(spec)))
            if plan.mode == "open" and not within_duration(spec.arrival_s, plan.duration_s):
                break  # later arrivals are never sent
        self.requests = itertools.chain(ready, ((spec, None) for spec in specs))

    async def run(self) -> RunOutcome:
        self._prebuild()
        self.start = time.perf_counter()
        sampler = asyncio.create_task(self._sample_metrics_periodically())
        interrupted = False
        try:
            if self.plan.mode == "closed":
                await self._closed_loop()
            else:
                await self._open_loop()
        except (asyncio.CancelledError, KeyboardInterrupt):
            interrupted = True
            current = asyncio.current_task()
            if current is not None:
                current.uncancel()  # we handle the interruption by returning what was measured
        finally:
            await self._cancel_all()
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            if self.liveness_check is not None:
                self.liveness_check.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self.liveness_check
        if not interrupted:
            # A last snapshot so the server-side counters and histograms include every finished request.
            await self._sample_metrics()
        return self._outcome(interrupted)

    def _outcome(self, interrupted: bool) -> RunOutcome:
        self.records.sort(key=lambda r: r.request_id)
        ends = [r.end_s for r in self.records if r.end_s is not None]
        notes: dict[str, Any] = {
            "sent": self.sent,
            "status_counts": dict(Counter(str(r.status) for r in self.records)),
            "metrics_samples": len(self.samples),
        }
        if self.schedule_errors:
            notes["schedule_error_s"] = _percentiles(self.schedule_errors)
            if notes["schedule_error_s"]["p99"] > SCHEDULE_ERROR_WARN_S:
                notes["client_behind"] = (
                    f"the load client fell behind its schedule: p99 schedule error "
                    f"{1000 * notes['schedule_error_s']['p99']:.1f} ms (> {1000 * SCHEDULE_ERROR_WARN_S:.0f} ms); "
                    "offered load was lower than planned (a busy machine, or too high a rate for one client)"
                )
        if self.queue_waits:
            notes["client_queue_wait_s"] = _percentiles(self.queue_waits)
        if self.not_sent:
            notes["not_sent"] = self.not_sent
        if self.server_lost:
            notes["server_lost"] = self.server_lost
        if self.metrics_errors:
            notes["metrics_errors"] = self.metrics_errors
        if self.metrics_disabled:
            notes["metrics_unavailable"] = self.metrics_disabled
        if self.metrics_first is not None and self.metrics_last is not None:
            notes["server"] = _server_summary(self.metrics_last.since(self.metrics_first))
        return RunOutcome(
            records=self.records,
            duration_s=max(ends) if ends else self.now(),
            samples=self.samples,
            interrupted=interrupted,
            notes=notes,
        )

    def _may_send(self) -> bool:
        if self.server_lost is not None:
            return False
        return may_take(self.plan, self.sent) and within_duration(self.now(), self.plan.duration_s)

    async def _execute(self, spec: RequestSpec, ordinal: int, body: bytes | None, ready_s: float | None = None) -> None:
        record = RequestRecord.from_spec(spec, warmup=is_warmup(self.plan, spec, ordinal))
        if not record.warmup and not self.measuring:
            self.measuring = True
            # Tell an observer that measures energy: the measurement window starts with this send.
            on_measurement_start = getattr(self.observer, "on_measurement_start", None)
            if on_measurement_start is not None:
                on_measurement_start(self.now())
        try:
            await self.client.send(spec, self.start, record, ready_s=ready_s, body=body)
        finally:
            # Also on cancellation: the record then says CANCELLED and still counts.
            self._finish(record)

    def _finish(self, record: RequestRecord) -> None:
        self.records.append(record)
        if self.observer is not None:
            self.observer.on_record(record)

    def _record_not_sent(self, spec: RequestSpec, ordinal: int, why: str) -> None:
        """A request dispatched to the client's queue but never sent: it still gets a record."""
        self.not_sent += 1
        record = RequestRecord.from_spec(spec, warmup=is_warmup(self.plan, spec, ordinal))
        record.status = Status.NOT_SENT
        record.error = why
        self._finish(record)

    def _spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _open_loop(self) -> None:
        cap = self.plan.concurrency
        in_flight_cap = asyncio.Semaphore(cap) if cap else None
        duration = self.plan.duration_s
        for spec, body in self.requests:
            if not within_duration(spec.arrival_s, duration):
                break
            await self._sleep_unless_lost(spec.arrival_s - self.now())
            if not within_duration(self.now(), duration) and self.server_lost is None:
                # Planned inside the run but due only after it ended: the client fell behind its schedule (a
                # busy machine, a blocking observer). It is part of the plan, so it gets a record.
                self._record_not_sent(spec, self.sent, "its send time came after the run's duration ended")
                continue
            if not self._may_send():
                break
            dispatched = self.now()
            self.schedule_errors.append(dispatched - spec.arrival_s)
            self._spawn(self._open_request(spec, self.sent, body, in_flight_cap, dispatched))
            self.sent += 1
        await self._wait_for_tasks()

    async def _sleep_unless_lost(self, delay_s: float) -> None:
        if delay_s <= 0 or self.lost.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await self.lost.wait()

    async def _open_request(
        self,
        spec: RequestSpec,
        ordinal: int,
        body: bytes | None,
        in_flight_cap: asyncio.Semaphore | None,
        dispatched: float,
    ) -> None:
        if in_flight_cap is None:
            await self._execute(spec, ordinal, body)
            return
        try:
            await in_flight_cap.acquire()
        except asyncio.CancelledError:
            self._record_not_sent(spec, ordinal, "still queued client-side when the run was interrupted")
            raise
        try:
            waited = self.now() - dispatched
            if self.server_lost is not None:
                self._record_not_sent(spec, ordinal, "still queued client-side when the server was lost")
                return
            if not within_duration(self.now(), self.plan.duration_s):
                self._record_not_sent(spec, ordinal, "still queued client-side when the run's duration ended")
                return
            self.queue_waits.append(waited)
            # The wait for a slot counts in the request's latency (RequestRecord.arrival_s).
            await self._execute(spec, ordinal, body, ready_s=dispatched)
        finally:
            in_flight_cap.release()

    async def _closed_loop(self) -> None:
        async def client_loop(client_id: int) -> None:
            while self._may_send():
                item = next(self.requests, None)
                if item is None:
                    return
                spec, body = item
                spec.arrival_s = self.now()
                spec.client_id = client_id
                ordinal = self.sent
                self.sent += 1
                await self._execute(spec, ordinal, body)
                ended = self.now()
                await self._sleep_unless_lost(next_send_s(self.plan, ended) - ended)

        for client_id in range(max(1, self.plan.concurrency or 1)):
            self._spawn(client_loop(client_id))
        await self._wait_for_tasks()

    async def _wait_for_tasks(self) -> None:
        while self.tasks:
            # gather re-raises the first failure (an observer bug); the caller then cancels the rest.
            await asyncio.gather(*list(self.tasks))

    async def _cancel_all(self) -> None:
        pending = [task for task in self.tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    # -- server health ----------------------------------------------------------------------------

    def _on_transport_error(self, exc: BaseException) -> None:
        if self.server_lost is None and (self.liveness_check is None or self.liveness_check.done()):
            self.liveness_check = asyncio.create_task(self._check_liveness(exc))

    async def _check_liveness(self, trigger: BaseException) -> None:
        try:
            await self.http.get(self.backend.base_url + "/health", timeout=LIVENESS_TIMEOUT_S)
        except (httpx.ConnectError, httpx.RemoteProtocolError) as exc:
            self.server_lost = (
                f"server at {self.backend.base_url} stopped answering ({type(exc).__name__}: {exc}) "
                f"after {type(trigger).__name__}: {trigger}"
            )
            self.lost.set()
        except httpx.HTTPError:
            pass  # slow to answer is not dead; the requests' own timeouts cover a hung server

    # -- /metrics ---------------------------------------------------------------------------------

    async def _sample_metrics_periodically(self) -> None:
        interval = self.backend.metrics_interval_s
        if interval is None or interval <= 0:
            return
        while self.metrics_disabled is None:
            await self._sample_metrics()
            await asyncio.sleep(interval)

    async def _sample_metrics(self) -> None:
        interval = self.backend.metrics_interval_s
        if self.metrics_disabled is not None or interval is None or interval <= 0:
            return
        try:
            metrics = await fetch_metrics(self.http, self.backend.base_url, timeout_s=max(1.0, interval))
        except MetricsUnavailable as exc:
            self.metrics_errors += 1
            if "HTTP 404" in str(exc):
                self.metrics_disabled = str(exc)  # a server without /metrics: stop asking every second
            return
        if self.metrics_first is None:
            self.metrics_first = metrics
        self.metrics_last = metrics
        sample = metrics.to_engine_sample(self.now())
        self.samples.append(sample)
        if self.observer is not None:
            self.observer.on_engine_sample(sample)


def _server_summary(delta: VllmMetrics) -> dict[str, Any]:
    """What the server saw during the run, JSON-friendly (counters and histograms as increments)."""
    summary: dict[str, Any] = {
        "generation_tokens": delta.generation_tokens_total,
        "prompt_tokens": delta.prompt_tokens_total,
        "preemptions": delta.preemptions_total,
        "spec_draft_tokens": delta.spec_draft_tokens_total,
        "spec_acceptance_rate": delta.spec_acceptance_rate,
        "spec_mean_acceptance_length": delta.spec_mean_acceptance_length,
    }
    for key, histogram in (("e2e", delta.e2e_latency_s), ("ttft", delta.ttft_s)):
        if histogram is not None:
            summary[f"{key}_count"] = histogram.count
            summary[f"{key}_mean_s"] = histogram.mean
    return {key: value for key, value in summary.items() if value is not None}
