"""Profiles: YAML files that say what to run (workload, SLOs, knobs, engine calibration), validated.

Every model forbids unknown keys, so a typo is refused with the file, the field path and what was
expected, instead of being silently ignored. `load_profile` raises `ProfileError` carrying that one line.

`core.profile` is the public import path (README, Profiles); the models live in:
workload_spec.py  the offered load: request lengths, arrivals, tasks, traces, SLOs, smooth goodput
serving_spec.py   the server: knobs, the step-time calibration, power, carbon inputs, how vLLM is launched
mode_specs.py     the tuner and each scheduling mode's settings (AdaServe, SABER, SLOs-Serve)
model.py          `Profile`, the whole document
scheduling_mode.py `SchedulingMode`: the scheduling mode, one type validated once
errors.py         `ProfileError`: bad input (exit code 2)
loading.py        reading profiles and the files they name, provenance hash
"""

from core.profile.errors import ProfileError
from core.profile.loading import (
    PROFILES_DIR,
    load_calibration,
    load_profile,
    profile_hash,
    profile_source,
    resolve_profile_path,
    resolve_relative,
)
from core.profile.mode_specs import AdaServeSpec, SaberSpec, SlosServeSpec, TunerSpec
from core.profile.model import Profile
from core.profile.scheduling_mode import DEFAULT_MODE, SCHEDULING_MODES, SchedulingMode, parse_scheduling_mode
from core.profile.serving_spec import (
    Calibration,
    EngineSpec,
    KnobsSpec,
    PerfTerm,
    PowerModel,
    ServerSpec,
    StallModel,
    SustainabilitySpec,
)
from core.profile.strict import Strict
from core.profile.workload_spec import (
    MAX_TOKENS,
    Arrival,
    ClosedLoopArrival,
    ConstantArrival,
    EmpiricalLength,
    FixedLength,
    GammaArrival,
    LengthDist,
    LognormalLength,
    OnOffArrival,
    PoissonArrival,
    SLOSpec,
    SmoothGoodputSpec,
    TaskSpec,
    TraceSpec,
    UniformLength,
    WorkloadSpec,
)

__all__ = [
    "DEFAULT_MODE",
    "MAX_TOKENS",
    "PROFILES_DIR",
    "SCHEDULING_MODES",
    "AdaServeSpec",
    "Arrival",
    "Calibration",
    "ClosedLoopArrival",
    "ConstantArrival",
    "EmpiricalLength",
    "EngineSpec",
    "FixedLength",
    "GammaArrival",
    "KnobsSpec",
    "LengthDist",
    "LognormalLength",
    "OnOffArrival",
    "PerfTerm",
    "PoissonArrival",
    "PowerModel",
    "Profile",
    "ProfileError",
    "SLOSpec",
    "SaberSpec",
    "SchedulingMode",
    "ServerSpec",
    "SlosServeSpec",
    "SmoothGoodputSpec",
    "StallModel",
    "Strict",
    "SustainabilitySpec",
    "TaskSpec",
    "TraceSpec",
    "TunerSpec",
    "UniformLength",
    "WorkloadSpec",
    "load_calibration",
    "load_profile",
    "parse_scheduling_mode",
    "profile_hash",
    "profile_source",
    "resolve_profile_path",
    "resolve_relative",
]
