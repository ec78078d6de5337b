"""Simulator speed: simulated requests and tokens per wall-second (and per CPU-second) on bench-chat.

    python benchmarks/sim_speed.py [--requests 10000 100000]

The workload is the shape of the conversation trace Vidur ships (Poisson arrivals, lognormal lengths with
means of 1,150 prompt and 211 output tokens) on Llama-2-7B / A100-80GB, at a rate that keeps about 25
requests in the batch. It times the inner path of `slo-console --batch --profile bench-chat --requests N`
(workload generation, fcfs simulation, metrics summary) inside one process: compare it with other
simulators' inner loops only. For a whole-process comparison (interpreter start, imports, output) time the
CLI itself; the README gives both.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from core.backends.sim import SimBackend
from core.metrics import summarize
from core.profile import load_calibration, load_profile
from core.workload import build_load_plan


def measure(requests: int) -> dict[str, float]:
    profile = load_profile("bench-chat")
    backend = SimBackend(load_calibration(profile), profile.knobs, seed=profile.seed)
    start = time.perf_counter()
    cpu_start = time.process_time()
    outcome = asyncio.run(backend.run(build_load_plan(profile, requests=requests)))
    simulated = time.perf_counter()
    summary = summarize(outcome.records, slo=profile.slo, smooth=profile.smooth_goodput)
    done = time.perf_counter()
    cpu_s = time.process_time() - cpu_start
    engine = backend.last_engine
    assert engine is not None
    tokens = summary.output_tokens + sum(r.prompt_tokens for r in outcome.records)
    wall = done - start
    return {
        "requests": len(outcome.records),
        "wall_s": wall,
        "simulate_s": simulated - start,
        "summarize_s": done - simulated,
        "requests_per_s": len(outcome.records) / wall,
        # CPU seconds of this process: the figure that holds on a machine busy with other work.
        "cpu_s": cpu_s,
        "requests_per_cpu_s": len(outcome.records) / cpu_s,
        "tokens_per_s": tokens / wall,
        "mean_batch": summary.output_tokens / max(engine.step, 1),
        "virtual_s": engine.clock,
        "p99_s": summary.p99_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args()
    print(
        f"{'requests':>9} {'wall s':>7} {'sim s':>7} {'metrics s':>9} {'req/s':>8} {'cpu s':>7} {'req/cpu-s':>9} "
        f"{'tokens/s':>10} {'batch':>6}"
    )
    for n in args.requests:
        m = measure(n)
        print(
            f"{m['requests']:>9,d} {m['wall_s']:>7.2f} {m['simulate_s']:>7.2f} {m['summarize_s']:>9.2f} "
            f"{m['requests_per_s']:>8,.0f} {m['cpu_s']:>7.2f} {m['requests_per_cpu_s']:>9,.0f} "
            f"{m['tokens_per_s']:>10,.0f} {m['mean_batch']:>6.1f}"
        )


if __name__ == "__main__":
    main()
