"""SLOs-Serve across replicas (paper 004 sec. 6.2): capacity per replica with 1 and N simulated replicas.

    python benchmarks/slos_serve_scaling.py [--profiles slos-serve-coder slos-serve-toolllm] [--replicas 4]
                                            [--modes fcfs slos-serve] [--requests 1000]

For each profile and mode it bisects the capacity (core/capacity.py: highest rate at >= 90% attainment) with
one replica and with N replicas behind the controller on one virtual clock, the workload N times as long
(so each replica serves about as many requests as alone), and prints capacity, capacity per replica and the
scaling factor (capacity with N / capacity with 1; the paper reports up to 6.2x with 4 replicas, Coder).
The default profiles have bursty arrivals (gamma, burstiness 0.25), as the paper's Coder and ToolLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from core.capacity import find_capacity
from core.profile import load_profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=["slos-serve-coder", "slos-serve-toolllm"])
    parser.add_argument("--modes", nargs="+", default=["fcfs", "slos-serve"])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--requests", type=int, default=None, help="per replica (default: the profile's)")
    args = parser.parse_args()
    print(
        f"{'profile':22s} {'mode':12s} {'1 replica r/s':>14s} {f'{args.replicas} replicas r/s':>15s} "
        f"{'per replica':>12s} {'scaling':>8s}"
    )
    for name in args.profiles:
        profile = load_profile(name)
        per_replica = args.requests or profile.workload.requests
        for mode in args.modes:
            start = time.perf_counter()
            one = asyncio.run(find_capacity(profile.model_copy(update={"replicas": 1}), mode, requests=per_replica))
            many_profile = profile.model_copy(update={"replicas": args.replicas})
            many = asyncio.run(find_capacity(many_profile, mode, requests=per_replica * args.replicas))
            scaling = many.capacity_rps / one.capacity_rps if one.capacity_rps > 0 else float("nan")
            print(
                f"{name:22s} {mode:12s} {one.capacity_rps:14.3f} {many.capacity_rps:15.3f} "
                f"{many.per_replica_rps:12.3f} {scaling:7.2f}x   ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
