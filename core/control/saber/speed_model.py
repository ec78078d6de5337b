"""SABER's offline phase (paper 001 sec. IV-B): measure per-request token speed against concurrency, fit f(L).

Step 1 (measurement): closed-loop runs with L clients against an engine whose batch cap exceeds L, over
several concurrency levels and task mixes (for a trace, requests drawn from its own rows: `TraceLengths`).
For every finished request: speed = generated tokens / execution
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

import hashlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from core.backend_api import LoadPlan
from core.profile import Calibration, ClosedLoopArrival, KnobsSpec, Profile, ProfileError, resolve_relative
from core.records import RequestRecord, RequestSpec
from core.workload import build_load_plan, load_trace

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
    # Imported here, not with the module (0.2-0.35 CPU-s): a process that only takes a fitted profile from
    # another (`adopt_offline_phase`: a capacity job's parent unpickling the offline task's result, and each
    # worker unpickling it with its probes) or builds a SaberPolicy from one never fits.
    from scipy.optimize import curve_fit

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


@dataclass(frozen=True, slots=True)
class TraceLengths:
    """A trace's own requests as SABER's offline phase sees them: lengths and task names only.

    The paper profiles on "workload samples" of the traffic to be served (sec. IV-B step 1). For a recorded
    trace those are its rows: what an operator has before the run is their traffic's history, so profiling
    draws (prompt, output) pairs from it, keeping each row's pair together (long prompts and long outputs are
    not independent in real traffic). Arrival times and SLOs are not used: f(L) is the engine's speed at
    concurrency L on this length mix, nothing about when requests come or what they are owed."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    tasks: list[str]

    @classmethod
    def of(cls, profile: Profile) -> TraceLengths:
        spec = profile.workload.trace
        assert spec is not None
        table = load_trace(spec, resolve_relative(profile, spec.path))
        tasks = [task if task is not None else "default" for task in table.tasks]
        return cls(table.prompt_tokens, table.output_tokens, tasks)

    def mixes(self) -> list[np.ndarray]:
        """Row weights of each profiled mix: the trace as recorded and, when its rows name several tasks in
        unequal numbers, the balanced mix of the same tasks (each task equally likely), as `_mixes` does for
        a task mix (the paper profiles several workload compositions, sec. IV-B step 2)."""
        n = len(self.tasks)
        mixes = [np.full(n, 1.0 / n)]
        names, index, counts = np.unique(np.array(self.tasks), return_inverse=True, return_counts=True)
        if len(names) > 1 and len(set(counts.tolist())) > 1:
            weights = 1.0 / counts[index]
            mixes.append(weights / weights.sum())
        return mixes

    def plan(self, weights: np.ndarray, clients: int, count: int, rng: np.random.Generator) -> LoadPlan:
        """A closed loop of `clients` clients sending `count` rows drawn (with replacement) by `weights`."""
        rows = rng.choice(len(self.tasks), size=count, p=weights).tolist()
        prompts, outputs = self.prompt_tokens.tolist(), self.output_tokens.tolist()
        specs = [
            RequestSpec(request_id=i, prompt_tokens=prompts[r], output_tokens=outputs[r], task=self.tasks[r])
            for i, r in enumerate(rows)
        ]
        return LoadPlan(requests=iter(specs), mode="closed", concurrency=clients, max_requests=count)

    def digest(self) -> str:
        """Identifies the length mix (the offline phase's cache key): the same rows give the same f(L)."""
        h = hashlib.sha256(self.prompt_tokens.tobytes())
        h.update(self.output_tokens.tobytes())
        h.update("\0".join(self.tasks).encode())
        return h.hexdigest()


def _profiling_plans(
    profile: Profile, loads: Sequence[int], points: int, seed: int, trace: TraceLengths | None
) -> Iterator[tuple[int, int, LoadPlan]]:
    """(L, run seed, closed-loop plan) for each profiled mix and concurrency L: the profile's task mixes, or
    the trace's own rows when it replays one; `load + per_run` requests a run, the first L dropped later."""
    mix_count = len(trace.mixes()) if trace is not None else len(_mixes(profile))
    per_run = max(8, math.ceil(points / (len(loads) * mix_count)))
    run = 0
    if trace is not None:
        for weights in trace.mixes():
            for load in loads:
                rng = np.random.default_rng(seed + run)
                yield load, seed + run, trace.plan(weights, load, load + per_run, rng)
                run += 1
        return
    for mix in _mixes(profile):
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
            yield load, seed + run, build_load_plan(mix.model_copy(update={"workload": workload}), seed=seed + run)
            run += 1


def profile_speeds(
    profile: Profile,
    calibration: Calibration,
    simulate: Simulate,
    *,
    loads: Sequence[int] = DEFAULT_LOADS,
    points: int = DEFAULT_POINTS,
    seed: int = 0,
    trace: TraceLengths | None = None,
) -> list[SpeedSample]:
    """Closed-loop simulator runs with L clients for each L in `loads` and each mix; about `points` samples
    in all. The engine's batch cap is set above the largest L (sec. IV-B step 1). The requests come from the
    workload itself: the profile's tasks, or for a trace its own rows (`TraceLengths`, read from the profile
    when not given)."""
    if trace is None and profile.workload.trace is not None:
        trace = TraceLengths.of(profile)
    knobs = KnobsSpec(
        max_num_seqs=max(loads) + 1,
        max_num_batched_tokens=profile.knobs.max_num_batched_tokens,
        chunked_prefill=profile.knobs.chunked_prefill,
    )
    samples: list[SpeedSample] = []
    for load, run_seed, plan in _profiling_plans(profile, loads, points, seed, trace):
        samples.extend(speed_samples(simulate(calibration, knobs, plan, run_seed), skip_first=load))
    if len(samples) < 4:
        raise ProfileError(
            f"{profile.name}: SABER's offline phase measured {len(samples)} requests on this workload, too few to"
            " fit f(L); check that its requests fit the engine's max_model_len"
        )
    return samples


@dataclass(slots=True)
class SpeedProfile:
    """The offline phase's output: the measured points and every fitted model."""

    samples: list[SpeedSample]
    models: dict[ModelKind, SpeedModel] = field(default_factory=dict)

    def describe(self) -> dict[str, object]:
        return {"points": len(self.samples), "models": {k: m.describe() for k, m in self.models.items()}}


_CACHE: dict[tuple[str, ...], SpeedProfile] = {}


def _offline_key(profile: Profile, calibration: Calibration, loads: Sequence[int], seed: int) -> tuple[str, ...]:
    trace = TraceLengths.of(profile) if profile.workload.trace is not None else None
    return (
        calibration.model_dump_json(),
        trace.digest() if trace is not None else profile.workload.model_dump_json(include={"tasks"}),
        str(profile.knobs.max_num_batched_tokens),
        str(profile.knobs.chunked_prefill),
        repr(tuple(loads)),
        str(seed),
    )


def offline_phase(
    profile: Profile,
    calibration: Calibration,
    simulate: Simulate,
    *,
    loads: Sequence[int] = DEFAULT_LOADS,
    seed: int = 0,
) -> SpeedProfile:
    """Profile and fit once per (calibration, task mix or trace lengths, batching knobs, loads, seed); later calls
    reuse it (`--job compare` builds a SABER policy per run, `--job capacity` one per probe of a rescaled trace;
    neither changes the engine or the lengths it profiles)."""
    key = _offline_key(profile, calibration, loads, seed)
    cached = _CACHE.get(key)
    if cached is None:
        trace = TraceLengths.of(profile) if profile.workload.trace is not None else None
        samples = profile_speeds(profile, calibration, simulate, loads=loads, seed=seed, trace=trace)
        cached = SpeedProfile(samples=samples, models=fit_all(samples))
        _CACHE[key] = cached
    return cached


def adopt_offline_phase(
    profile: Profile, calibration: Calibration, speeds: SpeedProfile, *, loads: Sequence[int], seed: int
) -> None:
    """Take an offline phase that another process ran for the same engine, lengths, loads and seed (a job's
    probes on a pool of workers, each its own process): `offline_phase` then returns it instead of profiling
    again, as it would in the process that ran it."""
    _CACHE[_offline_key(profile, calibration, loads, seed)] = speeds
