"""`UrlBackend`: drive a running OpenAI-compatible server (vLLM or another) with a load plan.

Open loop: each request is sent at its scheduled `arrival_s` on a monotonic clock, whatever the server
does; the achieved schedule error is measured and reported. An optional in-flight cap makes later
requests wait client-side, as `vllm bench serve --max-concurrency` does (latency is measured from the
actual send, the wait is reported separately). Closed loop: `concurrency` clients each send their next
request when the previous one ends, plus think time.

While the load runs, /metrics is sampled into `EngineSample`s. A refused connection or a broken stream
triggers a liveness check; if the server is gone the run stops sending, lets in-flight requests fail, and
returns what it measured with `notes["server_lost"]` set. Cancellation (Ctrl-C) returns the measured
records with `interrupted=True`; requests in flight at that moment are recorded as cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from core.backends.base import BackendUnavailable, EngineSample, LoadPlan, RunObserver, RunOutcome
from core.backends.http_client import Api, PromptBuilder, StreamingClient, is_loopback, open_load_session
from core.records import RequestRecord, RequestSpec, Status
from core.serve.prom import MetricsUnavailable, VllmMetrics, fetch_metrics

# A liveness check after a transport failure must answer fast; a busy server still accepts connections.
LIVENESS_TIMEOUT_S = 2.0
# Size of the sample text whose token count calibrates prompt lengths when no tokenizer is at hand.
CALIBRATION_TOKENS = 400
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


class UrlBackend:
    """A live OpenAI-compatible server at `base_url` (`--backend url --url http://HOST:PORT`).

    `model` defaults to the first model the server lists. `tokenizer` makes prompts tokenizer-aware: a
    callable text -> token count, or a model directory holding tokenizer.json; by default the served
    model's directory is used when the server runs on this machine (vLLM lists it as the model's root).
    """

    name = "url"

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api: Api = "completions",
        *,
        request_timeout_s: float = 300.0,
        metrics_interval_s: float | None = 1.0,
        ignore_eos: bool = True,
        continuous_usage: bool = True,
        tokenizer: Callable[[str], int] | str | Path | None = None,
        probe_timeout_s: float = 10.0,
        extra_body: dict[str, Any] | None = None,
        slo_fields: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api: Api = api
        self.request_timeout_s = request_timeout_s
        self.metrics_interval_s = metrics_interval_s
        self.ignore_eos = ignore_eos
        self.continuous_usage = continuous_usage
        self.probe_timeout_s = probe_timeout_s
        self.extra_body = extra_body
        self.slo_fields = slo_fields  # add each request's task/SLO/id for an admission gateway in between
        self._tokenizer = tokenizer
        self._prompts: PromptBuilder | None = None
        # How prompt lengths are made: "tokenizer" (exact), "server /tokenize ratio", or "estimate".
        self.prompt_length_source = "estimate"
        self._info: dict[str, Any] | None = None
        # Server-side /metrics at the start and end of the last run; `end.since(start)` covers the run.
        self.metrics_at_start: VllmMetrics | None = None
        self.metrics_at_end: VllmMetrics | None = None

    # -- facts ------------------------------------------------------------------------------------

    def _http(self, timeout: httpx.Timeout | float) -> httpx.AsyncClient:
        # No pool cap: queueing inside the client would be measured as server latency. Environment
        # proxies are ignored for loopback servers (a corporate HTTP_PROXY must not capture 127.0.0.1).
        return httpx.AsyncClient(
            timeout=timeout,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
            trust_env=not is_loopback(self.base_url),
        )

    def _unavailable(self, cause: str) -> BackendUnavailable:
        return BackendUnavailable(f"cannot reach {self.base_url}: {cause}; start the server or fix --url")

    async def probe(self) -> dict[str, Any]:
        """Check the server answers /v1/models; learn the model and version. Raises BackendUnavailable."""
        async with self._http(self.probe_timeout_s) as http:
            try:
                response = await http.get(self.base_url + "/v1/models")
            except httpx.HTTPError as exc:
                raise self._unavailable(f"{type(exc).__name__}: {exc or 'no answer'}") from exc
            if response.status_code != 200:
                raise self._unavailable(
                    f"GET /v1/models answered HTTP {response.status_code} (not an OpenAI-compatible server?)"
                )
            try:
                models = [m for m in response.json().get("data", []) if isinstance(m, dict)]
            except (ValueError, AttributeError) as exc:
                raise self._unavailable(f"GET /v1/models did not return a model list: {exc}") from exc
            version: str | None = None
            with contextlib.suppress(httpx.HTTPError, ValueError, AttributeError):
                version_response = await http.get(self.base_url + "/version")
                if version_response.status_code == 200:
                    version = version_response.json().get("version")
        return self._remember(models, version)

    def _remember(self, models: list[dict[str, Any]], version: str | None) -> dict[str, Any]:
        ids = [str(m.get("id")) for m in models]
        if self.model is None:
            if not ids:
                raise self._unavailable("the server lists no model in /v1/models")
            self.model = ids[0]
        served = next((m for m in models if m.get("id") == self.model), {})
        self._info = {
            "backend": self.name,
            "url": self.base_url,
            "engine": "vllm" if version is not None else "openai-compatible",
            "engine_version": version,
            "model": self.model,
            "models_served": ids,
            "model_root": served.get("root"),
            "max_model_len": served.get("max_model_len"),
            "api": self.api,
        }
        return self._info

    def describe(self) -> dict[str, Any]:
        """Engine, version and model; queries the server once if no run or probe has yet."""
        if self._info is None:
            try:
                with httpx.Client(timeout=self.probe_timeout_s, trust_env=not is_loopback(self.base_url)) as h:
                    models = h.get(self.base_url + "/v1/models").raise_for_status().json().get("data", [])
                    version_response = h.get(self.base_url + "/version")
                    version = version_response.json().get("version") if version_response.is_success else None
                self._remember([m for m in models if isinstance(m, dict)], version)
            except (httpx.HTTPError, ValueError, AttributeError, BackendUnavailable) as exc:
                return {
                    "backend": self.name,
                    "url": self.base_url,
                    "model": self.model,
                    "reachable": False,
                    "error": f"{type(exc).__name__}: {exc}",
                }
        assert self._info is not None
        return dict(self._info)

    def prompt_builder(self) -> PromptBuilder:
        if self._prompts is None:
            if callable(self._tokenizer):
                self._prompts = PromptBuilder(self._tokenizer)
            else:
                source = self._tokenizer
                if source is None and self._info is not None:
                    source = self._info.get("model_root")  # a local server's model directory
                self._prompts = PromptBuilder.for_model_dir(source)
        return self._prompts

    # -- running ----------------------------------------------------------------------------------

    async def run(self, plan: LoadPlan, observer: RunObserver | None = None) -> RunOutcome:
        await self.probe()
        assert self.model is not None
        timeout = httpx.Timeout(self.request_timeout_s, connect=min(10.0, self.request_timeout_s))
        load_session = open_load_session(self.base_url, connect_timeout_s=min(10.0, self.request_timeout_s))
        # httpx for control calls (/metrics, /health, /tokenize); aiohttp for the measured streams (see
        # StreamingClient for why).
        async with self._http(timeout) as http, load_session as session:
            client = StreamingClient(
                session,
                self.base_url,
                self.model,
                api=self.api,
                prompt_builder=self.prompt_builder(),
                request_timeout_s=self.request_timeout_s,
                ignore_eos=self.ignore_eos,
                continuous_usage=self.continuous_usage,
                extra_body=self.extra_body,
                slo_fields=self.slo_fields,
            )
            await self._calibrate_prompts(http)
            load = _LoadRun(self, http, client, plan, observer)
            outcome = await load.run()
            outcome.notes["prompt_lengths"] = self.prompt_length_source
        self.metrics_at_start, self.metrics_at_end = load.metrics_first, load.metrics_last
        return outcome

    async def _calibrate_prompts(self, http: httpx.AsyncClient) -> None:
        """Without a local tokenizer, fit the words-per-token ratio with one call to vLLM's /tokenize."""
        prompts = self.prompt_builder()
        if prompts.tokenizer_aware:
            self.prompt_length_source = "tokenizer"
            return
        if self.prompt_length_source != "estimate":
            return  # calibrated by an earlier run
        sample = prompts.body(CALIBRATION_TOKENS)
        try:
            response = await http.post(
                self.base_url + "/tokenize", json={"model": self.model, "prompt": sample}, timeout=5.0
            )
            count = int(response.json()["count"]) if response.status_code == 200 else 0
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            count = 0  # not a vLLM, or an older one: keep the generic estimate
        if count > 0:
            prompts.calibrate(sample, count)
            self.prompt_length_source = "server /tokenize ratio"

    async def close(self) -> None:
        """Nothing persistent to release: each run opens and closes its own HTTP client."""


class _LoadRun:
    """One run of a load plan against the server: the sending loop, in-flight requests, sampling."""

    def __init__(
        self,
        backend: UrlBackend,
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
            if plan.mode == "open" and plan.duration_s is not None and spec.arrival_s >= plan.duration_s:
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
        if self.plan.max_requests is not None and self.sent >= self.plan.max_requests:
            return False
        return self.plan.duration_s is None or self.now() < self.plan.duration_s

    def _is_warmup(self, spec: RequestSpec, ordinal: int) -> bool:
        # By the scheduled time (closed loop: the send time), so a client running late on a busy machine
        # marks the same requests as warm-up as an on-time one would (and as the simulator does).
        return spec.warmup or ordinal < self.plan.warmup_requests or spec.arrival_s < self.plan.warmup_s

    async def _execute(self, spec: RequestSpec, ordinal: int, body: bytes | None, ready_s: float | None = None) -> None:
        record = self.client.new_record(spec, warmup=self._is_warmup(spec, ordinal))
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
        record = self.client.new_record(spec, warmup=self._is_warmup(spec, ordinal))
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
            if duration is not None and spec.arrival_s >= duration:
                break
            await self._sleep_unless_lost(spec.arrival_s - self.now())
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
            duration = self.plan.duration_s
            if self.server_lost is not None:
                self._record_not_sent(spec, ordinal, "still queued client-side when the server was lost")
                return
            if duration is not None and self.now() >= duration:
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
                await self._sleep_unless_lost(self.plan.think_time_s)

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
        "spec_acceptance_rate": delta.spec_acceptance_rate,
        "spec_mean_acceptance_length": delta.spec_mean_acceptance_length,
    }
    for key, histogram in (("e2e", delta.e2e_latency_s), ("ttft", delta.ttft_s)):
        if histogram is not None:
            summary[f"{key}_count"] = histogram.count
            summary[f"{key}_mean_s"] = histogram.mean
    return {key: value for key, value in summary.items() if value is not None}
