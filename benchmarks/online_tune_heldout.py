"""The online tuner against the best static cap on many seeds, with the time it takes to converge (issue 23 item 4).

The same load as benchmarks/online_tune_sim.py (saber-w1's mix at 3 req/s, queue 16, the cap over 4..64 in steps
of 8 from 8, 20000 s). Each seed's static grid (8, 16, ..., 64) does not depend on the tuner, so it is run once
and kept in `--grid-cache` (a JSON file); then the online tuner runs once per seed with `--set` overrides of its
`OnlineSettings`. One JSON line per seed: last-half goodput against the best static cap, the final cap, and the
time to converge: when the incumbent first reached a cap whose static goodput is within 10% of the best, and when
it last entered that set (it never left it afterwards). The grid is read only to report those times; the tuner
never sees it.

    PYTHONPATH=. python benchmarks/online_tune_heldout.py --seeds 10 11 --grid-cache /tmp/grid.json \
        --set max_pairs=3 max_window_requests=3200
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from online_tune_sim import DURATION_S, QUEUE, START_CAP, benchmark_profile

from core.profile import load_calibration
from core.tune.online import OnlineSettings, OnlineTuner
from core.tune.online_sim import goodput_between, run_online, run_static

GRID = range(8, 65, 8)
WITHIN = 0.9  # the bar: within 10% of the best static cap's goodput


def _setting(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    return key, None if value == "None" else json.loads(value)


def incumbent_timeline(tuner: OnlineTuner, start_cap: int) -> list[tuple[float, int]]:
    """(time, incumbent cap) at the start and after every move: a step is decided when its comparison's last trial
    window closes, the window right after the incumbent window its event reports (`Segment.key` holds its index)."""
    timeline = [(0.0, start_cap)]
    for step in tuner.steps:
        if step.moved and step.best_neighbour is not None:
            trial_index = int(step.segment.key.split(":")[1]) + 1
            timeline.append((tuner.windows[trial_index].end_s, step.best_neighbour.concurrency))
    return timeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--grid-cache", type=Path, required=True)
    parser.add_argument("--caps", type=int, nargs="+", default=list(GRID), help="the static grid (default 8..64)")
    parser.add_argument("--set", nargs="*", default=[], type=_setting, help="OnlineSettings overrides, key=json")
    args = parser.parse_args()
    profile = benchmark_profile()
    calibration = load_calibration(profile)
    settings = OnlineSettings(**dict(args.set))
    half = (DURATION_S / 2, DURATION_S)
    for seed in args.seeds:
        cache = json.loads(args.grid_cache.read_text()) if args.grid_cache.exists() else {}
        if str(seed) not in cache:
            records = {cap: run_static(profile, calibration, cap, duration_s=DURATION_S, seed=seed, max_queue=QUEUE)
                       for cap in args.caps}  # fmt: skip
            grid = {cap: goodput_between(profile, r, *half).goodput_rps for cap, r in records.items()}
            cache = json.loads(args.grid_cache.read_text()) if args.grid_cache.exists() else {}
            cache[str(seed)] = grid
            args.grid_cache.write_text(json.dumps(cache, indent=1))
        grid = {int(cap): g for cap, g in cache[str(seed)].items()}
        best_cap = max(grid, key=lambda c: grid[c])
        good = {cap for cap, g in grid.items() if g >= WITHIN * grid[best_cap]}
        cpu = time.process_time()
        run = run_online(profile, calibration, START_CAP, duration_s=DURATION_S, seed=seed, max_queue=QUEUE,
                         settings=settings)  # fmt: skip
        cpu = time.process_time() - cpu
        online = goodput_between(profile, run.records, *half).goodput_rps
        timeline = incumbent_timeline(run.tuner, START_CAP)
        # a cap between grid points (4, 12, ...) counts as good when both grid neighbours are good
        in_good = [(t, cap in good or (cap - 4 in good and cap + 4 in good)) for t, cap in timeline]
        first = next((t for t, ok in in_good if ok), None)
        settled = (
            None
            if not in_good[-1][1]
            else next(t for i, (t, ok) in enumerate(in_good) if all(o for _, o in in_good[i:]))
        )
        print(json.dumps({
            "seed": seed, "settings": dict(args.set), "best_cap": best_cap, "best_goodput": round(grid[best_cap], 4),
            "online_goodput": round(online, 4), "ratio": round(online / grid[best_cap], 4),
            "final_cap": run.tuner.incumbent.concurrency, "first_good_s": first, "settled_good_s": settled,
            "windows": len(run.tuner.windows), "steps": len(run.tuner.steps), "moves": len(timeline) - 1,
            "final_window_requests": run.tuner.window_requests, "cpu_s": round(cpu, 1),
        }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
