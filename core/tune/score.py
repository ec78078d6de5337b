"""The SLO-Tuner objective (paper 000 sec. II-B, eqs. 1-3) and the result of one measurement segment.

goodput (eq. 1) comes from `core.metrics.summarize` (requests meeting the SLO per second of the window;
failed requests count as not meeting it and stay out of the percentiles). The hardware proxy (eq. 2)
charges the *effective* speculative width: with speculation off the server drafts nothing, so charging
the width a switched-off knob happens to hold would make two identical servers score differently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from core.profile import TunerSpec
from core.tune.knobspace import Point

Variant = Literal["live", "sim"]
FAILED_SCORE = -math.inf


def hw_cost(point: Point, spec: TunerSpec) -> float:
    """Eq. 2: a resource-intensity proxy, linear in the three numeric knobs. An open-loop point without an
    in-flight cap is charged the largest cap the space has (it lets at least that many in flight)."""
    concurrency = spec.concurrency_bounds[1] if point.unlimited else point.concurrency
    return (
        spec.hw_weight_concurrency * concurrency
        + spec.hw_weight_max_num_seqs * point.max_num_seqs
        + spec.hw_weight_spec_width * point.effective_width
    )


def violation_weight(spec: TunerSpec, variant: Variant) -> float:
    """lambda live; the simulator controller multiplies it by 10 (sec. II-B, "cost and SLO penalties") so
    it backs off hard as soon as p99 crosses the target."""
    return spec.slo_penalty * (spec.sim_violation_factor if variant == "sim" else 1.0)


def score(goodput_rps: float, p99_s: float, slo_s: float, point: Point, spec: TunerSpec, variant: Variant) -> float:
    """Eq. 3: S(K) = goodput - w * max(0, p99 - SLO) - hw_cost(K). Undefined p99 (nothing completed) is a
    failed configuration: -inf, so it never wins and never looks like a small violation."""
    if not math.isfinite(p99_s) or not math.isfinite(goodput_rps):
        return FAILED_SCORE
    return goodput_rps - violation_weight(spec, variant) * max(0.0, p99_s - slo_s) - hw_cost(point, spec)


@dataclass(slots=True)
class Segment:
    """One measurement segment: a point, what it measured, its score, and where the result came from."""

    key: str  # journal key: phase, step and the configuration (see Evaluator.segment_key)
    point: Point
    phase: str  # "search", "final", "verify", "baseline", "sim" ...
    step: int
    score: float
    p50_s: float = math.nan
    p95_s: float = math.nan
    p99_s: float = math.nan
    goodput_rps: float = math.nan
    throughput_rps: float = math.nan
    requests: int = 0
    completed: int = 0
    failed: int = 0
    window_s: float = math.nan
    wall_s: float = 0.0
    error: str | None = None  # why a failed segment scored -inf (server start, crash, nothing completed)
    measure_fraction: float = 1.0  # successive halving's short rounds measure a fraction of the window
    summary: dict[str, Any] = field(default_factory=dict)  # the full metrics summary (JSON-ready)

    @property
    def ok(self) -> bool:
        return self.error is None and math.isfinite(self.score)

    def metrics(self) -> dict[str, Any]:
        """The headline numbers for events and the journal."""
        return {
            "p50_s": self.p50_s,
            "p95_s": self.p95_s,
            "p99_s": self.p99_s,
            "goodput_rps": self.goodput_rps,
            "throughput_rps": self.throughput_rps,
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.failed,
            "score": None if not math.isfinite(self.score) else self.score,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "phase": self.phase,
            "step": self.step,
            "knobs": self.point.as_dict(),
            **self.metrics(),
            "window_s": self.window_s,
            "wall_s": self.wall_s,
            "error": self.error,
            "measure_fraction": self.measure_fraction,
            "summary": self.summary,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Segment:
        def num(name: str) -> float:
            value = data.get(name)
            return math.nan if value is None else float(value)

        raw_score = data.get("score")
        return cls(
            key=str(data["key"]),
            point=Point.from_dict(data["knobs"]),
            phase=str(data["phase"]),
            step=int(data["step"]),
            score=FAILED_SCORE if raw_score is None else float(raw_score),
            p50_s=num("p50_s"),
            p95_s=num("p95_s"),
            p99_s=num("p99_s"),
            goodput_rps=num("goodput_rps"),
            throughput_rps=num("throughput_rps"),
            requests=int(data.get("requests") or 0),
            completed=int(data.get("completed") or 0),
            failed=int(data.get("failed") or 0),
            window_s=num("window_s"),
            wall_s=float(data.get("wall_s") or 0.0),
            error=data.get("error"),
            measure_fraction=float(data.get("measure_fraction") or 1.0),
            summary=dict(data.get("summary") or {}),
        )
