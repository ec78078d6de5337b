"""vLLM's engine-timed /metrics histograms and token counters, as sums and counts over one sweep point."""

from __future__ import annotations

from dataclasses import dataclass

ENGINE_SERIES = {
    "itl": "vllm:inter_token_latency_seconds",
    "iteration_tokens": "vllm:iteration_tokens_total",
    "prefill_time": "vllm:request_prefill_time_seconds",
    "decode_time": "vllm:request_decode_time_seconds",
    "ttft": "vllm:time_to_first_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}


@dataclass(frozen=True, slots=True)
class EngineCounters:
    """Sums and counts of vLLM's engine-timed histograms (summed over label sets), plus token counters."""

    sums: dict[str, float]
    counts: dict[str, float]
    prompt_tokens: float = 0.0

    @classmethod
    def parse(cls, text: str) -> EngineCounters:
        wanted = {
            f"{name}{suffix}": (key, suffix) for key, name in ENGINE_SERIES.items() for suffix in ("_sum", "_count")
        }
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        prompt = 0.0
        for line in text.splitlines():
            if not line or line[0] == "#":
                continue
            name = line.split("{", 1)[0].split(" ", 1)[0]
            value = float(line.rsplit(" ", 1)[1]) if name in wanted or name == "vllm:prompt_tokens_total" else None
            if value is None:
                continue
            if name == "vllm:prompt_tokens_total":
                prompt += value
                continue
            key, suffix = wanted[name]
            target = sums if suffix == "_sum" else counts
            target[key] = target.get(key, 0.0) + value
        return cls(sums, counts, prompt)

    def since(self, earlier: EngineCounters) -> EngineCounters:
        return EngineCounters(
            {k: v - earlier.sums.get(k, 0.0) for k, v in self.sums.items()},
            {k: v - earlier.counts.get(k, 0.0) for k, v in self.counts.items()},
            self.prompt_tokens - earlier.prompt_tokens,
        )

    def mean(self, key: str) -> float | None:
        count = self.counts.get(key, 0.0)
        return self.sums.get(key, 0.0) / count if count > 0 else None

    def count(self, key: str) -> float:
        return self.counts.get(key, 0.0)
