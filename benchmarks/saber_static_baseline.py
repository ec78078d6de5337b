"""The static baseline of SABER's evaluation (paper 001 sec. III-B, VI-B) on the simulator, and the engines it
runs on: shared by benchmarks/saber_vs_static.py (SABER against it) and benchmarks/saber_paper_regime.py (an
engine fitted to the paper's static-baseline figures).

The protocol: for a workload at a request rate, `requests` Poisson requests per run, `seeds` runs, fcfs at
each static max_num_seqs of the profile's `saber.static_caps` (10, 20, ..., 100); the best static cap is the
one with the highest SLO attainment averaged over the seeds, the smallest such cap on a tie.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.compare import run_mode, with_cap
from core.jobs import RunOptions, RunResult
from core.profile import PoissonArrival, Profile, load_calibration


def at_rate(profile: Profile, rate: float, requests: int, saber: dict[str, Any]) -> Profile:
    workload = profile.workload.model_copy(
        update={"arrival": PoissonArrival(rate_rps=rate), "requests": requests, "warmup_requests": 0}
    )
    return profile.model_copy(update={"workload": workload, "saber": profile.saber.model_copy(update=saber)})


def ratios(result: RunResult) -> np.ndarray:
    """e2e / SLA of every completed measured request (the quantity behind SABER's CV, eq. 1)."""
    values = [
        r.e2e_s / r.slo.e2e_s
        for r in result.records
        if r.ok and not r.warmup and r.e2e_s is not None and r.slo.e2e_s is not None
    ]
    return np.array(values, dtype=float)


def cv(values: np.ndarray) -> float:
    return float(np.std(values) / np.mean(values)) if len(values) > 1 else float("nan")


def mean(results: list[RunResult], field: str) -> float:
    return statistics.fmean(getattr(r.summary, field) for r in results)


async def measure(
    profile: Profile, mode: str, seeds: int, described: list[dict[str, Any]] | None = None
) -> list[RunResult]:
    results = []
    for seed in range(seeds):
        result, ran = await run_mode(profile.model_copy(update={"mode": mode}), mode, seed, RunOptions(seed=seed))
        results.append(result)
        if described is not None:
            described.append(ran)
    return results


@dataclass(frozen=True)
class StaticBest:
    """The best static cap at one (workload, rate): its cap, runs, mean attainment and mean e2e/SLA."""

    cap: int
    results: list[RunResult]

    @property
    def attainment(self) -> float:
        return mean(self.results, "slo_attainment")

    @property
    def ratios(self) -> np.ndarray:
        return np.concatenate([ratios(r) for r in self.results])

    @property
    def mean_ratio(self) -> float:
        values = self.ratios
        return float(values.mean()) if len(values) else float("nan")


def peak_in_flight(result: RunResult) -> int:
    """The most requests between arrival and end at once: under fcfs every request goes to the engine at
    arrival, so no batch cap at or above this was ever reached in the run."""
    events = sorted(
        (t, step) for r in result.records if r.end_s is not None for t, step in ((r.arrival_s, 1), (r.end_s, -1))
    )
    peak = current = 0
    for _, step in events:  # an end before an arrival at the same instant: (t, -1) sorts first
        current += step
        peak = max(peak, current)
    return peak


async def best_static(profile: Profile, rate: float, requests: int, seeds: int) -> StaticBest:
    """The best static max_num_seqs of `profile` at `rate` (sec. VI-B: best of the caps per workload and rate,
    on attainment averaged over the seeds; ties go to the smallest cap).

    The largest cap runs first; a cap at or above the most requests in flight in every seed's run of it never
    binds, so its runs are those same runs (the engine's draws do not depend on an unreached cap) and are not
    simulated again: at light load most caps never bind."""
    at = at_rate(profile, rate, requests, {})
    caps = sorted(profile.saber.static_caps)
    largest = await measure(with_cap(at, caps[-1]), "fcfs", seeds)
    unbound_from = max(peak_in_flight(r) for r in largest)
    runs = {
        cap: largest if cap >= unbound_from else await measure(with_cap(at, cap), "fcfs", seeds) for cap in caps[:-1]
    }
    runs[caps[-1]] = largest
    cap = max(runs, key=lambda c: (mean(runs[c], "slo_attainment"), -c))
    return StaticBest(cap, runs[cap])


def with_engine(profile: Profile, per_seq_s: float = 0.0, base_s: float | None = None) -> Profile:
    """The profile on a hypothetical engine: its calibration with `per_seq_s` seconds per sequence per step
    added to the memory-bound term (host work per request that grows with the batch, so per-request speed
    falls faster with concurrency) and, if given, that term's fixed step time set to `base_s` (so f(1) is
    about 1 / base_s). A sensitivity check or a fitted regime, not a measured machine."""
    calibration = load_calibration(profile)
    first = calibration.terms[0]
    update: dict[str, float] = {"per_seq_s": first.per_seq_s + per_seq_s}
    if base_s is not None:
        update["base_s"] = base_s
    terms = [first.model_copy(update=update), *calibration.terms[1:]]
    name = f"{calibration.name}+seq{per_seq_s:g}" + (f"+base{base_s:g}" if base_s is not None else "")
    changed = calibration.model_copy(update={"name": name, "terms": terms})
    return profile.model_copy(update={"engine": profile.engine.model_copy(update={"calibration": changed})})


def with_length_sigma(profile: Profile, sigma: float) -> Profile:
    """Every task's prompt and output lengths with lognormal spread `sigma` (the profiles' 0.5 is our
    assumption: the paper gives only means, Table I). A request whose length needs more than f(1) misses on an
    idle engine, so the spread bounds attainment at light load (sec. VI-C: near 100% below 4 RPS)."""
    tasks = [
        t.model_copy(
            update={
                "prompt_tokens": t.prompt_tokens.model_copy(update={"sigma": sigma}),
                "output_tokens": t.output_tokens.model_copy(update={"sigma": sigma}),
            }
        )
        for t in profile.workload.tasks
    ]
    return profile.model_copy(update={"workload": profile.workload.model_copy(update={"tasks": tasks})})
