"""SABER against the best static max_num_seqs on the simulator, over a load sweep (paper 001 sec. V-VI, Fig. 5-6).

The paper's protocol, fixed before measuring: for each workload W1-W3 (profiles saber-w1..w3: Table I tasks
and SLAs) and each request rate in RATES (the paper's 1-10, 15 and 20 RPS), 100 Poisson requests per run,
three seeds; static baselines are fcfs at max_num_seqs 10, 20, ..., 100 and the best static cap per
(workload, rate) is the one with the highest SLO attainment averaged over the seeds (sec. VI-B). SABER
runs with the profile's `saber:` settings; it replaces the static batch size (sec. I, IV-A), so the engine
under it keeps only the hardware's own limit, the largest cap of the sweep (100: the paper's GPU memory held
no more, sec. III-B), not the profile's max_num_seqs. Its f(L) comes from its own offline
profiling runs (core/control/saber/speed_model.py), never from the calibration's parameters.

Heavy load is HEAVY_RPS = 20, the paper's heavy-load rate (sec. V-C), chosen before any measurement.

Reported per (workload, rate): SLO attainment (the paper's "goodput", sec. III-B: requests completed
within their SLA over all requests) of SABER and of the best static cap, the difference, goodput in
requests/s, the mean of e2e/SLA (the line of the paper's Fig. 6) and its CV within the point. Per workload,
two CVs over the sweep: the paper's (sec. VI-B eq. 1, Fig. 6: the CV is taken across the request rates,
i.e. std/mean of the per-rate mean ratios; its W2 figures, 17.5% and 20.8% with both curves
well under the SLA, are too small to be a per-request spread) and, for reference, std/mean of every
completed request's e2e/SLA pooled over all rates. The attainment gain is also averaged over the sweep
(the paper's +10.2 / +1.2 / +4.3 points for W1-W3, sec. VI-C). Three diagnostics of why SABER wins or
loses: the mean number of requests decoding while the arrivals last (static conc, SABER conc), the share
of SABER's refusals of a window request that its own speed would have passed but a running request's
recorded speed did not (line 10's second check: "by running"), the share of each task SABER demoted, and
the pin: the time-weighted highest speed recorded among running requests over f(1), and the share of the
time each task held it ("pin/f(1), held by", tasks in the demoted column's order).

Two engines (`--regime`). `shipped` (default): the profiles' calibration (qwen2.5-coder-1.5b-l4), or with the
sensitivity options a hypothetical engine of fixed step time B and S s per running sequence per step, every
task's length spread set, SLAs set as the paper sets them. `paper`: the shipped engine's static baseline
contradicts the paper's own static-baseline figures, so first an engine is fitted to those figures alone
(benchmarks/saber_paper_regime.py: anchors, grid, loss; static runs only, its loss and parameters printed),
then, with that engine frozen, the same comparison, the paper's static figures the fit left out beside the
fitted engine's, and SABER's admission window (unstated in the paper) as a sensitivity.

    python benchmarks/saber_vs_static.py [--regime shipped|paper] [--workloads saber-w1,saber-w2,saber-w3]
        [--rates 1,2,...] [--requests 100] [--seeds 3] [--set key=value ...]   (--set: a saber: setting)
        [--per-seq-s S] [--base-s B] [--derive-slas] [--length-sigma S]   (shipped only)
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from saber_paper_regime import (
    FIT_REQUESTS,
    FIT_SEEDS,
    HELD_OUT_CAPS,
    HELD_OUT_CV,
    PaperEngine,
    anchor_values,
    fit,
    print_fit,
    static_at_anchors,
)
from saber_static_baseline import (
    StaticBest,
    at_rate,
    best_static,
    cv,
    mean,
    measure,
    ratios,
    with_engine,
    with_length_sigma,
)

from core.compare import run_mode, with_cap
from core.control.saber.speed_model import offline_phase
from core.jobs import RunOptions, RunResult
from core.profile import PoissonArrival, Profile, SLOSpec, load_calibration, load_profile
from core.sim.engine import simulate

WORKLOADS = ("saber-w1", "saber-w2", "saber-w3")
RATES = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0)
HEAVY_RPS = 20.0
REQUESTS = 100
SEEDS = 3


def decoding_concurrency(result: RunResult) -> float:
    """Mean number of requests decoding (first token to end) while the arrivals last: how much of the engine a
    mode used under the load. SABER holds it down with the second check of line 10."""
    measured = [r for r in result.records if not r.warmup]
    start = min(r.arrival_s for r in measured)
    stop = max(r.arrival_s for r in measured)
    if stop <= start:
        return float("nan")
    busy = 0.0
    for r in measured:
        first = r.first_token_s
        if r.ok and first is not None and r.end_s is not None:
            busy += max(0.0, min(r.end_s, stop) - max(first, start))
    return busy / (stop - start)


def pinning(result: RunResult, fastest_tps: float) -> tuple[float, dict[str, float]]:
    """While the arrivals last: the time-weighted mean of the highest speed recorded at admission among the
    running high-tier requests (while there are any), over f(1), and the share of the time each task held
    it. The recorded speed is rebuilt from the records: max tokens / (deadline - admission time), as SABER
    recorded it."""
    measured = [r for r in result.records if not r.warmup]
    start, stop = min(r.arrival_s for r in measured), max(r.arrival_s for r in measured)
    running = [
        (r.dispatched_s, r.end_s, r.max_tokens / (r.arrival_s + r.slo.e2e_s - r.dispatched_s), r.task)
        for r in measured
        if r.tier == "high" and r.dispatched_s is not None and r.end_s is not None and r.slo.e2e_s is not None
    ]
    times = sorted({start, stop, *(t for a, b, _, _ in running for t in (a, b) if start < t < stop)})
    weighted, held = 0.0, dict[str, float]()
    for left, right in itertools.pairwise(times):
        holders = [(speed, task) for a, b, speed, task in running if a <= left < b]
        if holders:
            speed, task = max(holders)
            weighted += speed / fastest_tps * (right - left)
            held[task] = held.get(task, 0.0) + right - left
    span, holding = stop - start, sum(held.values())
    return (weighted / holding if holding else 0.0), {task: t / span for task, t in held.items()}


def demoted_share(results: list[RunResult], tasks: list[str]) -> str:
    """Per task, the share of measured requests SABER served from its low tier (demoted), in task order."""
    shares = []
    for task in tasks:
        records = [r for result in results for r in result.records if r.task == task and not r.warmup]
        shares.append(f"{sum(r.tier == 'low' for r in records) / max(1, len(records)):.2f}")
    return "/".join(shares)


async def with_derived_slas(profile: Profile) -> Profile:
    """Each task's SLA set as the paper sets it (sec. III-B): the mean completion time of that task when 100
    requests of the balanced mix arrive at 10 RPS (Poisson), here with fcfs at max_num_seqs 100."""
    tasks = [t.model_copy(update={"weight": 1.0}) for t in profile.workload.tasks]
    workload = profile.workload.model_copy(
        update={"tasks": tasks, "arrival": PoissonArrival(rate_rps=10.0), "requests": 100, "warmup_requests": 0}
    )
    probe = with_cap(profile.model_copy(update={"workload": workload, "mode": "fcfs"}), 100)
    result, _ = await run_mode(probe, "fcfs", 0, RunOptions(seed=0))
    mean_e2e = {
        t: statistics.fmean(r.e2e_s for r in result.records if r.task == t and r.ok) for t in {t.name for t in tasks}
    }
    derived = [t.model_copy(update={"slo": SLOSpec(e2e_s=round(mean_e2e[t.name], 2))}) for t in profile.workload.tasks]
    return profile.model_copy(update={"workload": profile.workload.model_copy(update={"tasks": derived})})


def print_offline_phase(name: str, base: Profile) -> None:
    speeds = offline_phase(base, load_calibration(base), simulate, loads=base.saber.profile_loads, seed=0)
    fits = ", ".join(f"{kind} R² {model.r2:.3f}" for kind, model in speeds.models.items())
    usl = speeds.models["usl"]
    print(f"\n{name}: offline phase: {len(speeds.samples)} load-speed points; {fits}")
    print(f"  USL f(L) = {usl.params[0]:.1f} / (1 + {usl.params[1]:.4f} (L-1) + {usl.params[2]:.2e} L (L-1)) tok/s:")
    print("  " + ", ".join(f"f({load}) = {usl(load):.1f}" for load in (1, 10, 25, 50, 100)))
    # USL's aggregate throughput L f(L) peaks at L* = sqrt((1 - sigma) / kappa) (paper sec. IV-B, [50]).
    sigma, kappa = usl.params[1], usl.params[2]
    peak = math.sqrt((1.0 - sigma) / kappa) if kappa > 0 and sigma < 1 else math.inf
    where = f"L* = {peak:.0f}" if peak <= 10 * max(base.saber.static_caps) else "no peak below 10x the largest cap"
    print(f"  aggregate throughput L f(L): {where}; 100 f(100) = {100 * usl(100):.0f} tok/s")


def sweep_summary(static: dict[float, StaticBest], ours: dict[float, list[RunResult]]) -> tuple[float, float, float]:
    """(mean attainment gain over the sweep, the paper's CV across rates of the best static, of SABER): eq. 1 as
    sec. VI-B applies it, std/mean of the per-rate mean completion/SLA (Fig. 6's line)."""
    gains = [mean(ours[rate], "slo_attainment") - static[rate].attainment for rate in static]
    static_means = np.array([static[rate].mean_ratio for rate in static])
    saber_means = np.array([np.concatenate([ratios(r) for r in ours[rate]]).mean() for rate in static])
    return statistics.fmean(gains), cv(static_means), cv(saber_means)


async def sweep_workload(
    name: str, base: Profile, rates: list[float], requests: int, seeds: int, saber: dict[str, Any]
) -> dict[float, StaticBest]:
    """SABER against the best static cap at every rate on `base`'s engine; prints one line per rate and the
    sweep's summary, returns the best static runs (the window-size sensitivity reuses them)."""
    print_offline_phase(name, base)
    hardware_cap = max(base.saber.static_caps)
    tasks = [t.name for t in base.workload.tasks]
    print(
        f"{name}: {requests} requests x {seeds} seeds per point; static caps {base.saber.static_caps}; "
        f"SABER on an engine capped at {hardware_cap}"
    )
    print(
        f"{'RPS':>5} {'best cap':>8} {'static att':>10} {'SABER att':>9} {'diff':>6} "
        f"{'static r/s':>10} {'SABER r/s':>9} {'static e2e/SLA':>14} {'SABER e2e/SLA':>13} "
        f"{'static CV':>9} {'SABER CV':>8} {'static conc':>11} {'SABER conc':>10} {'by running':>12} "
        f"{'demoted ' + '/'.join(t.split('-')[-1][:5] for t in tasks):>22} {'pin/f(1), held by':>25}"
    )
    statics: dict[float, StaticBest] = {}
    ours_by_rate: dict[float, list[RunResult]] = {}
    for rate in rates:
        best = statics[rate] = await best_static(base, rate, requests, seeds)
        described: list[dict[str, Any]] = []
        profile = at_rate(base, rate, requests, saber)
        ours = ours_by_rate[rate] = await measure(with_cap(profile, hardware_cap), "saber", seeds, described)
        pins = [pinning(r, d["fastest_tps"]) for r, d in zip(ours, described, strict=True)]
        pin_holders: dict[str, float] = {}
        for _, held in pins:
            for task, share in held.items():
                pin_holders[task] = pin_holders.get(task, 0.0) + share / len(pins)
        pin = f"{statistics.fmean(p for p, _ in pins):.2f} " + "/".join(f"{pin_holders.get(t, 0):.2f}" for t in tasks)
        refused_running = sum(d["refused_running"] for d in described)
        refusals = refused_running + sum(d["refused_own"] for d in described)
        s_att, o_att = best.attainment, mean(ours, "slo_attainment")
        static_ratios, saber_ratios = best.ratios, np.concatenate([ratios(r) for r in ours])
        heavy = "  <- heavy" if rate == HEAVY_RPS else ""
        print(
            f"{rate:5.0f} {best.cap:8d} {s_att:10.3f} {o_att:9.3f} {o_att - s_att:+6.3f} "
            f"{mean(best.results, 'goodput_rps'):10.2f} {mean(ours, 'goodput_rps'):9.2f} "
            f"{static_ratios.mean():14.3f} {saber_ratios.mean():13.3f} "
            f"{cv(static_ratios):9.3f} {cv(saber_ratios):8.3f} "
            f"{statistics.fmean(decoding_concurrency(r) for r in best.results):11.1f} "
            f"{statistics.fmean(decoding_concurrency(r) for r in ours):10.1f} "
            f"{refused_running / max(1, refusals):12.2f} {demoted_share(ours, tasks):>22} {pin:>25}{heavy}",
            flush=True,
        )
    gain, static_cv, saber_cv = sweep_summary(statics, ours_by_rate)
    pooled_static = np.concatenate([s.ratios for s in statics.values()])
    pooled_saber = np.concatenate([ratios(r) for runs in ours_by_rate.values() for r in runs])
    print(
        f"{name}: mean attainment gain over the sweep {gain:+.3f}; CV of the per-rate mean "
        f"completion/SLA across rates (the paper's eq. 1 / Fig. 6): best static {static_cv:.3f}, "
        f"SABER {saber_cv:.3f}; CV of completion/SLA pooled over all requests of all rates: best static "
        f"{cv(pooled_static):.3f}, SABER {cv(pooled_saber):.3f}"
    )
    return statics


def print_held_out(name: str, statics: dict[float, StaticBest]) -> None:
    """The paper's static-baseline figures the fit left out, beside the fitted engine's (sec. V-C, VI-C)."""
    caps = [
        f"{rate:g} RPS cap {statics[rate].cap} (paper {cap})"
        for (workload, rate), cap in HELD_OUT_CAPS.items()
        if workload == name and rate in statics
    ]
    means = np.array([s.mean_ratio for s in statics.values()])
    print(
        f"{name}: held out (not in the fit's loss): best static {'; '.join(caps) or '-'}; "
        f"static CV across rates {cv(means):.3f} (paper {HELD_OUT_CV.get(name, '-')})"
    )


WINDOW_SIZES = (1, 2, 4, 8, 1000)  # 1000: the whole high tier (no run queues that many)


async def window_sensitivity(
    bases: dict[str, Profile],
    statics: dict[str, dict[float, StaticBest]],
    requests: int,
    seeds: int,
    saber: dict[str, Any],
) -> None:
    """SABER's admission window (Algorithm 1 line 6; the paper gives no windowSize) against the same best
    static runs: the mean attainment gain over the sweep, the attainment at HEAVY_RPS and the paper's CV."""
    print("\nwindow-size sensitivity (the paper states no windowSize; the profiles' default is 4): per workload")
    print("  mean attainment gain over the sweep / gain at the heavy rate / SABER's CV across rates (best static's)")
    for window in WINDOW_SIZES:
        cells = []
        for name, base in bases.items():
            static = statics[name]
            hardware_cap = max(base.saber.static_caps)
            ours = {
                rate: await measure(
                    with_cap(at_rate(base, rate, requests, {**saber, "window_size": window}), hardware_cap),
                    "saber",
                    seeds,
                )
                for rate in static
            }
            gain, static_cv, saber_cv = sweep_summary(static, ours)
            heavy = max(static)
            heavy_gain = mean(ours[heavy], "slo_attainment") - static[heavy].attainment
            cells.append(f"{name} {gain:+.3f} / {heavy_gain:+.3f} / {saber_cv:.3f} ({static_cv:.3f})")
        label = "all" if window == WINDOW_SIZES[-1] else str(window)
        print(f"  window {label:>4}: " + ";  ".join(cells), flush=True)


async def paper_regime(workloads: list[str], rates: list[float], requests: int, seeds: int, saber: dict) -> None:
    """`--regime paper`: fit the engine to the paper's static anchors (static runs only), freeze it, then run
    SABER against the best static cap per workload and rate, and the window-size sensitivity."""
    print(
        "step 1: fit an engine to the paper's static-baseline figures (benchmarks/saber_paper_regime.py); no SABER run"
    )
    result = await fit(requests=FIT_REQUESTS, seeds=FIT_SEEDS)
    shipped = anchor_values(await static_at_anchors(None, FIT_REQUESTS, FIT_SEEDS))
    print_fit(result, FIT_REQUESTS, FIT_SEEDS, shipped)
    engine: PaperEngine = result.engine
    print(f"\nstep 2: SABER vs the best static cap on the frozen engine ({engine.cli()}); saber settings {saber}")
    bases = {name: engine.apply(load_profile(name)) for name in workloads}
    statics = {}
    for name, base in bases.items():
        statics[name] = await sweep_workload(name, base, rates, requests, seeds, saber)
        print_held_out(name, statics[name])
    await window_sensitivity(bases, statics, requests, seeds, saber)


def parse_setting(text: str) -> tuple[str, Any]:
    key, _, value = text.partition("=")
    lowered = value.lower()
    if lowered in ("true", "false"):
        return key, lowered == "true"
    if lowered == "none":
        return key, None
    try:
        return key, int(value)
    except ValueError:
        return key, value


async def shipped_regime(args: argparse.Namespace, rates: list[float], saber: dict[str, Any]) -> None:
    """The profiles' own engine (or the sensitivity options' hypothetical one)."""
    print(f"SABER vs best static max_num_seqs (simulator); heavy load = {HEAVY_RPS:g} RPS; saber settings {saber}")
    for name in args.workloads.split(","):
        base = load_profile(name)
        if args.length_sigma is not None:
            base = with_length_sigma(base, args.length_sigma)
        if args.per_seq_s or args.base_s is not None:
            base = with_engine(base, args.per_seq_s, args.base_s)
        if args.derive_slas:
            base = await with_derived_slas(base)
            slas = ", ".join(f"{t.name} {t.slo.e2e_s} s" for t in base.workload.tasks)
            print(f"\n{name}: SLAs derived at 10 RPS: {slas}")
        await sweep_workload(name, base, rates, args.requests, args.seeds, saber)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--regime",
        choices=("shipped", "paper"),
        default="shipped",
        help="paper: fit an engine to the paper's static-baseline figures first, then compare on it",
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--rates", default=",".join(f"{r:g}" for r in RATES))
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--seeds", type=int, default=SEEDS)
    parser.add_argument("--set", action="append", default=[], help="a saber: profile setting, key=value")
    parser.add_argument(
        "--per-seq-s", type=float, default=0.0, help="sensitivity: add this per-sequence step cost to the engine"
    )
    parser.add_argument("--base-s", type=float, default=None, help="sensitivity: the engine's fixed step time")
    parser.add_argument(
        "--length-sigma", type=float, default=None, help="sensitivity: lognormal spread of every task's lengths"
    )
    parser.add_argument(
        "--derive-slas", action="store_true", help="set each task's SLA as the paper does (mean e2e at 10 RPS)"
    )
    args = parser.parse_args()
    saber = dict(parse_setting(s) for s in args.set)
    rates = [float(r) for r in args.rates.split(",")]
    start = time.perf_counter()
    if args.regime == "paper":
        if args.per_seq_s or args.base_s is not None or args.length_sigma is not None or args.derive_slas:
            parser.error("--regime paper fits its own engine; the engine options belong to --regime shipped")
        asyncio.run(paper_regime(args.workloads.split(","), rates, args.requests, args.seeds, saber))
    else:
        asyncio.run(shipped_regime(args, rates, saber))
    print(f"\n{time.perf_counter() - start:.0f} s wall, {time.process_time():.0f} s CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
