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
--requests N` (interpreter start, imports, the JSON event stream to /dev/null, the summary), as this Python
has it installed: each run starts in an empty directory, so that a checkout's sources in the working directory
cannot stand in for the install (a `pip install .` is mypyc-compiled; the first line printed says which build
ran, from `slo-console --version`; PYTHONPATH, if set, still wins, as for any run). One warm-up run,
then --repeat runs per mode; it prints the median wall time, the median CPU time (user + system, its worker
processes' included) and the largest peak RSS (of the process or any one worker). `--jobs` times quickstart's
`--job tune` and `--job capacity` the same way (issue 22's other two targets; the tune's journal goes to a
temporary --out). With `--vidur-python VENV/bin/python --vidur-data DIR` (or when `import vidur` works here) it
also times vidur 0.0.26 (`python -m vidur.main`, offline, at its leanest settings: benchmarks/vidur_offline.py)
on the same workload, alternating with the modes' runs (each mode once, then vidur, round after round), and
prints each mode's ratio of the medians, its range over the rounds, and both simulators' simulated work (fcfs's
engine steps against Vidur's batches, simulated seconds) so the reader can check the comparison is like for
like. Vidur's first
run (it trains its random forests on a cold cache) is a warm-up and is not timed.
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
from pathlib import Path

from vidur_offline import DEFAULT_CACHE, VidurRun, vidur_env

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
        "steps": engine.step,
        "virtual_s": engine.clock,
        "p99_s": summary.p99_s,
    }


# Where every timed process starts: an empty directory, never a checkout (see the module's docstring).
RUN_DIR = tempfile.mkdtemp(prefix="sim-speed-")


def time_process(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS in MiB of one run of `command`."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=RUN_DIR)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited with {child.returncode}")
    # ru_maxrss is in KiB on Linux.
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def summarize_runs(runs: list[tuple[float, float, float]]) -> dict[str, float]:
    return {
        "wall_s": statistics.median(r[0] for r in runs),
        "wall_min_s": min(r[0] for r in runs),
        "wall_max_s": max(r[0] for r in runs),
        "cpu_s": statistics.median(r[1] for r in runs),
        "cpu_min_s": min(r[1] for r in runs),
        "cpu_max_s": max(r[1] for r in runs),
        "peak_mib": max(r[2] for r in runs),
    }


def measure_process(command: list[str], repeat: int) -> dict[str, float]:
    time_process(command)  # warm-up: file caches, .pyc files
    return summarize_runs([time_process(command) for _ in range(repeat)])


def print_row(name: str, n: int | str, m: dict[str, float], extra: str = "") -> None:
    spread = f"({m['wall_min_s']:.2f}-{m['wall_max_s']:.2f})"
    count = f"{n:>9,d}" if isinstance(n, int) else f"{n:>9}"
    print(f"{name:>10} {count} {m['wall_s']:>7.2f} {spread:>15} {m['cpu_s']:>7.2f} {m['peak_mib']:>9.0f}{extra}")


def versus_vidur(n: int, modes: list[str], repeat: int, vidur: VidurRun) -> None:
    """Each mode and Vidur on the same workload size, alternating round by round (every mode once, then Vidur
    once) so that all see the same load; each mode's ratio is taken against the Vidur run of its own round."""
    commands = {mode: bench_chat_command(mode, n) for mode in modes}
    for command in commands.values():
        time_process(command)  # warm-up: file caches, .pyc files
    probe = vidur.probe(n)  # warm-up, untimed: trains Vidur's random forests on a cold cache; counts its batches
    runs: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in modes}
    vidur_runs, loads = [], []
    for _ in range(repeat):
        loads.append(os.getloadavg()[0])
        for mode, command in commands.items():
            runs[mode].append(time_process(command))
        command = vidur.command(n)  # outside the clock: writes Vidur's trace on first use
        vidur_runs.append(time_process(command, env=vidur_env()))  # `python -m vidur.main`, as a Vidur user types it
        vidur.clear_outputs()
    v = summarize_runs(vidur_runs)
    for mode in modes:
        print_row(mode, n, summarize_runs(runs[mode]), "  (interleaved with vidur)")
    print_row("vidur", n, v, "  (0.0.26, lean: native predictor, no chrome trace)")
    for mode in modes:
        s = summarize_runs(runs[mode])
        pair_walls = sorted(vr[0] / sr[0] for sr, vr in zip(runs[mode], vidur_runs, strict=True))
        pair_cpus = sorted(vr[1] / sr[1] for sr, vr in zip(runs[mode], vidur_runs, strict=True))
        print(
            f"{'':>10} vidur / slo-console {mode}, whole process vs whole process: wall "
            f"{v['wall_s'] / s['wall_s']:.1f}x (rounds {pair_walls[0]:.1f}-{pair_walls[-1]:.1f}x), CPU "
            f"{v['cpu_s'] / s['cpu_s']:.1f}x (rounds {pair_cpus[0]:.1f}-{pair_cpus[-1]:.1f}x)"
        )
    print(f"{'':>10} load average at each round: " + ", ".join(f"{x:.1f}" for x in loads))
    ours_inner = measure(n)  # fcfs in process, for its step count and simulated time
    print(
        f"{'':>10} simulated work: slo-console fcfs {ours_inner['steps']:,} engine steps, "
        f"{ours_inner['virtual_s']:,.0f} simulated s; vidur {probe['batches']:,} batches, "
        f"{probe['simulated_s']:,.0f} simulated s"
    )


def bench_chat_command(mode: str, n: int) -> list[str]:
    """`slo-console --batch --profile bench-chat --mode MODE --requests N` through this Python."""
    command = [sys.executable, "-m", "console", "--batch", "--profile", "bench-chat", "--mode", mode]
    return [*command, "--requests", str(n)]


def whole_process(requests: list[int], modes: list[str], repeat: int, jobs: list[str], vidur: VidurRun | None) -> None:
    build = subprocess.run(
        [sys.executable, "-m", "console", "--version"], cwd=RUN_DIR, capture_output=True, text=True, check=True
    )
    print(f"timing {build.stdout.strip()}, {sys.executable}")
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'mode':>10} {'requests':>9} {'wall s':>7} {'(min-max)':>15} {'cpu s':>7} {'peak MiB':>9}")
    for job in jobs:
        with tempfile.TemporaryDirectory() as out:
            command = [sys.executable, "-m", "console", "--batch", "--profile", "quickstart", "--job", job]
            print_row(job, "quickstart", measure_process([*command, "--out", out], repeat))
    for n in requests:
        if vidur is not None:
            versus_vidur(n, modes, repeat, vidur)
            continue
        for mode in modes:
            print_row(mode, n, measure_process(bench_chat_command(mode, n), repeat))
    if vidur is None:
        print(
            "(Vidur not timed: install vidur==0.0.26 in a venv of its own and pass --vidur-python VENV/bin/python "
            "--vidur-data DIR; see benchmarks/vidur_offline.py)"
        )
    print(f"load average after: {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, nargs="+", default=None)
    parser.add_argument("--whole-process", action="store_true", help="time the CLI as whole processes")
    parser.add_argument("--modes", nargs="+", default=["fcfs", "slos-serve", "adaserve"])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per mode after one warm-up")
    parser.add_argument("--jobs", nargs="*", default=[], choices=["tune", "capacity"], help="quickstart jobs to time")
    parser.add_argument("--vidur-python", help="a Python with vidur==0.0.26 installed (default: this one, if it has)")
    parser.add_argument("--vidur-data", type=Path, help="folder of Vidur's CSVs (see benchmarks/vidur_offline.py)")
    parser.add_argument("--vidur-cache", type=Path, default=DEFAULT_CACHE, help="where the offline datasets go")
    args = parser.parse_args()
    if args.whole_process:
        python = args.vidur_python or (sys.executable if importlib.util.find_spec("vidur") else None)
        vidur = None
        if python is not None:
            if args.vidur_data is None:
                parser.error("timing Vidur needs --vidur-data (see benchmarks/vidur_offline.py)")
            vidur = VidurRun(python, args.vidur_data.resolve(), args.vidur_cache.resolve())  # runs start in RUN_DIR
        whole_process(args.requests or [100_000], args.modes, args.repeat, args.jobs, vidur)
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
