"""A batch job with --workers 1 against --workers N, interleaved (issue 24), and the local pool's start-up cost.

    python benchmarks/scale_out.py [--profile saber-w1] [--job compare] [--workers 1,2] [--rounds 5]
    python benchmarks/scale_out.py --startup [--rounds 5]

Jobs: each round runs `slo-console --batch --profile P --job J --workers W` once per W, the order alternating
between rounds (a machine that gets busier or quieter during the run favours neither), and reports per run:
wall time of the whole command, the job's own wall (`compare_wall_s`, without Python's start-up and imports),
CPU time of the command and its workers (user + sys), the 1-minute load average when it started (on a
shared machine other work takes the cores; CPU time is the figure it does not change much), and for pool
runs the CPU seconds of its tasks (`task_done` events): their sum and the largest one. It checks that
every run printed the same summary apart from wall-clock fields. Start-up: the time from creating a 2-process
pool until two tasks that import the compare job have run, per start method (core/executor.py
`pool_context`), in a parent that has imported it already (as the batch CLI has).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def without_wall(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_wall(v) for k, v in value.items() if not k.endswith("wall_s")}
    if isinstance(value, list):
        return [without_wall(v) for v in value]
    return value


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_job(profile: str, job: str, workers: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "console", "--batch", "--profile", profile, "--job", job]
    load = os.getloadavg()[0]
    cpu, start = children_cpu_s(), time.perf_counter()
    proc = subprocess.run([*command, "--workers", str(workers)], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stderr}")
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    summary = events[-1]
    tasks = [e["cpu_s"] for e in events if e["event"] == "task_done"]
    return {
        "tasks_cpu_s": sum(tasks),
        "largest_task_cpu_s": max(tasks, default=0.0),
        "workers": workers,
        "wall_s": wall,
        "job_wall_s": summary.get(f"{job}_wall_s", float("nan")),
        "cpu_s": children_cpu_s() - cpu,
        "load": load,
        "summary": without_wall(summary),
    }


def jobs(args: argparse.Namespace) -> None:
    counts = [int(w) for w in args.workers.split(",")]
    runs: list[dict[str, Any]] = []
    print("round  workers  wall s  job wall s  CPU s  load (1 min)  tasks' CPU s: sum, largest (pool runs)")
    for round_index in range(args.rounds):
        for workers in counts if round_index % 2 == 0 else counts[::-1]:
            run = run_job(args.profile, args.job, workers)
            runs.append(run)
            print(
                f"{round_index:5d}  {workers:7d}  {run['wall_s']:6.2f}  {run['job_wall_s']:10.2f}  "
                f"{run['cpu_s']:5.2f}  {run['load']:12.2f}  {run['tasks_cpu_s']:.2f}, {run['largest_task_cpu_s']:.2f}",
                flush=True,
            )
    identical = all(run["summary"] == runs[0]["summary"] for run in runs)
    print(f"\nevery run printed the same summary (wall-clock fields aside): {'yes' if identical else 'NO'}")
    base = [r for r in runs if r["workers"] == counts[0]]
    for workers in counts:
        mine = [r for r in runs if r["workers"] == workers]
        walls = sorted(r["wall_s"] for r in mine)
        line = (
            f"workers {workers}: wall median {statistics.median(walls):.2f} s"
            f" (min {walls[0]:.2f}, max {walls[-1]:.2f}),"
            f" job wall median {statistics.median(r['job_wall_s'] for r in mine):.2f} s,"
            f" CPU median {statistics.median(r['cpu_s'] for r in mine):.2f} s"
        )
        if workers != counts[0]:
            ratios = sorted(b["wall_s"] / r["wall_s"] for b, r in zip(base, mine, strict=True))
            line += (
                f"; speed-up over {counts[0]}: median of medians "
                f"{statistics.median(r['wall_s'] for r in base) / statistics.median(walls):.2f}x, per round "
                f"{ratios[0]:.2f}-{ratios[-1]:.2f}x"
            )
        print(line)


def import_compare() -> int:
    import core.compare  # noqa: F401  (what a compare worker needs before its first task)

    return os.getpid()


def startup(args: argparse.Namespace) -> None:
    import core.compare  # noqa: F401  (the parent has imported the job, as the batch CLI has)

    print("start method  pool of 2 created to two tasks done, s: median (min-max)")
    for method in ("fork", "forkserver", "spawn"):
        times = []
        for _ in range(args.rounds):
            context = multiprocessing.get_context(method)
            if method == "forkserver":
                context.set_forkserver_preload(["core.compare"])
            start = time.perf_counter()
            with ProcessPoolExecutor(2, mp_context=context) as pool:
                futures = [pool.submit(import_compare) for _ in range(2)]
                [f.result() for f in futures]
                times.append(time.perf_counter() - start)
        times.sort()
        print(f"{method:12s}  {statistics.median(times):.3f} ({times[0]:.3f}-{times[-1]:.3f})", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="saber-w1")
    parser.add_argument("--job", default="compare", choices=["compare", "capacity", "tune"])
    parser.add_argument("--workers", default="1,2", help="comma-separated --workers values (the first is the base)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--startup", action="store_true", help="measure the pool's start-up per start method")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    startup(args) if args.startup else jobs(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
