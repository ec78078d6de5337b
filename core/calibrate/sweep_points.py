"""What a calibration sweep measures (settings, the points it plans) and what it records per point."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from core.calibrate.fit import StepObservation
from core.calibrate.stalls import StallSample

PointKind = Literal["decode", "prefill"]
Timing = Literal["e2e", "steps"]


@dataclass(frozen=True, slots=True)
class SweepSettings:
    """What the sweep measures. `full()` takes about 2-4 minutes of load on a 2-core CPU plus one or two
    server starts; `reduced()` about a minute of load (for the integration test)."""

    max_num_seqs: int = 32  # above every decode concurrency, so the batch is the clients in flight
    output_tokens: int = 64
    decode_concurrency: tuple[int, ...] = (1, 2, 4, 8, 16)
    decode_prompt_tokens: int = 32
    # Decode again at a long prompt: KV context then varies independently of the batch (per_ctx_token_s).
    long_prompt_tokens: int = 512
    long_prompt_concurrency: tuple[int, ...] = (4, 8)
    requests_per_client: int = 6
    prefill_prompt_tokens: tuple[int, ...] = (16, 128, 256, 512, 768)
    prefill_requests: int = 8
    prefill_output_tokens: int = 4
    spec_width: int = 4
    spec_concurrency: tuple[int, ...] = (1, 4, 8)
    spec_requests_per_client: int = 3
    point_max_s: float = 30.0  # no new sends after this long in one point (a slow server still ends)
    # Each decode point is measured this many times and the fastest repeat (client e2e, stalls taken out) is
    # kept: a few seconds in which another process takes the shared CPU spoil some repeats, not the point.
    decode_repeats: int = 3

    @classmethod
    def full(cls) -> SweepSettings:
        return cls()

    @classmethod
    def reduced(cls) -> SweepSettings:
        return cls(
            decode_concurrency=(1, 4, 8),
            long_prompt_concurrency=(4,),
            requests_per_client=4,
            prefill_prompt_tokens=(16, 256, 768),
            prefill_requests=5,
            spec_width=0,
            point_max_s=15.0,
            # 5, not 3: with 3 a single stall of the shared machine that spoils two repeats of one point
            # still decides it (CI, 2026-11-23: decode c4 measured 7.6 ms against 2.5 ms fitted).
            decode_repeats=5,
        )


@dataclass(frozen=True, slots=True)
class SweepPoint:
    label: str
    kind: PointKind
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    requests: int
    spec_width: int = 0


@dataclass(frozen=True, slots=True)
class ServerFacts:
    kv_capacity_tokens: int | None
    block_size: int | None
    max_model_len: int | None
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class DecodeSamples:
    """Per engine step, from client chunk gaps: step time, batch, context, and whether it was mixed."""

    step_s: np.ndarray
    batch: np.ndarray
    context_tokens: np.ndarray
    mixed: np.ndarray  # another request finished its prefill in this gap: not a pure decode step


@dataclass(slots=True)
class PointResult:
    point: SweepPoint
    completed: int
    failed: int
    wall_s: float
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    ttft_p50_s: float | None
    itl_p50_s: float | None  # median per-step gap over pure decode steps
    throughput_rps: float | None
    samples: DecodeSamples | None = None
    mean_acceptance_length: float | None = None  # speculation: server /metrics (else chunk sizes)
    observations: list[StepObservation] = field(default_factory=list)  # engine-timed, else chunk gaps
    # Decode only: the effective step that reproduces the client's median e2e at this concurrency.
    e2e_observation: StepObservation | None = None
    timing: str = "client chunk gaps"  # or "engine /metrics"
    repeat_e2e_p50_s: list[float] = field(default_factory=list)  # every repeat's median e2e (decode points)
    engine_step_s: float | None = None  # engine-timed mean step (decode) or prefill time (prefill)
    engine_batch: float | None = None  # mean decoding requests per step, from the engine's counters
    client_ttfts: list[float] = field(default_factory=list)
    client_e2es: list[float] = field(default_factory=list)
    stalls: StallSample = field(default_factory=StallSample)  # of this repeat's records

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.point.label,
            "kind": self.point.kind,
            "concurrency": self.point.concurrency,
            "prompt_tokens": self.point.prompt_tokens,
            "output_tokens": self.point.output_tokens,
            "spec_width": self.point.spec_width,
            "completed": self.completed,
            "failed": self.failed,
            "wall_s": self.wall_s,
            "e2e_p50_s": self.e2e_p50_s,
            "e2e_p99_s": self.e2e_p99_s,
            "ttft_p50_s": self.ttft_p50_s,
            "itl_p50_s": self.itl_p50_s,
            "throughput_rps": self.throughput_rps,
            "timing": self.timing,
            "engine_step_s": self.engine_step_s,
            "engine_batch": self.engine_batch,
            "mean_acceptance_length": self.mean_acceptance_length,
            "observations": len(self.observations),
            "repeat_e2e_p50_s": self.repeat_e2e_p50_s,
        }


@dataclass(slots=True)
class SweepResult:
    settings: SweepSettings
    facts: ServerFacts
    points: list[PointResult]
    description: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    # Every measured repeat's stalls, the repeats not kept for a point included: stalls are rare, and
    # all the observed time counts towards their rate.
    stall_samples: list[StallSample] = field(default_factory=list)

    def observations(self, timing: Timing = "e2e") -> list[StepObservation]:
        """The fit's input. "steps": engine-timed steps (else chunk gaps). "e2e": decode points as the
        effective step that reproduces the client's median e2e (prefill points as with "steps")."""
        chosen = []
        for p in self.points:
            if timing == "e2e" and p.point.kind == "decode" and p.e2e_observation is not None:
                chosen.append(p.e2e_observation)
            else:
                chosen += p.observations
        return chosen

    def decode_points(self, spec: bool = False) -> list[PointResult]:
        return [p for p in self.points if p.point.kind == "decode" and (p.point.spec_width > 0) == spec]


def plan_points(settings: SweepSettings, with_spec: bool) -> list[SweepPoint]:
    s = settings
    points = [
        SweepPoint(f"decode c{c} p{s.decode_prompt_tokens}", "decode", c, s.decode_prompt_tokens, s.output_tokens,
                   c * s.requests_per_client)
        for c in s.decode_concurrency
    ]  # fmt: skip
    points += [
        SweepPoint(f"decode c{c} p{s.long_prompt_tokens}", "decode", c, s.long_prompt_tokens, s.output_tokens,
                   c * s.requests_per_client)
        for c in s.long_prompt_concurrency
    ]  # fmt: skip
    points += [
        SweepPoint(f"prefill p{p}", "prefill", 1, p, s.prefill_output_tokens, s.prefill_requests)
        for p in s.prefill_prompt_tokens
    ]
    if with_spec and s.spec_width > 0:
        points += [
            SweepPoint(f"spec k{s.spec_width} c{c} p{s.decode_prompt_tokens}", "decode", c, s.decode_prompt_tokens,
                       s.output_tokens, c * s.spec_requests_per_client, spec_width=s.spec_width)
            for c in s.spec_concurrency
        ]  # fmt: skip
    return points
