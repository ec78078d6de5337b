"""`UrlBackend`: drive a running OpenAI-compatible server (vLLM or another) with a load plan.

Open loop: each request is sent at its scheduled `arrival_s` on a monotonic clock, whatever the server
does; the achieved schedule error is measured and reported. An optional in-flight cap makes later
requests wait client-side, as `vllm bench serve --max-concurrency` does (latency is measured from the
actual send, the wait is reported separately). Closed loop: `concurrency` clients each send their next
request when the previous one ends, plus think time.

While the load runs, /metrics is sampled into `EngineSample`s. A refused connection or a broken stream
triggers a liveness check; if the server is gone the run stops sending, lets in-flight requests fail, and
returns what it measured with `notes["server_lost"]` set. Cancellation (Ctrl-C) returns the measured
records with `interrupted=True`; requests in flight at that moment are recorded as cancelled. One run of a plan
is a `LoadRun` (core/backends/load_run.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from core.backend_api import BackendUnavailable, LoadPlan, RunObserver, RunOutcome
from core.backends.http_client import Api, PromptBuilder, StreamingClient, is_loopback, open_load_session
from core.backends.load_run import LoadRun
from core.serve.prom import VllmMetrics

# Size of the sample text whose token count calibrates prompt lengths when no tokenizer is at hand.
CALIBRATION_TOKENS = 400


class UrlBackend:
    """A live OpenAI-compatible server at `base_url` (`--backend url --url http://HOST:PORT`).

    `model` defaults to the first model the server lists. `tokenizer` makes prompts tokenizer-aware: a
    callable text -> token count, or a model directory holding tokenizer.json; by default the served
    model's directory is used when the server runs on this machine (vLLM lists it as the model's root).
    `prompts` replaces the prompt builder altogether (e.g. to send another client's prompt texts).
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
        temperature: float | None = 0.0,
        prompts: PromptBuilder | None = None,
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
        self.temperature = temperature  # see StreamingClient.temperature
        self.slo_fields = slo_fields  # add each request's task/SLO/id for an admission gateway in between
        self._tokenizer = tokenizer
        self._prompts: PromptBuilder | None = prompts
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
                temperature=self.temperature,
            )
            try:
                await self._calibrate_prompts(http)
                load = LoadRun(self, http, client, plan, observer)
                outcome = await load.run()
            finally:
                await client.close()
            outcome.notes["prompt_lengths"] = self.prompt_length_source
            if client.poster.retries:
                outcome.notes["stale_connection_retries"] = client.poster.retries
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
