"""Simulator speed: simulated requests and tokens per wall-second (and per CPU-second) on bench-chat.

    python benchmarks/sim_speed.py [--requests 10000 100000]
    python benchmarks/sim_speed.py --whole-process [--requests 100000] [--modes fcfs slos-serve adaserve]
        [--jobs tune capacity]

The workload is the shape of the conversation trace Vidur ships (Poisson arrivals, lognormal lengths with
means of 1,150 prompt and 211 output tokens) on Llama-2-7B / A100-80GB, at a rate that keeps about 25
requests in the batch. It times the inner path of `slo-console --batch --profile bench-chat --requests N`
(workload generation, fcfs simulation, metrics summary) inside one process: compare it with other
simulators' inner loops only.

--whole-process times the CLI as a user types it, `slo-console --batch --profile bench-chat --mode M
--requests N` (interpreter start, imports, the JSON event stream to /dev/null, the summary): one warm-up run,
then --repeat runs per mode; it prints the median wall time, the median CPU time (user + system, its worker
processes' included) and the largest peak RSS (of the process or any one worker). `--jobs` times quickstart's
`--job tune` and `--job capacity` the same way (issue 22's other two targets; the tune's journal goes to a
temporary --out). When Vidur is installed beside it (`import vidur` works) it times `python -m vidur.main` on
the same workload shape too and prints slo-console's speed-up over it.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
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


# Vidur's CLI (`python -m vidur.main -h`) on bench-chat's shape: Llama-2-7B on one A100, vLLM's scheduler with
# the same batch caps, Poisson arrivals at bench-chat's rate. Vidur draws lengths from its own trace.
VIDUR_ARGS = [
    "--replica_config_device", "a100",
    "--replica_config_model_name", "meta-llama/Llama-2-7b-hf",
    "--cluster_config_num_replicas", "1",
    "--request_generator_config_type", "synthetic",
    "--interval_generator_config_type", "poisson",
    "--poisson_request_interval_generator_config_qps", "4.0",
    "--replica_scheduler_config_type", "vllm",
    "--vllm_scheduler_config_batch_size_cap", "128",
    "--vllm_scheduler_config_max_tokens_in_batch", "2048",
]  # fmt: skip


def time_process(command: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS in MiB of one run of `command`."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited with {child.returncode}")
    # ru_maxrss is in KiB on Linux.
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def measure_process(command: list[str], repeat: int) -> dict[str, float]:
    time_process(command)  # warm-up: file caches, .pyc files
    runs = [time_process(command) for _ in range(repeat)]
    return {
        "wall_s": statistics.median(r[0] for r in runs),
        "wall_min_s": min(r[0] for r in runs),
        "wall_max_s": max(r[0] for r in runs),
        "cpu_s": statistics.median(r[1] for r in runs),
        "peak_mib": max(r[2] for r in runs),
    }


def whole_process(requests: list[int], modes: list[str], repeat: int, jobs: list[str]) -> None:
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'mode':>10} {'requests':>9} {'wall s':>7} {'(min-max)':>13} {'cpu s':>7} {'peak MiB':>9}")
    for job in jobs:
        with tempfile.TemporaryDirectory() as out:
            command = [sys.executable, "-m", "console", "--batch", "--profile", "quickstart", "--job", job]
            m = measure_process([*command, "--out", out], repeat)
        spread = f"({m['wall_min_s']:.2f}-{m['wall_max_s']:.2f})"
        print(f"{job:>10} {'quickstart':>9} {m['wall_s']:>7.2f} {spread:>13} {m['cpu_s']:>7.2f} {m['peak_mib']:>9.0f}")
    vidur = importlib.util.find_spec("vidur") is not None
    for n in requests:
        fcfs_wall = None
        for mode in modes:
            command = [sys.executable, "-m", "console", "--batch", "--profile", "bench-chat", "--mode", mode]
            m = measure_process([*command, "--requests", str(n)], repeat)
            fcfs_wall = m["wall_s"] if mode == "fcfs" else fcfs_wall
            spread = f"({m['wall_min_s']:.2f}-{m['wall_max_s']:.2f})"
            print(f"{mode:>10} {n:>9,d} {m['wall_s']:>7.2f} {spread:>13} {m['cpu_s']:>7.2f} {m['peak_mib']:>9.0f}")
        if vidur:
            command = [sys.executable, "-m", "vidur.main", *VIDUR_ARGS]
            v = measure_process([*command, "--synthetic_request_generator_config_num_requests", str(n)], 1)
            ratio = f"  slo-console fcfs is {v['wall_s'] / fcfs_wall:.1f}x faster" if fcfs_wall else ""
            print(
                f"{'vidur':>10} {n:>9,d} {v['wall_s']:>7.2f} {'':>13} {v['cpu_s']:>7.2f} {v['peak_mib']:>9.0f}{ratio}"
            )
    if not vidur:
        print("(Vidur is not installed beside slo-console: `pip install vidur` to time it on the same shape)")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, nargs="+", default=None)
    parser.add_argument("--whole-process", action="store_true", help="time the CLI as whole processes")
    parser.add_argument("--modes", nargs="+", default=["fcfs", "slos-serve", "adaserve"])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per mode after one warm-up")
    parser.add_argument("--jobs", nargs="*", default=[], choices=["tune", "capacity"], help="quickstart jobs to time")
    args = parser.parse_args()
    if args.whole_process:
        whole_process(args.requests or [100_000], args.modes, args.repeat, args.jobs)
        return
    args.requests = args.requests or [10_000, 100_000]
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
