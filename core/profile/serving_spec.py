"""Profile sections that describe the server: knobs, the calibrated step-time model, power, carbon, launch."""

# No `from __future__ import annotations` in the model modules: see core/profile/strict.py.
from typing import Annotated, Literal

from pydantic import Field

from core.profile.strict import Strict

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
    """Modelled accelerator power: idle + (peak - idle) * utilisation (utilisation = busy share). The one
    definition: the simulator's power samples (core/sim/engine.py) and modelled energy
    (core/energy/modelled.py) both ask it."""

    idle_w: Annotated[float, Field(ge=0)]
    peak_w: Annotated[float, Field(ge=0)]

    def power_w(self, utilisation: float) -> float:
        """Power drawn at `utilisation`, the busy share of the time (0..1): idle_w + slope_w * utilisation."""
        return self.idle_w + self.slope_w() * utilisation

    def slope_w(self) -> float:
        """What full utilisation adds to idle_w. The simulator reads it and idle_w once per run and applies
        power_w's line itself to each of its samples (core/sim/engine.py: a pydantic method call per sample,
        47k in a 100k-request run, was 1.8% of it); tests/test_energy.py holds the two equal."""
        return self.peak_w - self.idle_w

    def energy_j(self, busy_s: float, window_s: float) -> float:
        """Energy over a `window_s` window in which the engine was busy `busy_s` seconds: power_w integrated
        over the window, idle_w * window_s + (peak_w - idle_w) * busy_s."""
        return self.idle_w * window_s + (self.peak_w - self.idle_w) * busy_s


class StallModel(Strict):
    """Stalls of a shared machine: pauses in which no client hears from the server (another process holds the
    cores, the API process collects garbage, ...). They come as a Poisson process over the engine's busy time
    at `rate_per_s`, each lasting a lognormal time of mean `mean_s` and coefficient of variation `cv`; a stall
    lengthens the step it falls in. Measured by `--job calibrate` from gaps in the merged token stream of all
    clients (core/calibrate/stalls.py). Per-step noise (`noise_cv`) is independent step to step and averages
    out over a request; a stall delays every request in flight at once, which is what makes a CPU server's p99
    several times its median."""

    rate_per_s: Annotated[float, Field(ge=0)]
    mean_s: Annotated[float, Field(ge=0)]
    cv: Annotated[float, Field(ge=0)] = 1.0


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
    stalls: StallModel | None = None  # None: a dedicated machine (the spec-derived calibrations)


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
