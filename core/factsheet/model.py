"""The factsheet schema: a versioned, typed record of one run's performance and sustainability.

Paper 000 sec. IV argues that factsheets for trusted AI should carry the serving system's performance,
tail-latency SLO compliance and sustainability; this model is that record. Every job writes one (run, tune,
compare, capacity, calibrate): the common sections, the job's own section, and a verdict (SLO met or
violated, by how much) that heads the page. JSON is canonical (published as
JSON Schema in schema/factsheet.schema.json); Markdown is rendered from it. Field names carry their units.

Honesty rules the schema encodes: every energy-derived figure has a basis; a value that is not known is
null (never 0); performance says whether it was measured on a live server or simulated.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from core.jobs.options import JobName
from core.metrics.verdict import VerdictState
from core.profile.scheduling_mode import SchedulingMode

# 1.1: job, verdict, the compare/capacity/calibration sections, tuning spread;
# 1.2: workload.requests is null when no count limit applies (a trace replayed whole).
SCHEMA_VERSION = "1.2"

FigureBasis = Literal["measured", "modelled", "estimated", "unavailable"]
# Scalars that may appear in free-form maps (knobs, software versions, extra metrics).
Scalar = str | int | float | bool | None


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- system


class GpuInfo(Section):
    index: int
    name: str
    memory_total_mib: int | None = None


class HostInfo(Section):
    """The machine the run executed on (for a simulator run: where it ran, not the modelled GPU)."""

    gpus: list[GpuInfo] = Field(default_factory=list)
    gpu_count: int = 0
    gpu_driver_version: str | None = None
    gpu_source: str = Field(description="'NVML' when read from the driver, else why no GPU facts are given")
    cpu_model: str | None = None
    cpu_logical_cores: int | None = None
    memory_total_gib: float | None = None
    operating_system: str | None = None
    software: dict[str, str] = Field(
        default_factory=dict, description="Versions of the software that ran the benchmark"
    )


class SystemSection(Section):
    model: str | None = Field(description="Model served (or modelled by the simulator's calibration)")
    engine: str = Field(description="'vllm', or 'simulator' for the discrete-event simulator")
    engine_version: str | None = None
    backend: str
    calibration: str | None = Field(
        default=None, description="The simulator's calibration profile (simulator runs only)"
    )
    modelled_hardware: str | None = Field(
        default=None, description="Hardware the calibration models (simulator runs only)"
    )
    host: HostInfo
    backend_facts: dict[str, Scalar] = Field(
        default_factory=dict, description="Everything Backend.describe() reported, verbatim"
    )


# ---------------------------------------------------------------- configuration


class ConfigurationSection(Section):
    backend: str
    scheduling_mode: SchedulingMode = Field(description="The scheduling mode that ran")
    knobs: dict[str, Scalar]


# ---------------------------------------------------------------- workload


class SLOTargets(Section):
    e2e_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None


class TaskInfo(Section):
    name: str
    weight: float
    share: float = Field(description="weight / sum of weights: the expected share of requests")
    prompt_tokens: dict[str, Any]
    output_tokens: dict[str, Any]
    slo: SLOTargets


class WorkloadSection(Section):
    profile: str
    description: str
    source: Literal["arrival", "trace"]
    arrival: dict[str, Any] | None = Field(description="Arrival process and its parameters (rate_rps, ...)")
    trace: dict[str, Any] | None = None
    tasks: list[TaskInfo]
    requests: int | None = Field(
        description="The request-count limit of the run; null: none (a whole trace, or a run bound by its duration)"
    )
    duration_s: float | None
    warmup_requests: int
    warmup_s: float
    slo: SLOTargets = Field(description="The profile's default SLOs (tasks may override)")
    slo_definitions: dict[str, str]


# ---------------------------------------------------------------- performance


class LatencyStats(Section):
    p50_s: float | None = None
    p90_s: float | None = None
    p95_s: float | None = None
    p99_s: float | None = None
    mean_s: float | None = None


class SmoothGoodput(Section):
    """Paper 003: token i due at a + i/V (eq. 4), or a + ttft_allow + (i-1)/V with an allowance; benefit =
    n - alpha * f(idle latency)."""

    value: float | None = Field(description="benefit tokens per second")
    alpha: float | None
    reading_speed_tps: float | None = Field(description="V, the reader's speed")
    ttft_allow_s: float | None  # None: no allowance, token i due at i/V
    penalty: str | None = Field(description="f, the penalty on user idle latency")


class TaskPerformance(Section):
    requests: int | None = None
    completed: int | None = None
    failed: int | None = None
    p50_s: float | None = None
    p99_s: float | None = None
    slo_attainment: float | None = None
    goodput_rps: float | None = None
    token_goodput_tps: float | None = None
    smooth_goodput: float | None = None


class PerformanceSection(Section):
    basis: Literal["measured", "simulated"] = Field(
        description="'measured' on a live server (wall clock); 'simulated' by the discrete-event simulator"
    )
    window_s: float | None
    requests: int | None
    completed: int | None
    failed: int | None
    failed_by_status: dict[str, int]
    e2e: LatencyStats
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats = Field(description="Inter-token latency: gaps between streamed chunks")
    goodput_rps: float | None
    slo_attainment: float | None = Field(description="share 0..1 of all submitted requests, failures included")
    token_goodput_tps: float | None
    throughput_rps: float | None = Field(description="completed requests per second")
    output_tps: float | None
    output_tokens: int | None
    smooth_goodput: SmoothGoodput
    capacity_rps: float | None = Field(
        default=None,
        description="Highest rate with attainment >= capacity_attainment_target; null if not run",
    )
    capacity_attainment_target: float | None = None
    per_task: dict[str, TaskPerformance]
    other_metrics: dict[str, Scalar] = Field(
        default_factory=dict, description="Summary figures this schema version has no field for, verbatim"
    )


# ---------------------------------------------------------------- verdict


class VerdictCheck(Section):
    """One figure against its target (core/metrics/verdict.py): met when value <= target."""

    metric: str = Field(description="What is compared, e.g. 'p99', 'TTFT p99', 'offered rate'")
    value: float | None
    target: float | None
    unit: str
    state: VerdictState
    margin: float | None = Field(description="value / target - 1: above 0 missed by, below 0 to spare")
    text: str


class Verdict(Section):
    """Whether the SLO was met, by how much; per task when tasks set their own SLOs."""

    state: VerdictState = Field(
        description="met / violated: every SLO checked on its p99; unmeasured: nothing completed; no_slo: none set"
    )
    margin: float | None = Field(description="The deciding check's margin (the largest)")
    headline: str
    checks: list[VerdictCheck] = Field(default_factory=list)
    per_task: dict[str, Verdict] = Field(default_factory=dict)


# ---------------------------------------------------------------- tuning


class Spread(Section):
    min: float | None
    median: float | None
    max: float | None


class TuningSpread(Section):
    """How much the tuned configuration's own measurements varied (the search's and the final ones)."""

    measurements: int = Field(description="Full-length segments measured at the tuned configuration")
    p99_s: Spread
    slo_attainment: Spread
    goodput_rps: Spread


class TuningPoint(Section):
    knobs: dict[str, Scalar] = Field(default_factory=dict)
    goodput_rps: float | None = None
    p99_s: float | None = None
    slo_attainment: float | None = None
    score: float | None = None


class TuningSection(Section):
    tuner: str | None
    objective: str | None
    baseline: TuningPoint | None
    tuned: TuningPoint | None
    segments: int | None = Field(description="Measurement segments the tuner ran")
    wall_time_s: float | None
    trajectory: list[TuningPoint] = Field(description="Each segment's configuration and result, in order")
    spread: TuningSpread | None = Field(default=None, description="The tuned configuration's measurements")
    slo_p99_s: float | None = Field(default=None, description="The p99 target the tuner worked against")


# ---------------------------------------------------------------- compare, capacity, calibration


class CompareRow(Section):
    mode: str
    max_num_seqs: int | None
    speculation: str | None
    requests: int | None
    completed: int | None
    slo_attainment: float | None
    slo_attainment_per_task: dict[str, float | None] = Field(default_factory=dict)
    goodput_rps: float | None
    token_goodput_tps: float | None
    smooth_goodput: float | None
    p99_s: float | None
    cv_completion_over_slo: float | None
    rejected: int | None
    deferred: int | None
    failed: int | None
    verdict: Verdict


class CompareSection(Section):
    """`--job compare`: every mode on identical seeded arrivals (simulator), one row per mode."""

    seed: int
    rows: list[CompareRow]
    skipped: dict[str, str] = Field(default_factory=dict, description="Modes that cannot run this workload, why")
    static_sweep: dict[str, float | None] = Field(
        default_factory=dict, description="max_num_seqs -> fcfs SLO attainment at that static cap"
    )
    interrupted: bool = False
    wall_time_s: float | None = None


class CapacityRow(Section):
    mode: str
    capacity_rps: float | None = Field(description="Highest rate with SLO attainment >= the target")
    replicas: int
    capacity_per_replica_rps: float | None
    ratio_to_first: float | None = Field(description="capacity / the first row's (the baseline's)")
    probes: int
    bracket_rps: list[float] = Field(default_factory=list)
    other: dict[str, Scalar] = Field(default_factory=dict, description="Further figures of the row, verbatim")


class CapacitySection(Section):
    """`--job capacity`: each mode's highest rate at the attainment target (simulator, bisection)."""

    attainment_target: float
    offered_rate_rps: float | None = Field(description="The profile's own arrival rate (null for a trace)")
    rows: list[CapacityRow]
    skipped: dict[str, str] = Field(default_factory=dict)


class CalibrationSection(Section):
    """`--job calibrate`: the step-time model fitted to a sweep of the live server."""

    path: str | None = Field(description="The calibration written (load it with engine.calibration)")
    points: int
    observations: int | None
    rms_relative_error: float | None
    max_relative_error: float | None
    terms: list[dict[str, Scalar]] = Field(default_factory=list, description="The fitted roofline terms")
    request_overhead_s: float | None
    median_itl_s: float | None
    fitted_decode_step_s: float | None
    kv_capacity_tokens: int | None
    noise_cv: float | None
    default_acceptance: float | None
    wall_time_s: float | None
    interrupted: bool = False


# ---------------------------------------------------------------- sustainability


class Figure(Section):
    value: float | None
    unit: str
    basis: FigureBasis = Field(
        description=(
            "measured: from a hardware energy counter or sampled power; modelled: from the simulator's "
            "power model; estimated: measured energy combined with assumed factors (grid intensity, PUE); "
            "unavailable: not known (see reason)"
        )
    )
    source: str
    reason: str | None = None


class EnergyMeterInfo(Section):
    basis: Literal["measured", "modelled", "unavailable"]
    method: str
    device: str | None
    window_s: float
    reason: str | None
    note: str | None


class CarbonInputs(Section):
    grid_intensity_gco2e_per_kwh: float
    grid_intensity_source: str
    grid_intensity_year: int
    grid_region: str
    accounting: Literal["location-based"] = "location-based"
    pue: float
    pue_source: str
    pue_year: int


class SustainabilitySection(Section):
    meter: EnergyMeterInfo | None = Field(description="The energy reading; null when no meter ran")
    energy_j: Figure
    avg_power_w: Figure
    wh_per_1k_output_tokens: Figure
    j_per_request: Figure = Field(description="Energy per completed request")
    gco2e_per_1k_output_tokens: Figure
    carbon_inputs: CarbonInputs
    formulas: dict[str, str]


# ---------------------------------------------------------------- provenance and top level


class Provenance(Section):
    generated_at: datetime
    run_started_at: datetime
    slo_console_version: str
    git_revision: str
    command_line: list[str]
    seed: int
    profile_name: str
    profile_hash: str
    profile_path: str | None


class Factsheet(Section):
    schema_name: Literal["slo-console-factsheet"] = Field(default="slo-console-factsheet", alias="schema")
    schema_version: Literal["1.2"] = SCHEMA_VERSION
    title: str
    job: JobName = Field(default="run", description="The job that wrote this factsheet")
    verdict: Verdict
    system: SystemSection
    configuration: ConfigurationSection
    workload: WorkloadSection | None = Field(description="null: the job ran no workload of the profile")
    performance: PerformanceSection | None = Field(
        description="One run's measurements; null for jobs that measure no single run (capacity, calibrate)"
    )
    tuning: TuningSection | None
    compare: CompareSection | None = None
    capacity: CapacitySection | None = None
    calibration: CalibrationSection | None = None
    sustainability: SustainabilitySection | None
    provenance: Provenance
    caveats: list[str]

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
