"""SLO-Tuner searches against an exhaustive grid, with a guide that is never the truth (issue 12 item 3).

Each scenario has two worlds:
  truth  the world a search is scored in (what a live server would be): the shipped calibration with every
         step-time coefficient, the draft-pass price, the acceptance rate and the noise perturbed by a
         seeded random error, and its own noise seed. The errors are of the size the simulator-vs-live
         grid in docs/calibration.md measured (13-221% per cell); the table prints the p99 miss it produced.
  guide  the shipped, unperturbed calibration with the scenario's nominal seed: what the user's simulator
         believes. Searches may consult it as often as they like; its evaluations are reported, not hidden.
The grid measures every configuration the neighbour rule reaches from the start in the truth. Each search
runs in the truth from the profile's own knobs (closed loop: the paper's default-like 8/8/8/on; open loop:
no in-flight cap) and is scored by the grid's measurement of its answer (common random numbers: the same
configuration and seed give the same segment), so share = S(answer) / S(grid optimum) is exact.

Searches (a truth segment stands for one live segment: a vLLM restart, warm-up and window):
  hillclimb  the paper's Algorithm 1, T = 8 steps, its own cost
  halving    successive halving over a coarse grid ordered by distance from the start, then a local climb
  simrank    hill-climb over guide-ranked moves (diagonals included), measured in the truth
  guided     sweep the guide, measure the baseline and the guide's picks within a headroom ladder, then a
             simrank climb in the truth (the default, core/tune/guided.py)
halving, simrank and guided get BUDGET truth segments, the final re-measurement included.

    python benchmarks/tuner_vs_grid.py [--scenarios N] [--workers N | --executor ray [--ray-address A]] [--cache DIR]

Scenarios run side by side on the executor seam (core/executor.py; --workers 1: one after another here).

Segments are shortened (tuner.sim_min_requests 400 / 30 s) so that the grids run in minutes.
"""

from __future__ import annotations

import argparse
import math
import pickle
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._executor_args import add_executor_arguments, describe, executor_spec, run_tasks
from core.profile import Calibration, Profile, load_calibration, load_profile
from core.tune.evaluator import Evaluator
from core.tune.guided import guided_search
from core.tune.hillclimb import hill_climb
from core.tune.job import knob_space
from core.tune.knobspace import Point
from core.tune.search import simrank_climb, successive_halving
from core.tune.segment import Measurement, SimSegmentRunner

ALGORITHMS = ("hillclimb", "halving", "simrank", "guided")
BUDGET = 16  # truth ("live-equivalent") segments, final re-measurement included
GOAL_SHARE = 0.95
TUNER = {"sim_min_requests": 400, "sim_min_duration_s": 30.0}
TRUTH_SEED_OFFSET = 1000  # the truth's noise seed differs from the guide's
# Calibration error: each coefficient times exp(N(0, sigma)), clipped; acceptance shifted, noise scaled.
COEFF_SIGMA = 0.45
COEFF_RANGE = (0.4, 2.6)
ACCEPT_SHIFT_SD = 0.15


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    calibration: str  # a profile (name or path) whose calibration is the guide
    slo_s: float
    workload: dict[str, Any]
    seed: int


def chat(prompt: float, output: float, out_max: int, acceptance: float | None = None) -> list[dict[str, Any]]:
    task: dict[str, Any] = {
        "name": "chat",
        "prompt_tokens": {"dist": "lognormal", "mean": prompt, "sigma": 0.5, "max": 2048},
        "output_tokens": {"dist": "lognormal", "mean": output, "sigma": 0.25, "max": out_max},
    }
    if acceptance is not None:
        task["acceptance"] = acceptance
    return [task]


CLOSED = {"arrival": {"kind": "closed", "clients": 8}, "warmup_requests": 50}
QUICKSTART_TASKS = [
    {
        "name": "chat",
        "prompt_tokens": {"dist": "lognormal", "mean": 384, "sigma": 0.6, "max": 1536},
        "output_tokens": {"dist": "lognormal", "mean": 64, "sigma": 0.4, "max": 96},
    }
]
SCENARIOS = [
    Scenario("paper 1.2s", "slo-tuner-paper", 1.2, {**CLOSED, "tasks": chat(320, 56, 64)}, 1),
    Scenario("paper 0.8s", "slo-tuner-paper", 0.8, {**CLOSED, "tasks": chat(320, 56, 64)}, 2),
    Scenario("long out 2.0s", "slo-tuner-paper", 2.0, {**CLOSED, "tasks": chat(320, 128, 256)}, 3),
    Scenario("high accept", "slo-tuner-paper", 1.2, {**CLOSED, "tasks": chat(320, 56, 64, 0.85)}, 4),
    Scenario("long prompt 1.0s", "slo-tuner-paper", 1.0, {**CLOSED, "tasks": chat(1200, 56, 64)}, 6),
    Scenario("paper 0.5s", "slo-tuner-paper", 0.5, {**CLOSED, "tasks": chat(320, 56, 64)}, 13),
    Scenario(
        "bursty open 1.5s",
        "slo-tuner-paper",
        1.5,
        {"arrival": {"kind": "onoff", "rate_rps": 40, "on_s": 2, "off_s": 2}, "tasks": chat(320, 56, 64)},
        7,
    ),
    Scenario(
        "quickstart 1.2s",
        "quickstart",
        1.2,
        {"arrival": {"kind": "poisson", "rate_rps": 17}, "warmup_requests": 100, "tasks": QUICKSTART_TASKS},
        15,
    ),
    Scenario("7b closed 3s", "adaserve-mix", 3.0, {**CLOSED, "tasks": chat(512, 128, 256)}, 8),
    Scenario(
        "7b poisson 4s",
        "adaserve-mix",
        4.0,
        {"arrival": {"kind": "poisson", "rate_rps": 5}, "tasks": chat(512, 128, 256)},
        9,
    ),
    Scenario("cpu tiny 1.5s", "slo-tuner-cpu", 1.5, {**CLOSED, "tasks": chat(32, 64, 64)}, 10),
    Scenario("cpu tiny 0.4s", "slo-tuner-cpu", 0.4, {**CLOSED, "tasks": chat(32, 64, 64)}, 11),
    Scenario("cpu tiny, accept", "slo-tuner-cpu", 1.0, {**CLOSED, "tasks": chat(32, 64, 64, 0.9)}, 12),
]


def perturb(calibration: Calibration, rng: np.random.Generator) -> tuple[Calibration, float]:
    """The truth's calibration, and the acceptance shift it applies (to task-set acceptances too)."""

    def factor() -> float:
        return float(np.clip(np.exp(rng.normal(0.0, COEFF_SIGMA)), *COEFF_RANGE))

    fields = ("base_s", "per_token_s", "per_ctx_token_s", "per_spec_step_s", "per_seq_s")
    terms = [term.model_copy(update={f: getattr(term, f) * factor() for f in fields}) for term in calibration.terms]
    shift = float(rng.normal(0.0, ACCEPT_SHIFT_SD))
    update: dict[str, Any] = {
        "terms": terms,
        "name": f"{calibration.name} (perturbed)",
        "default_acceptance": shifted(calibration.default_acceptance, shift),
        "noise_cv": float(np.clip(calibration.noise_cv * factor(), 0.01, 0.9)),
    }
    return calibration.model_copy(update=update), shift


def shifted(acceptance: float, shift: float) -> float:
    return float(np.clip(acceptance + shift, 0.001, 0.95))


def build(scenario: Scenario) -> tuple[Profile, Profile, Calibration, Calibration]:
    """(truth profile, guide profile, truth calibration, guide calibration)."""
    base = load_profile(scenario.calibration)
    guide_cal = load_calibration(base)
    truth_cal, shift = perturb(guide_cal, np.random.default_rng(7919 * scenario.seed))
    closed = scenario.workload["arrival"]["kind"] == "closed"
    knobs: dict[str, Any] = {"max_num_seqs": 8, "spec_on": True, "spec_width": 8}
    if scenario.name.startswith("quickstart"):
        knobs = base.knobs.model_dump(include={"max_num_seqs", "spec_on", "spec_width"})
    if closed:
        knobs["concurrency"] = 8

    def profile(tasks: list[dict[str, Any]], seed: int) -> Profile:
        return Profile.model_validate(
            {
                "name": f"bench-{scenario.name}",
                "seed": seed,
                "workload": {"requests": 400, **scenario.workload, "tasks": tasks},
                "slo": {"e2e_s": scenario.slo_s},
                "knobs": knobs,
                "tuner": TUNER,
            }
        )

    truth_tasks = [
        {**t, "acceptance": shifted(t["acceptance"], shift)} if "acceptance" in t else t
        for t in scenario.workload["tasks"]
    ]
    guide = profile(scenario.workload["tasks"], scenario.seed)
    truth = profile(truth_tasks, scenario.seed + TRUTH_SEED_OFFSET)
    return truth, guide, truth_cal, guide_cal


class CachedRunner:
    """A simulator runner that remembers every measurement by (configuration, fraction, seed). Same
    configuration and seed give the same segment anyway (common random numbers), so the grid's segments
    serve the searches without running again; each search still counts every segment it asks for."""

    variant = "sim"

    def __init__(self, profile: Profile, calibration: Calibration) -> None:
        self.inner = SimSegmentRunner(profile, calibration, profile.tuner)
        self.description = self.inner.description
        self.cache: dict[tuple[Any, ...], Measurement] = {}

    async def measure(self, point: Point, *, seed: int, fraction: float = 1.0) -> Measurement:
        key = (point.config_key, fraction, seed)
        if key not in self.cache:
            self.cache[key] = await self.inner.measure(point, seed=seed, fraction=fraction)
        return self.cache[key]

    async def close(self) -> None:
        return None


class AskedEvaluator(Evaluator):
    """Counts the distinct configurations a search asked the guide about, and their simulator wall time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: dict[tuple[tuple[int, int, int], float], float] = {}

    async def evaluate(self, point: Point, *, phase: str, step: int, fraction: float = 1.0, force: bool = False):
        segment = await super().evaluate(point, phase=phase, step=step, fraction=fraction, force=force)
        self.asked[(point.config_key, fraction)] = segment.wall_s
        return segment


def evaluator(profile: Profile, runner: CachedRunner, budget: int | None = None, cls: type = Evaluator) -> Evaluator:
    return cls(runner, profile.tuner, profile.slo.e2e_s or 0.0, seed=profile.seed, budget=budget)


async def _grid(profile: Profile, runner: CachedRunner) -> dict[tuple[int, int, int], tuple[float, float]]:
    """(score, p99) of every reachable configuration."""
    space, start = knob_space(profile, profile.tuner)
    world = evaluator(profile, runner)
    cells = {}
    for point in space.distinct_configs(start):
        seg = await world.evaluate(point, phase="grid", step=0)
        cells[point.config_key] = (seg.score, seg.p99_s)
    return cells


async def _search(
    algorithm: str, truth: Profile, guide_profile: Profile, truth_run: CachedRunner, guide_run: CachedRunner
):
    space, start = knob_space(truth, truth.tuner)
    target = evaluator(truth, truth_run, None if algorithm == "hillclimb" else BUDGET - 1)
    guide = evaluator(guide_profile, guide_run, cls=AskedEvaluator)
    if algorithm == "hillclimb":
        result = await hill_climb(target, space, start, steps=truth.tuner.steps)
    elif algorithm == "halving":
        result = await successive_halving(target, space, start)
    elif algorithm == "simrank":
        result = await simrank_climb(target, guide, space, start)
    else:
        result = await guided_search(target, guide, space, start)
    assert result.best is not None
    sim_wall = sum(guide.asked.values())
    return result.best.point.config_key, target.used + 1, len(guide.asked), sim_wall  # + the final re-measurement


async def run_scenario(index: int, cache_dir: str | None) -> dict[str, Any]:
    """One scenario's row (an executor task: its index in, the row out)."""
    scenario = SCENARIOS[index]
    truth, guide_profile, truth_cal, guide_cal = build(scenario)
    truth_run, guide_run = CachedRunner(truth, truth_cal), CachedRunner(guide_profile, guide_cal)
    cache = Path(cache_dir) / f"scenario-{index}.pickle" if cache_dir else None
    if cache is not None and cache.exists():
        truth_run.cache, guide_run.cache = pickle.loads(cache.read_bytes())
    started = time.perf_counter()
    grid = await _grid(truth, truth_run)
    guide_grid = await _grid(guide_profile, guide_run)
    misses = [
        abs(guide_grid[key][1] / grid[key][1] - 1)
        for key in grid
        if math.isfinite(grid[key][1]) and math.isfinite(guide_grid[key][1]) and grid[key][1] > 0
    ]
    best_key = max(grid, key=lambda k: grid[k][0])
    optimum = grid[best_key][0]
    _, start = knob_space(truth, truth.tuner)
    slo = scenario.slo_s
    row: dict[str, Any] = {
        "scenario": scenario.name,
        "grid_segments": len(grid),
        "optimum": optimum,
        "optimum_knobs": best_key,
        "optimum_meets_slo": grid[best_key][1] <= slo,
        "baseline_share": grid[start.config_key][0] / optimum if optimum > 0 else math.nan,
        "miss_median": statistics.median(misses),
        "miss_max": max(misses),
        "guide_optimum": max(guide_grid, key=lambda k: guide_grid[k][0]),
    }
    for algorithm in ALGORITHMS:
        key, used, sim_evals, sim_wall = await _search(algorithm, truth, guide_profile, truth_run, guide_run)
        share = grid[key][0] / optimum if optimum > 0 else math.nan
        row[algorithm] = {
            "share": share,
            "meets": grid[key][1] <= slo,
            "used": used,
            "sim": sim_evals,
            "sim_wall": sim_wall,
            "knobs": key,
        }
    row["wall_s"] = time.perf_counter() - started
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(pickle.dumps((truth_run.cache, guide_run.cache)))
    return row


def knobs_text(key: tuple[int, int, int]) -> str:
    c, s, w = key
    return f"{c or 'inf'}/{s}/{w}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", type=int, default=len(SCENARIOS))
    add_executor_arguments(parser)
    parser.add_argument(
        "--cache",
        type=Path,
        help="keep every simulator segment here and reuse it on the next run (the worlds are deterministic: "
        "a re-run with changed searches re-scores them without re-simulating the grids)",
    )
    args = parser.parse_args()
    cache_dir = None if args.cache is None else str(args.cache)
    indices = list(range(min(args.scenarios, len(SCENARIOS))))
    started = time.perf_counter()
    spec = executor_spec(args)
    rows = run_tasks(spec, [(SCENARIOS[i].name, run_scenario, (i, cache_dir)) for i in indices])
    print(
        "| scenario | guide p99 miss, median / max | grid optimum (score, c/s/w) | baseline |"
        + "".join(f" {a} |" for a in ALGORITHMS)
    )
    print("|" + "---|" * (4 + len(ALGORITHMS)))
    for row in rows:
        cells = [
            f" {row['scenario']} ",
            f" {row['miss_median']:.0%} / {row['miss_max']:.0%} ",
            f" {row['optimum']:.2f} ({knobs_text(row['optimum_knobs'])}) ",
            f" {row['baseline_share']:.2f} ",
        ]
        for algorithm in ALGORITHMS:
            r = row[algorithm]
            flag = "" if r["meets"] else " SLO missed"
            cells.append(f" {r['share']:.3f} ({r['used']}; {r['sim']} sim){flag} ")
        print("|" + "|".join(cells) + "|")
    summary = [" **median** ", " ", f" grid: {rows[0]['grid_segments']}+ truth segments each ", " "]
    for algorithm in ALGORITHMS:
        shares = [row[algorithm]["share"] for row in rows if math.isfinite(row[algorithm]["share"])]
        used = [row[algorithm]["used"] for row in rows]
        met = sum(row[algorithm]["meets"] for row in rows)
        goal = sum(share >= GOAL_SHARE for share in shares)
        sim = [row[algorithm]["sim"] for row in rows]
        sim_wall = [row[algorithm]["sim_wall"] for row in rows]
        summary.append(
            f" **{statistics.median(shares):.3f}** (segments {statistics.median(used):.0f}, max {max(used)}; "
            f"SLO met {met}/{len(rows)}; >= {GOAL_SHARE:.0%} in {goal}/{len(shares)}; "
            f"sim {statistics.median(sim):.0f} evals, {statistics.median(sim_wall):.1f} s) "
        )
    print("|" + "|".join(summary) + "|")
    print(f"\n{len(rows)} scenarios in {time.perf_counter() - started:.0f} s wall ({describe(spec)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
