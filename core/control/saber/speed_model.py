"""SABER's offline phase (paper 001 sec. IV-B): measure per-request token speed against concurrency, fit f(L).

Step 1 (measurement): closed-loop runs with L clients against an engine whose batch cap exceeds L, over
several concurrency levels and task mixes. For every finished request: speed = generated tokens / execution
time (send to last token), and its load = the time-averaged number of requests in flight while it executed
(computed from all requests' intervals, so a request that overlapped the ramp-down at the end of a run is
credited with the lower load it actually saw).

Step 2 (fit): the Universal Scalability Law for per-request speed, plus the linear and logistic alternatives
the paper compares in sec. VII, each with its R² on the measured points; scipy.optimize.curve_fit does the
fitting. USL models throughput X(L) = lam * L / (1 + sigma (L - 1) + kappa L (L - 1)); one request's share is
X(L) / L, so f(L) = lam / (1 + sigma (L - 1) + kappa L (L - 1)).

The simulator path profiles the simulated engine exactly as one would profile a server: it only sees the
records a run produces, never the calibration's step-time terms. The engine is handed in (`Simulate`;
core/modes.py passes core/sim/engine.simulate), so this package never imports the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy.optimize import curve_fit

from core.backend_api import LoadPlan
from core.profile import Calibration, ClosedLoopArrival, KnobsSpec, Profile, ProfileError
from core.records import RequestRecord
from core.workload import build_load_plan

ModelKind = Literal["usl", "linear", "logistic"]
MODEL_KINDS: tuple[ModelKind, ...] = ("usl", "linear", "logistic")
# Concurrency levels profiled by default: the paper sweeps static caps 10-100 (sec. III-B); the low end
# (1-8) pins down f(1), the fastest speed, which decides demotion to the low tier.
DEFAULT_LOADS: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 100)
DEFAULT_POINTS = 1000  # the paper fits on about 1,000 load-speed pairs (sec. IV-B step 2)
MIN_SPEED_TPS = 1e-6  # floor of a prediction: a model must never predict zero or negative speed

# Runs a load plan to its end on the engine being profiled: (calibration, knobs, plan, seed) -> the records.
Simulate = Callable[[Calibration, KnobsSpec, LoadPlan, int], Sequence[RequestRecord]]


@dataclass(frozen=True, slots=True)
class SpeedSample:
    """One measured request: the load it ran under and its token speed."""

    load: float
    speed_tps: float
    task: str = ""


def _usl(load: np.ndarray, lam: float, sigma: float, kappa: float) -> np.ndarray:
    return lam / (1.0 + sigma * (load - 1.0) + kappa * load * (load - 1.0))


def _linear(load: np.ndarray, intercept: float, slope: float) -> np.ndarray:
    return intercept + slope * load


def _logistic(load: np.ndarray, top: float, rate: float, midpoint: float) -> np.ndarray:
    # Decreasing logistic: near `top` at low load, falling around `midpoint`.
    return top / (1.0 + np.exp(rate * (load - midpoint)))


_CURVES: dict[ModelKind, Callable[..., np.ndarray]] = {"usl": _usl, "linear": _linear, "logistic": _logistic}


@dataclass(frozen=True, slots=True)
class SpeedModel:
    """A fitted f(L): predicted per-request token speed (tokens/s) at concurrency L."""

    kind: ModelKind
    params: tuple[float, ...]
    r2: float
    points: int

    def __call__(self, load: float) -> float:
        value = float(_CURVES[self.kind](np.asarray(float(load)), *self.params))
        return value if value > MIN_SPEED_TPS else MIN_SPEED_TPS

    @property
    def fastest_tps(self) -> float:
        """The fastest speed the engine achieves: f(1), one request alone (sec. IV-C step 1)."""
        return self(1.0)

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "params": [round(p, 6) for p in self.params], "r2": round(self.r2, 4)}


def r_squared(observed: np.ndarray, predicted: np.ndarray) -> float:
    """Coefficient of determination 1 - SS_res / SS_tot (NaN when the observations do not vary)."""
    ss_tot = float(np.sum((observed - observed.mean()) ** 2))
    if ss_tot <= 0:
        return math.nan
    return 1.0 - float(np.sum((observed - predicted) ** 2)) / ss_tot


def fit_speed_model(samples: Sequence[SpeedSample], kind: ModelKind = "usl") -> SpeedModel:
    """Fit one model family to the measured (load, speed) points with scipy's curve_fit."""
    if len(samples) < 4:
        raise ValueError(f"need at least 4 load-speed samples to fit f(L), got {len(samples)}")
    load = np.array([s.load for s in samples], dtype=float)
    speed = np.array([s.speed_tps for s in samples], dtype=float)
    top = float(np.max(speed))
    if kind == "usl":
        p0, bounds = [top, 0.01, 1e-4], ([0.0, 0.0, 0.0], [np.inf, 10.0, 10.0])
    elif kind == "linear":
        p0, bounds = [top, -top / max(1.0, float(load.max()))], ([-np.inf, -np.inf], [np.inf, np.inf])
    else:
        mid = float(np.median(load))
        p0, bounds = [top, 4.0 / max(1.0, float(load.max())), mid], ([0.0, 0.0, -np.inf], [np.inf, np.inf, np.inf])
    params, _ = curve_fit(_CURVES[kind], load, speed, p0=p0, bounds=bounds, maxfev=20000)
    predicted = _CURVES[kind](load, *params)
    return SpeedModel(
        kind=kind, params=tuple(float(p) for p in params), r2=r_squared(speed, predicted), points=len(load)
    )


def fit_all(samples: Sequence[SpeedSample]) -> dict[ModelKind, SpeedModel]:
    """USL, linear and logistic fits of the same points (sec. VII compares them by R²)."""
    return {kind: fit_speed_model(samples, kind) for kind in MODEL_KINDS}


# ---------------------------------------------------------------- measurement (sec. IV-B step 1)


def speed_samples(records: Sequence[RequestRecord], skip_first: int = 0) -> list[SpeedSample]:
    """Load-speed pairs from one run's records: speed = tokens / (end - sent); load = mean in-flight count
    over the request's own execution interval. The first `skip_first` requests sent are dropped (a closed
    loop starts with every client sending at once, a burst no steady state shows)."""
    done = [r for r in records if r.ok and r.sent_s is not None and r.end_s is not None and r.end_s > r.sent_s]
    if not done:
        return []
    starts = np.array([r.sent_s for r in done], dtype=float)
    ends = np.array([r.end_s for r in done], dtype=float)
    # In-flight count as a step function of time, and its running integral at each event time.
    times = np.concatenate([starts, ends])
    deltas = np.concatenate([np.ones(len(starts)), -np.ones(len(ends))])
    order = np.lexsort((deltas, times))  # at equal times, ends (-1) before starts (+1)
    times, deltas = times[order], deltas[order]
    count_after = np.cumsum(deltas)
    area = np.concatenate([[0.0], np.cumsum(count_after[:-1] * np.diff(times))])
    inflight_area = np.interp(ends, times, area) - np.interp(starts, times, area)
    loads = inflight_area / (ends - starts)
    keep = np.argsort(starts, kind="stable")[skip_first:]
    return [
        SpeedSample(
            load=float(loads[i]), speed_tps=done[i].output_tokens / float(ends[i] - starts[i]), task=done[i].task
        )
        for i in keep
    ]


def _mixes(profile: Profile) -> list[Profile]:
    """The profile's own task mix and, when it has several tasks, the balanced mix of the same tasks."""
    mixes = [profile]
    tasks = profile.workload.tasks
    if len(tasks) > 1 and len({t.weight for t in tasks}) > 1:
        balanced = [t.model_copy(update={"weight": 1.0}) for t in tasks]
        workload = profile.workload.model_copy(update={"tasks": balanced})
        mixes.append(profile.model_copy(update={"workload": workload}))
    return mixes


def profile_speeds(
    profile: Profile,
    calibration: Calibration,
    simulate: Simulate,
    *,
    loads: Sequence[int] = DEFAULT_LOADS,
    points: int = DEFAULT_POINTS,
    seed: int = 0,
) -> list[SpeedSample]:
    """Closed-loop simulator runs with L clients for each L in `loads` and each task mix; about `points`
    samples in all. The engine's batch cap is set above the largest L (sec. IV-B step 1)."""
    if not profile.workload.tasks:
        raise ProfileError(
            f"{profile.name}: SABER profiles token speed on the workload's task mix, and this workload has none"
            " (a trace); give workload.tasks to use --mode saber"
        )
    mixes = _mixes(profile)
    per_run = max(8, math.ceil(points / (len(loads) * len(mixes))))
    knobs = KnobsSpec(
        max_num_seqs=max(loads) + 1,
        max_num_batched_tokens=profile.knobs.max_num_batched_tokens,
        chunked_prefill=profile.knobs.chunked_prefill,
    )
    samples: list[SpeedSample] = []
    run = 0
    for mix in mixes:
        for load in loads:
            workload = mix.workload.model_copy(
                update={
                    "arrival": ClosedLoopArrival(clients=load),
                    "requests": load + per_run,
                    "duration_s": None,
                    "warmup_requests": 0,
                    "warmup_s": 0.0,
                }
            )
            plan = build_load_plan(mix.model_copy(update={"workload": workload}), seed=seed + run)
            samples.extend(speed_samples(simulate(calibration, knobs, plan, seed + run), skip_first=load))
            run += 1
    return samples


@dataclass(slots=True)
class SpeedProfile:
    """The offline phase's output: the measured points and every fitted model."""

    samples: list[SpeedSample]
    models: dict[ModelKind, SpeedModel] = field(default_factory=dict)

    def describe(self) -> dict[str, object]:
        return {"points": len(self.samples), "models": {k: m.describe() for k, m in self.models.items()}}


_CACHE: dict[tuple[str, ...], SpeedProfile] = {}


def offline_phase(
    profile: Profile,
    calibration: Calibration,
    simulate: Simulate,
    *,
    loads: Sequence[int] = DEFAULT_LOADS,
    seed: int = 0,
) -> SpeedProfile:
    """Profile and fit once per (calibration, task mix, batching knobs, loads, seed); later calls reuse it
    (`--job compare` builds a SABER policy per run; the engine it profiles does not change between them)."""
    key = (
        calibration.model_dump_json(),
        profile.workload.model_dump_json(include={"tasks"}),
        str(profile.knobs.max_num_batched_tokens),
        str(profile.knobs.chunked_prefill),
        repr(tuple(loads)),
        str(seed),
    )
    cached = _CACHE.get(key)
    if cached is None:
        samples = profile_speeds(profile, calibration, simulate, loads=loads, seed=seed)
        cached = SpeedProfile(samples=samples, models=fit_all(samples))
        _CACHE[key] = cached
    return cached
