"""SLO-Tuner searches against an exhaustive grid, over seeded simulator scenarios (issue 4, done-means (c)).

Each scenario is a "true" world (a calibration, possibly perturbed away from the shipped one, a workload and
an SLO) and a guide (the shipped, unperturbed calibration: what a user's simulator would believe). The grid
measures every distinct configuration the neighbour rule can reach from the start (8 x 9 x 5 = 360 with
the paper's bounds) in the true world. Each search then runs in the true world, and its answer is scored by
the grid's own measurement of that configuration (common random numbers: a configuration measured twice
gives the same segment), so "share of grid optimum" = S(answer) / S(grid optimum) is exact, not a noisy
re-measurement.

Searches:
  hillclimb  the paper's Algorithm 1 (T = 8 steps); its segment count is the budget for the others
  halving    successive halving over a coarse candidate set, then a local climb
  simrank    hill-climb over simulator-ranked (guide) neighbours, diagonals included
  guided     search on the guide simulator (simrank), then measure only the baseline and its top 3
  guided+refine  guided, then a simrank climb in the true world from the best verified point (same budget)

    python benchmarks/tuner_vs_grid.py [--scenarios N] [--jobs J]

Segments are shortened (tuner.sim_min_requests 400 / 30 s) so that 12 grids of 360 run in minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.profile import Calibration, Profile, load_calibration, load_profile
from core.tune.evaluator import Evaluator
from core.tune.guided import verify_live
from core.tune.hillclimb import hill_climb
from core.tune.knobspace import KnobSpace
from core.tune.search import simrank_climb, successive_halving
from core.tune.segment import SimSegmentRunner

ALGORITHMS = ("hillclimb", "halving", "simrank", "guided", "guided+refine")
TUNER = {"sim_min_requests": 400, "sim_min_duration_s": 30.0}


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    calibration: str  # a profile (name or path) whose calibration is the guide
    slo_s: float
    workload: dict[str, Any]
    seed: int
    # Truth = guide with these multipliers: step-time scale, draft-step scale, acceptance (None: as guide).
    step_scale: float = 1.0
    spec_scale: float = 1.0
    acceptance: float | None = None


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
SCENARIOS = [
    Scenario("paper 1.2s", "slo-tuner-paper", 1.2, {**CLOSED, "tasks": chat(320, 56, 64)}, 1),
    Scenario("paper 0.8s", "slo-tuner-paper", 0.8, {**CLOSED, "tasks": chat(320, 56, 64)}, 2),
    Scenario("long out 2.0s", "slo-tuner-paper", 2.0, {**CLOSED, "tasks": chat(320, 128, 256)}, 3),
    Scenario("high accept", "slo-tuner-paper", 1.2, {**CLOSED, "tasks": chat(320, 56, 64, 0.85)}, 4),
    Scenario("paper, sim off", "slo-tuner-paper", 1.2, {**CLOSED, "tasks": chat(320, 56, 64)}, 5, 1.4, 1.8),
    Scenario("long prompt 1.0s", "slo-tuner-paper", 1.0, {**CLOSED, "tasks": chat(1200, 56, 64)}, 6, 0.8),
    Scenario(
        "bursty open 1.5s",
        "slo-tuner-paper",
        1.5,
        {"arrival": {"kind": "onoff", "rate_rps": 40, "on_s": 2, "off_s": 2}, "tasks": chat(320, 56, 64)},
        7,
    ),
    Scenario("7b closed 3s", "adaserve-mix", 3.0, {**CLOSED, "tasks": chat(512, 128, 256)}, 8),
    Scenario(
        "7b poisson 4s",
        "adaserve-mix",
        4.0,
        {"arrival": {"kind": "poisson", "rate_rps": 5}, "tasks": chat(512, 128, 256)},
        9,
        1.2,
        1.0,
        0.7,
    ),
    Scenario("cpu tiny 1.5s", "slo-tuner-cpu", 1.5, {**CLOSED, "tasks": chat(32, 64, 64)}, 10),
    Scenario("cpu tiny 0.4s", "slo-tuner-cpu", 0.4, {**CLOSED, "tasks": chat(32, 64, 64)}, 11, 1.3, 0.7),
    Scenario("cpu tiny, accept", "slo-tuner-cpu", 1.0, {**CLOSED, "tasks": chat(32, 64, 64, 0.9)}, 12),
    # Tight SLOs: the optimum moves inside the space (fewer clients or batch slots).
    Scenario("paper 0.5s", "slo-tuner-paper", 0.5, {**CLOSED, "tasks": chat(320, 56, 64)}, 13),
    Scenario("7b closed 3s, sim off", "adaserve-mix", 3.0, {**CLOSED, "tasks": chat(512, 128, 256)}, 14, 1.25, 1.5),
]


def perturb(calibration: Calibration, scenario: Scenario) -> Calibration:
    terms = [
        term.model_copy(
            update={
                "base_s": term.base_s * scenario.step_scale,
                "per_seq_s": term.per_seq_s * scenario.step_scale,
                "per_spec_step_s": term.per_spec_step_s * scenario.spec_scale,
            }
        )
        for term in calibration.terms
    ]
    update: dict[str, Any] = {"terms": terms, "name": f"{calibration.name} (perturbed)"}
    if scenario.acceptance is not None:
        update["default_acceptance"] = scenario.acceptance
    return calibration.model_copy(update=update)


def build(scenario: Scenario) -> tuple[Profile, Calibration, Calibration]:
    base = load_profile(scenario.calibration)
    guide = load_calibration(base)
    truth = perturb(guide, scenario)
    profile = Profile.model_validate(
        {
            "name": f"bench-{scenario.name}",
            "seed": scenario.seed,
            "workload": {"requests": 400, **scenario.workload},
            "slo": {"e2e_s": scenario.slo_s},
            "knobs": {"concurrency": 8, "max_num_seqs": 8, "spec_on": True, "spec_width": 8},
            "engine": {"calibration": truth.model_dump()},
            "tuner": TUNER,
        }
    )
    return profile, truth, guide


async def _grid(profile: Profile, truth: Calibration) -> dict[tuple[int, int, int], float]:
    spec = profile.tuner
    space = KnobSpace(spec)
    start = space.start_point(profile.knobs, 8)
    evaluator = Evaluator(SimSegmentRunner(profile, truth, spec), spec, profile.slo.e2e_s or 0, seed=profile.seed)
    scores = {}
    for point in space.distinct_configs(start):
        scores[point.config_key] = (await evaluator.evaluate(point, phase="grid", step=0)).score
    return scores


async def _search(algorithm: str, profile: Profile, truth: Calibration, guide_cal: Calibration, budget: int | None):
    spec = profile.tuner
    slo_s = profile.slo.e2e_s or 0.0
    space = KnobSpace(spec)
    start = space.start_point(profile.knobs, 8)
    target = Evaluator(
        SimSegmentRunner(profile, truth, spec),
        spec,
        slo_s,
        seed=profile.seed,
        budget=None if budget is None else budget - 1,  # the final re-measurement is in the budget
    )
    guide = Evaluator(SimSegmentRunner(profile, guide_cal, spec), spec, slo_s, seed=profile.seed)
    if algorithm == "hillclimb":
        result = await hill_climb(target, space, start, steps=spec.steps)
    elif algorithm == "halving":
        result = await successive_halving(target, space, start)
    elif algorithm == "simrank":
        result = await simrank_climb(target, guide, space, start)
    else:
        sim = await simrank_climb(guide, guide, space, start)
        result = await verify_live(target, start, sim, verify=spec.guided_verify)
        if algorithm == "guided+refine" and result.best is not None:
            # As `tuner.guided_refine`: climb on from the best verified point while the budget lasts.
            refined = await simrank_climb(target, guide, space, result.best.point, first_step=len(result.steps))
            result.best = refined.best
    return result.best.point, target.used + 1  # + the final re-measurement of the best


def run_scenario(index: int) -> dict[str, Any]:
    scenario = SCENARIOS[index]
    profile, truth, guide = build(scenario)
    started = time.perf_counter()
    grid = asyncio.run(_grid(profile, truth))
    best_key = max(grid, key=lambda k: grid[k])
    optimum = grid[best_key]
    start = KnobSpace(profile.tuner).start_point(profile.knobs, 8)
    row: dict[str, Any] = {
        "scenario": scenario.name,
        "grid_segments": len(grid),
        "optimum": optimum,
        "optimum_knobs": best_key,
        "baseline_share": grid[start.config_key] / optimum if optimum > 0 else math.nan,
    }
    budget = None
    for algorithm in ALGORITHMS:
        point, used = asyncio.run(_search(algorithm, profile, truth, guide, budget))
        if algorithm == "hillclimb":
            budget = used  # the paper's cost is the budget every other search gets
        row[algorithm] = (grid[point.config_key] / optimum if optimum > 0 else math.nan, used, point)
    row["wall_s"] = time.perf_counter() - started
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", type=int, default=len(SCENARIOS))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    indices = list(range(min(args.scenarios, len(SCENARIOS))))
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(run_scenario, indices))
    header = "| scenario | grid optimum (score, knobs c/s/w) | baseline |" + "".join(
        f" {a} share (segments) |" for a in ALGORITHMS
    )
    print(header)
    print("|" + "---|" * (3 + len(ALGORITHMS)))
    for row in rows:
        c, s, w = row["optimum_knobs"]
        cells = [f" {row['scenario']} ", f" {row['optimum']:.2f} ({c}/{s}/{w}) ", f" {row['baseline_share']:.2f} "]
        for algorithm in ALGORITHMS:
            share, used, _ = row[algorithm]
            cells.append(f" {share:.3f} ({used}) ")
        print("|" + "|".join(cells) + "|")
    mean_cells = [" **mean** ", f" grid: {rows[0]['grid_segments']} segments each ", " "]
    for algorithm in ALGORITHMS:
        # A scenario where no configuration scores above 0 has no share to speak of (nan): left out.
        shares = [row[algorithm][0] for row in rows if math.isfinite(row[algorithm][0])]
        used = [row[algorithm][1] for row in rows]
        reached = sum(share >= 0.999 for share in shares)
        mean_cells.append(
            f" **{sum(shares) / len(shares):.3f}** ({sum(used) / len(used):.1f}; optimum in {reached}/{len(shares)}) "
        )
    print("|" + "|".join(mean_cells) + "|")
    print(f"\n{len(rows)} scenarios in {time.perf_counter() - started:.0f} s wall ({args.jobs} processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
