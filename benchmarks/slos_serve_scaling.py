"""SLOs-Serve across replicas (paper 004 sec. 6.2): capacity per replica with 1 and N simulated replicas.

    python benchmarks/slos_serve_scaling.py [--profiles slos-serve-coder slos-serve-toolllm] [--replicas 4]
                                            [--modes fcfs slos-serve] [--requests 1000]
    python benchmarks/slos_serve_scaling.py --profiles six --replicas 1    # the six scenarios, one replica

For each profile and mode it bisects the capacity (core/capacity.py: highest rate at >= 90% attainment) with
one replica and, with --replicas N > 1, with N replicas behind the controller on one virtual clock, the
workload N times as long (so each replica serves about as many requests as alone; a trace replays at most
its own rows), and prints capacity, capacity per replica and the scaling factor (capacity with N / capacity
with 1; the paper reports up to 6.2x with 4 replicas, Coder). With fcfs and slos-serve among the modes it
ends with each profile's SLOs-Serve / fcfs capacity ratio and their geometric mean (the paper: 2.2x).
`six` stands for the six slos-serve-* scenarios of Tables 1-4. The default profiles have bursty arrivals
(gamma, burstiness 0.25), as the paper's Coder and ToolLLM; slos-serve-trace replays a bursty trace.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time

from core.capacity import find_capacity
from core.profile import load_profile

SIX = [f"slos-serve-{s}" for s in ("chatbot", "coder", "summarizer", "mixed", "toolllm", "reasoning")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["slos-serve-coder", "slos-serve-toolllm"])
    parser.add_argument("--modes", nargs="+", default=["fcfs", "slos-serve"])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--requests", type=int, default=None, help="per replica (default: the profile's)")
    args = parser.parse_args()
    names = [n for name in args.profiles for n in (SIX if name == "six" else [name])]
    counts = [1] if args.replicas == 1 else [1, args.replicas]
    many_header = (
        f" {f'{args.replicas} replicas r/s':>15s} {'per replica':>12s} {'scaling':>8s}" if len(counts) > 1 else ""
    )
    print(f"{'profile':22s} {'mode':12s} {'1 replica r/s':>14s}{many_header}")
    capacity: dict[tuple[str, str, int], float] = {}
    for name in names:
        profile = load_profile(name)
        per_replica = args.requests or profile.workload.requests
        for mode in args.modes:
            start = time.process_time()
            for n in counts:
                # One replica without --requests: the profile's own count (a trace replays whole).
                requests = None if n == 1 and args.requests is None else per_replica * n
                found = asyncio.run(find_capacity(profile.model_copy(update={"replicas": n}), mode, requests=requests))
                capacity[name, mode, n] = found.capacity_rps
            one, many = capacity[name, mode, 1], capacity[name, mode, counts[-1]]
            scaling = many / one if one > 0 else float("nan")
            many_text = f"{many:15.3f} {many / args.replicas:12.3f} {scaling:7.2f}x" if len(counts) > 1 else ""
            print(
                f"{name:22s} {mode:12s} {one:14.3f} {many_text}   ({time.process_time() - start:.0f} s CPU)",
                flush=True,
            )
    if {"fcfs", "slos-serve"} <= set(args.modes):
        for n in counts:
            ratios = {
                name: capacity[name, "slos-serve", n] / capacity[name, "fcfs", n]
                if capacity[name, "fcfs", n] > 0
                else math.nan
                for name in names
            }
            listed = ", ".join(f"{name.removeprefix('slos-serve-')} {r:.2f}x" for name, r in ratios.items())
            geomean = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
            print(f"slos-serve / fcfs, {n} replica(s): {listed}; geomean {geomean:.2f}x")


if __name__ == "__main__":
    main()
