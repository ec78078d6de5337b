"""What a sweep measures: a vLLM this process starts, a running server, or the simulator; and the server facts
(KV capacity, block size, max model length) read from its /metrics, /v1/models or log."""

from __future__ import annotations

import re
from typing import Any, Protocol

import httpx
from prometheus_client.parser import text_string_to_metric_families

from core.backend_api import LoadPlan, RunOutcome
from core.calibrate.sweep_points import ServerFacts
from core.profile import Calibration, KnobsSpec


class SweepTarget(Protocol):
    name: str
    can_change_knobs: bool

    async def use(self, knobs: KnobsSpec) -> None: ...

    async def run(self, plan: LoadPlan) -> RunOutcome: ...

    async def facts(self) -> ServerFacts: ...

    async def metrics_text(self) -> str | None: ...

    def describe(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


_KV_LOG_LINE = re.compile(r"KV cache size:\s*([\d,]+)\s*tokens", re.IGNORECASE)


def cache_facts_from_metrics(text: str) -> tuple[int | None, int | None]:
    """(KV capacity in tokens, block size) from vLLM's `vllm:cache_config_info` labels, if exposed."""
    line = next((ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info")), None)
    if line is None:
        return None, None
    labels: dict[str, str] = {}
    for family in text_string_to_metric_families(line + "\n"):
        for sample in family.samples:
            labels = dict(sample.labels)

    def number(key: str) -> int | None:
        value = labels.get(key, "None")
        try:
            return int(float(value))
        except ValueError:
            return None

    block = number("block_size")
    tokens = number("kv_cache_size_tokens")
    if tokens is None and block is not None:
        blocks = number("num_gpu_blocks") or number("num_cpu_blocks")
        tokens = None if blocks is None else blocks * block
    return tokens, block


def kv_tokens_from_log(lines: list[str]) -> int | None:
    """vLLM logs `... KV cache size: 1,048,576 tokens` at start-up."""
    for line in reversed(lines):
        match = _KV_LOG_LINE.search(line)
        if match:
            return int(match.group(1).replace(",", ""))
    return None


async def _server_facts(base_url: str, log_lines: list[str] | None = None) -> ServerFacts:
    kv_tokens = block = max_len = None
    sources: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
        try:
            response = await http.get(base_url + "/metrics")
            if response.status_code == 200:
                kv_tokens, block = cache_facts_from_metrics(response.text)
                if kv_tokens is not None:
                    sources["kv_capacity_tokens"] = "/metrics vllm:cache_config_info"
                if block is not None:
                    sources["block_size"] = "/metrics vllm:cache_config_info"
        except httpx.HTTPError:
            pass
        try:
            models = (await http.get(base_url + "/v1/models")).json().get("data", [])
            lengths = [m.get("max_model_len") for m in models if isinstance(m, dict) and m.get("max_model_len")]
            if lengths:
                max_len = int(lengths[0])
                sources["max_model_len"] = "/v1/models"
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
    if kv_tokens is None and log_lines:
        kv_tokens = kv_tokens_from_log(log_lines)
        if kv_tokens is not None:
            sources["kv_capacity_tokens"] = "vLLM log (KV cache size)"
    return ServerFacts(kv_tokens, block, max_len, sources)


async def _metrics_text(base_url: str) -> str | None:
    async with httpx.AsyncClient(timeout=10.0, trust_env=False) as http:
        try:
            response = await http.get(base_url + "/metrics")
        except httpx.HTTPError:
            return None
    return response.text if response.status_code == 200 else None


class UrlTarget:
    """A running server (`--backend url`): measured with the knobs it was started with."""

    name = "url"
    can_change_knobs = False

    def __init__(self, backend: Any) -> None:  # core.backends.live.UrlBackend
        self.backend = backend

    async def use(self, knobs: KnobsSpec) -> None:
        return None  # its knobs are whatever it was started with

    async def run(self, plan: LoadPlan) -> RunOutcome:
        return await self.backend.run(plan)

    async def facts(self) -> ServerFacts:
        return await _server_facts(self.backend.base_url)

    async def metrics_text(self) -> str | None:
        return await _metrics_text(self.backend.base_url)

    def describe(self) -> dict[str, Any]:
        return self.backend.describe()

    async def close(self) -> None:
        await self.backend.close()


class VllmTarget(UrlTarget):
    """A vLLM this process starts and restarts with the sweep's knobs (`--backend vllm`); `backend` is a
    core.backends.vllm.VllmBackend. Running, /metrics, describe and close are the UrlTarget's."""

    name = "vllm"
    can_change_knobs = True

    async def use(self, knobs: KnobsSpec) -> None:
        from core.serve.process import ServerState

        process = self.backend.server.process
        if process is not None and process.state is ServerState.READY and self.backend.knobs == knobs:
            return
        if process is None:
            await self.backend.start(knobs)
        else:
            await self.backend.restart(knobs)

    async def facts(self) -> ServerFacts:
        from core.serve.server_log import read_log_tail
        from core.serve.vllm_server import option_value

        process = self.backend.server.process
        log_lines = read_log_tail(process.log_path, 400) if process is not None else []
        facts = await _server_facts(self.backend.base_url, log_lines)
        if facts.max_model_len is None and process is not None:
            value = option_value(process.argv or [], "--max-model-len")
            if value and value.isdigit():
                facts.sources["max_model_len"] = "server argv --max-model-len"
                return ServerFacts(facts.kv_capacity_tokens, facts.block_size, int(value), facts.sources)
        return facts


class SimTarget:
    """The simulator with a known calibration: a sweep of it should give that calibration back."""

    name = "sim"
    can_change_knobs = True

    def __init__(self, calibration: Calibration, knobs: KnobsSpec | None = None, seed: int = 0) -> None:
        self.calibration = calibration
        self.knobs = knobs or KnobsSpec()
        self.seed = seed
        self.runs = 0

    async def use(self, knobs: KnobsSpec) -> None:
        self.knobs = knobs

    async def run(self, plan: LoadPlan) -> RunOutcome:
        from core.backends.sim import SimBackend

        self.runs += 1
        return await SimBackend(self.calibration, self.knobs, seed=self.seed + self.runs).run(plan)

    async def facts(self) -> ServerFacts:
        cal = self.calibration
        return ServerFacts(cal.kv_capacity_tokens, cal.block_size, cal.max_model_len, {"all": "the calibration"})

    async def metrics_text(self) -> str | None:
        return None  # no /metrics: the simulator's chunk gaps are its steps

    def describe(self) -> dict[str, Any]:
        return {"backend": "sim", "engine": "simulator", "calibration": self.calibration.name}

    async def close(self) -> None:
        return None
