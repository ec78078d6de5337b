"""Two live segments side by side on a local Ray against the same two one after another (issue 24 item 3).

    SLO_CONSOLE_VLLM_PYTHON=... python benchmarks/live_parallel.py [--profile slo-tuner-cpu] [--measure-s 30]

The two candidates are speculation 8 wide (the profile's useless draft) and speculation off, 4 clients,
8 sequences. Side by side: a local Ray with two `vllm_slot`s and SLO_CONSOLE_VLLM_CPU_SLOTS="0 1" (one core
per vLLM: two nodes in small), the two segments as Ray tasks (core/tune/live_parallel.py). One after
another: the serial tuner's runner (core/tune/segment.py LiveSegmentRunner), one vLLM restarted per segment,
bound as vLLM binds itself. Printed per segment: wall (start-up, warm-up and measurement), vLLM's start-up,
p99, completed requests; and each mode's wall for both. The 1-minute load average at the start says how busy
the machine was.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from core.backends.factory import make_backend
from core.executor import ExecutorSpec
from core.profile import load_profile
from core.tune.knobspace import Point
from core.tune.live_parallel import ENV_CPU_SLOTS, LIVE_SLOT_RESOURCE, RayLiveSegmentRunner
from core.tune.segment import LiveSegmentRunner, Measurement

CANDIDATES = (Point(4, 8, 8, True), Point(4, 8, 8, False))


def row(name: str, point: Point, measurement: Measurement) -> str:
    summary = measurement.summary
    notes = measurement.notes or {}
    p99 = "-" if summary is None else f"{summary.p99_s:.3f}"
    done = "-" if summary is None else str(summary.completed)
    startup = notes.get("startup_s")
    startup_text = "-" if startup is None else f"{startup:.1f}"
    error = f"  error: {measurement.error}" if measurement.error else ""
    slot = str(notes.get("cpu_slot", "-"))
    wall = f"{measurement.wall_s:.1f}"
    return f"{name:<13} {point.label():<16} {wall:>7} {startup_text:>9} {p99:>7} {done:>6} {slot:>5}{error}"


async def side_by_side(profile: Any, spec: Any) -> tuple[float, list[Measurement]]:
    import ray

    os.environ[ENV_CPU_SLOTS] = "0 1"
    ray.init(num_cpus=2, resources={LIVE_SLOT_RESOURCE: 2}, include_dashboard=False, log_to_driver=False)
    try:
        async with ExecutorSpec("ray").open(job="tune") as executor:
            runner = RayLiveSegmentRunner(profile, spec, executor)
            start = time.perf_counter()
            taken = await asyncio.gather(*(runner.measure(p, seed=profile.seed) for p in CANDIDATES))
            return time.perf_counter() - start, list(taken)
    finally:
        ray.shutdown()
        os.environ.pop(ENV_CPU_SLOTS, None)


async def one_after_another(profile: Any, spec: Any) -> tuple[float, list[Measurement]]:
    runner = LiveSegmentRunner(profile, make_backend("vllm", profile), spec)
    start = time.perf_counter()
    try:
        taken = [await runner.measure(p, seed=profile.seed) for p in CANDIDATES]
    finally:
        await runner.close()
    return time.perf_counter() - start, taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", default="slo-tuner-cpu")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--measure-s", type=float, default=30.0)
    args = parser.parse_args()
    profile = load_profile(args.profile)
    server = profile.server.model_copy(update={"startup_timeout_s": 900.0})
    profile = profile.model_copy(update={"server": server})
    spec = profile.tuner.model_copy(update={"warmup_s": args.warmup_s, "measure_s": args.measure_s})
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print(f"{'mode':<13} {'candidate':<16} {'wall s':>7} {'startup s':>9} {'p99 s':>7} {'done':>6} {'slot':>5}")
    for name, run in (("side by side", side_by_side), ("one by one", one_after_another)):
        wall, taken = asyncio.run(run(profile, spec))
        for point, measurement in zip(CANDIDATES, taken, strict=True):
            print(row(name, point, measurement))
        print(f"{name}: both segments in {wall:.1f} s (load average now {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
