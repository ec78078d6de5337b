"""Profile sections that describe the offered load: request lengths, arrivals, tasks, traces, SLOs."""

# No `from __future__ import annotations` in the model modules: see core/profile/strict.py.
from pathlib import PurePath
from typing import Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from core.profile.strict import Strict

# ---------------------------------------------------------------- lengths

# The most tokens one prompt or output may have: a billion is beyond any model's context and far inside the
# int64 arrays lengths are drawn into (a uniform `high: 9223372036854775808` ended a run in numpy's
# "high is out of bounds for int64"). Traces hold their rows to it too (core/workload/trace.py).
MAX_TOKENS = 10**9
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]


class FixedLength(Strict):
    dist: Literal["fixed"] = "fixed"
    value: Tokens


class LognormalLength(Strict):
    """Lognormal with the given arithmetic mean; `sigma` is the std of the underlying normal."""

    dist: Literal["lognormal"] = "lognormal"
    mean: Annotated[float, Field(gt=0)]
    sigma: Annotated[float, Field(ge=0)] = 0.5
    min: Tokens = 1
    max: Tokens = 32768


class UniformLength(Strict):
    dist: Literal["uniform"] = "uniform"
    low: Tokens
    high: Tokens


class EmpiricalLength(Strict):
    """Draw from observed values (optionally weighted)."""

    dist: Literal["empirical"] = "empirical"
    values: Annotated[list[Tokens], Field(min_length=1)]
    weights: list[Annotated[float, Field(ge=0)]] | None = None


LengthDist = Annotated[FixedLength | LognormalLength | UniformLength | EmpiricalLength, Field(discriminator="dist")]


# ---------------------------------------------------------------- arrivals


class PoissonArrival(Strict):
    kind: Literal["poisson"] = "poisson"
    rate_rps: Annotated[float, Field(gt=0)]


class ConstantArrival(Strict):
    kind: Literal["constant"] = "constant"
    rate_rps: Annotated[float, Field(gt=0)]


class GammaArrival(Strict):
    """Gamma inter-arrivals with shape = burstiness (1 = Poisson, < 1 burstier), as vllm bench serve."""

    kind: Literal["gamma"] = "gamma"
    rate_rps: Annotated[float, Field(gt=0)]
    burstiness: Annotated[float, Field(gt=0)] = 1.0


class OnOffArrival(Strict):
    """Poisson at `rate_rps` during on-periods, silence during off-periods (bursty regime)."""

    kind: Literal["onoff"] = "onoff"
    rate_rps: Annotated[float, Field(gt=0)]
    on_s: Annotated[float, Field(gt=0)]
    off_s: Annotated[float, Field(ge=0)]


class ClosedLoopArrival(Strict):
    """N clients, each sending its next request when the previous one ends (plus think time)."""

    kind: Literal["closed"] = "closed"
    clients: Annotated[int, Field(ge=1)]
    think_time_s: Annotated[float, Field(ge=0)] = 0.0


Arrival = Annotated[
    PoissonArrival | ConstantArrival | GammaArrival | OnOffArrival | ClosedLoopArrival,
    Field(discriminator="kind"),
]


# ---------------------------------------------------------------- SLOs and tasks


class SLOSpec(Strict):
    e2e_s: Annotated[float, Field(gt=0)] | None = None
    ttft_s: Annotated[float, Field(gt=0)] | None = None
    tpot_s: Annotated[float, Field(gt=0)] | None = None


class TaskSpec(Strict):
    name: str
    weight: Annotated[float, Field(gt=0)] = 1.0
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    slo: SLOSpec | None = None  # falls back to the profile's slo
    # Mean speculative-decoding acceptance rate of this task's text (simulator); None: calibration default.
    acceptance: Annotated[float, Field(ge=0, lt=1)] | None = None


TraceFormat = Literal["csv", "jsonl", "adaserve"]
# A trace's format by its file name's extension (before a .gz): what `trace: FILE` and a `trace:` mapping
# without `format` read. `.json`: the AdaServe reader, which takes a JSON document or JSON Lines.
TRACE_FORMAT_BY_SUFFIX: dict[str, TraceFormat] = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "adaserve",
}


def trace_format_of(path: str) -> TraceFormat | None:
    """The format a trace's file name says (`t.csv.gz` is csv), or None when the name does not say."""
    suffixes = [s.lower() for s in PurePath(path).suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes.pop()
    return TRACE_FORMAT_BY_SUFFIX.get(suffixes[-1]) if suffixes else None


class TraceSpec(Strict):
    """Replay a recorded trace. Relative paths resolve against the profile's directory.

    `trace: traces/t.csv` is short for `trace: {path: traces/t.csv}`; without `format` the file name's
    extension says it (TRACE_FORMAT_BY_SUFFIX), else JSON Lines."""

    path: str
    format: TraceFormat = "jsonl"
    time_scale: Annotated[float, Field(gt=0)] = 1.0  # multiply timestamps (0.5 = twice as fast)
    # AdaServe artifact: a positive slo_ratio scales this baseline per-token latency into a TPOT SLO (a
    # negative one is an absolute TPOT in milliseconds and needs no baseline).
    baseline_tpot_s: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _path_alone(cls, data: Any) -> Any:
        if isinstance(data, str):
            fmt = trace_format_of(data)
            if fmt is None:
                known = ", ".join(TRACE_FORMAT_BY_SUFFIX)
                raise ValueError(
                    f"the file name {data!r} does not say the trace's format ({known}, optionally .gz); "
                    f"write trace: {{path: {data!r}, format: csv}} (or jsonl, adaserve)"
                )
            return {"path": data, "format": fmt}
        if not isinstance(data, dict | TraceSpec):
            raise ValueError("give the trace's file (trace: traces/t.csv) or a mapping {path: ..., format: csv}")
        if isinstance(data, dict) and "format" not in data and isinstance(data.get("path"), str):
            fmt = trace_format_of(data["path"])
            if fmt is not None:
                return {**data, "format": fmt}
        return data


class WorkloadSpec(Strict):
    arrival: Arrival | None = None
    trace: TraceSpec | None = None
    tasks: list[TaskSpec] = Field(default_factory=list)
    requests: Annotated[int, Field(ge=1)] = 1000
    duration_s: Annotated[float, Field(gt=0)] | None = None
    warmup_requests: Annotated[int, Field(ge=0)] = 0
    warmup_s: Annotated[float, Field(ge=0)] = 0.0

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.arrival is None) == (self.trace is None):
            raise ValueError("give exactly one of 'arrival' or 'trace'")
        if self.arrival is not None and not self.tasks:
            raise ValueError("'tasks' needs at least one task when arrivals are synthetic")
        return self


class SmoothGoodputSpec(Strict):
    """Paper 003: benefit(r) = n_r - alpha * f(l_r). Token i (from 1) is due at a + i/V (eq. 4), or, with a
    first-token allowance, at a + ttft_allow + (i-1)/V (the first token may take ttft_allow, the rest follow
    at the reader's speed)."""

    alpha: Annotated[float, Field(ge=0)] = 5.0
    reading_speed_tps: Annotated[float, Field(gt=0)] = 20.0
    ttft_allow_s: Annotated[float, Field(ge=0)] | None = None  # None: the paper's d_i = a + i/V
    penalty: Literal["linear", "quadratic", "log1p"] = "linear"

    @property
    def first_token_due_s(self) -> float:
        """When the first token is due, after the request's arrival: 1/V (eq. 4), or the allowance."""
        return 1.0 / self.reading_speed_tps if self.ttft_allow_s is None else self.ttft_allow_s
