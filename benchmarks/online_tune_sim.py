"""The online tuner on the simulator against a grid of static caps (issue 23 item 4; docs/gateway.md).

saber-w1's mix at 3 req/s, the gateway's queue bounded at 16, the cap over 4..64 in steps of 8 starting at
8; each seed's load is served once behind the online tuner and once per static cap of the grid, and
goodput is taken over the last half and the last quarter of the run (the "final windows"). Settings of the tuner are its
defaults, except `--z` to compare the noise threshold. `--modes` lets it switch modes too (it starts in fcfs); the
yardstick stays the best static fcfs cap.

    python benchmarks/online_tune_sim.py --seeds 0 1 2 --z 1 2
    python benchmarks/online_tune_sim.py --seeds 0 1 2 --modes fcfs saber slos-serve
"""

from __future__ import annotations

import argparse
import time

from core.profile import Profile, load_calibration, load_profile
from core.tune.online import OnlineSettings
from core.tune.online_sim import goodput_between, run_online, run_static

RATE_RPS, QUEUE, START_CAP, DURATION_S = 3.0, 16, 8, 20000.0
FINAL_SHARES = (0.5, 0.25)  # goodput over the last half and the last quarter of the run


def benchmark_profile() -> Profile:
    """saber-w1 at RATE_RPS, its cap over 4..64 in steps of 8."""
    base = load_profile("saber-w1")
    workload = base.workload.model_copy(
        update={"arrival": base.workload.arrival.model_copy(update={"rate_rps": RATE_RPS})}
    )
    tuner = base.tuner.model_copy(update={"concurrency_bounds": (4, 64), "concurrency_step": 8})
    return base.model_copy(update={"workload": workload, "tuner": tuner})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--z", type=float, nargs="+", default=[OnlineSettings().z])
    parser.add_argument("--grid-step", type=int, default=8, help="static caps 8, 8 + step, ... 64")
    parser.add_argument("--modes", nargs="+", default=None, help="modes the online tuner may switch among")
    args = parser.parse_args()
    profile = benchmark_profile()
    calibration = load_calibration(profile)
    spans = [(DURATION_S * (1 - share), DURATION_S) for share in FINAL_SHARES]
    print("seed  share  best static (cap: goodput)  z  online goodput  ratio  final cap  windows  steps  cpu_s  final")
    for seed in args.seeds:
        records = {
            cap: run_static(profile, calibration, cap, duration_s=DURATION_S, seed=seed, max_queue=QUEUE)
            for cap in range(8, 65, args.grid_step)
        }
        static = [{cap: goodput_between(profile, r, *span).goodput_rps for cap, r in records.items()} for span in spans]
        for z in args.z:
            cpu = time.process_time()
            run = run_online(
                profile, calibration, START_CAP, duration_s=DURATION_S, seed=seed, max_queue=QUEUE,
                settings=OnlineSettings(z=z), modes=tuple(args.modes) if args.modes else None,
            )  # fmt: skip
            cpu = time.process_time() - cpu
            for share, span, grid in zip(FINAL_SHARES, spans, static, strict=True):
                best_cap = max(grid, key=lambda c: grid[c])
                online = goodput_between(profile, run.records, *span).goodput_rps
                print(
                    f"{seed:4d}  {share:5.2f}  {best_cap:3d}: {grid[best_cap]:.3f}{'':14s} {z:3.1f}  "
                    f"{online:.3f}{'':9s}"
                    f"{online / grid[best_cap]:.3f}  {run.tuner.incumbent.concurrency:9d}"
                    f"  {len(run.tuner.windows):7d}  {len(run.tuner.steps):5d}  {cpu:5.1f}"
                    f"  {run.tuner.incumbent.key()}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
