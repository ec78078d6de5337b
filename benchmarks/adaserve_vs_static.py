"""AdaServe against vLLM's batching with and without static speculation, on the AdaServe workloads.

    python benchmarks/adaserve_vs_static.py [--rates 10 12 14] [--trace-scales 1 0.25] [--widths 1 2 3 4 5 6]
        [--mismatch 0 0.5 1 2] [--overconfidence -2 -1 1 2] [--speed-repeats 5] [--speed-only]
        [--diagnose [--n-max 2 4] [--strictest-least-predictable]] [--vs-fcfs]

For each workload (adaserve-mix at each `--rates` RPS, adaserve-trace replayed at each `--trace-scales`
time scale: 0.25 = four times as fast) it runs on the same arrivals:
- fcfs: vLLM's default batching without speculation (the simulator's fast path);
- static-spec-k: every decoding request verifies a k-token chain each step (the paper's vLLM-Spec(k)), on
  AdaServe's token-level model, for every k in `--widths`; the best k (most token goodput) is the baseline;
- adaserve: SLO-customized token trees (the profile's `adaserve:` settings);
- adaserve-no-slo: the same without Algorithm 2's SLO-customized phase (an ablation, as the paper's Fig. 16).
It prints SLO violations (requests that missed their TPOT SLO, or failed), token goodput (output tokens/s
of requests that met it) and per-category attainment, then the ratios the paper reports (violations of the
best baseline / AdaServe, AdaServe's goodput / the best baseline's; paper 002: up to 4.3x and 1.9x). Then
what the draft's mismatch does to AdaServe, and how fast the simulator runs AdaServe (simulated req/s).
Nothing here tells AdaServe the workload: it sees each request's SLO and its own draft's estimates only.
`--vs-fcfs` instead runs every shipped profile as shipped (its seed, rate and SLOs) with fcfs, AdaServe and
AdaServe with `adaserve.must_pay: false` (the behaviour before issue 21), and prints their SLO attainment.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from core.backends.sim import SimBackend
from core.control.adaserve.policy import AdaServePolicy, StaticSpeculationPolicy
from core.controller_api import Policy
from core.metrics import summarize
from core.metrics.summary import percentiles
from core.profile import PROFILES_DIR, Calibration, Profile, load_calibration, load_profile
from core.records import Status
from core.workload import build_load_plan


@dataclass(slots=True)
class Row:
    name: str
    requests: int
    violations: int
    goodput_tps: float
    per_task: dict[str, float]
    wall_s: float

    @property
    def violation_rate(self) -> float:
        return self.violations / max(self.requests, 1)


def with_rate(profile: Profile, rate_rps: float) -> Profile:
    arrival = profile.workload.arrival
    assert arrival is not None and hasattr(arrival, "rate_rps"), "rate sweeps need synthetic arrivals"
    workload = profile.workload.model_copy(update={"arrival": arrival.model_copy(update={"rate_rps": rate_rps})})
    copy = profile.model_copy(update={"workload": workload})
    copy._source = profile._source
    return copy


def with_time_scale(profile: Profile, scale: float) -> Profile:
    trace = profile.workload.trace
    assert trace is not None, "time scaling needs a trace"
    workload = profile.workload.model_copy(update={"trace": trace.model_copy(update={"time_scale": scale})})
    copy = profile.model_copy(update={"workload": workload})
    copy._source = profile._source
    return copy


def strictest_least_predictable(profile: Profile) -> Profile:
    """The same mix with its tasks' acceptance rates permuted so that the stricter a task's TPOT SLO, the
    less predictable its text (a diagnosis: in the shipped mix the strictest task is also the most
    predictable, so throughput-optimal trees already favour it)."""
    tasks = profile.workload.tasks
    by_strictness = sorted(tasks, key=lambda t: t.slo.tpot_s or float("inf"))
    rates = sorted(t.acceptance for t in tasks if t.acceptance is not None)
    assert len(rates) == len(tasks), "every task needs an acceptance rate"
    given = {t.name: rate for t, rate in zip(by_strictness, rates, strict=True)}
    permuted = [t.model_copy(update={"acceptance": given[t.name]}) for t in tasks]
    copy = profile.model_copy(update={"workload": profile.workload.model_copy(update={"tasks": permuted})})
    copy._source = profile._source
    return copy


def run(name: str, profile: Profile, calibration: Calibration, policy: Callable[[], Policy] | None, seed: int) -> Row:
    backend = SimBackend(calibration, profile.knobs, seed=seed, policy_factory=policy)
    start = time.perf_counter()
    outcome = asyncio.run(backend.run(build_load_plan(profile, seed=seed)))
    wall = time.perf_counter() - start
    summary = summarize(outcome.records, slo=profile.slo, smooth=profile.smooth_goodput)
    measured = [r for r in outcome.records if not r.warmup]
    met = round(summary.slo_attainment * len(measured))
    assert all(r.status is Status.OK for r in measured), "every request should be served in these runs"
    return Row(
        name=name,
        requests=len(measured),
        violations=len(measured) - met,
        goodput_tps=summary.token_goodput_tps,
        per_task={task: t.slo_attainment for task, t in summary.per_task.items()},
        wall_s=wall,
    )


def print_rows(title: str, rows: list[Row]) -> None:
    tasks = sorted({task for row in rows for task in row.per_task})
    print(f"\n{title}")
    header = f"{'policy':<16} {'requests':>8} {'violations':>10} {'viol %':>7} {'goodput tok/s':>13}"
    print(header + "".join(f" {task[:14]:>14}" for task in tasks))
    for row in rows:
        line = (
            f"{row.name:<16} {row.requests:>8} {row.violations:>10} {100 * row.violation_rate:>6.1f}% "
            f"{row.goodput_tps:>13.1f}"
        )
        print(line + "".join(f" {100 * row.per_task.get(task, float('nan')):>13.1f}%" for task in tasks))


def compare(title: str, profile: Profile, widths: list[int], seed: int) -> tuple[Row, Row, Row]:
    calibration = load_calibration(profile)
    spec = profile.adaserve
    rows = [run("fcfs", profile, calibration, None, seed)]
    statics = [
        run(
            f"static-spec-{w}", profile, calibration, partial(StaticSpeculationPolicy, w, spec, calibration, seed), seed
        )
        for w in widths
    ]
    rows += statics
    ada = run("adaserve", profile, calibration, partial(AdaServePolicy, spec, calibration, seed), seed)
    rows.append(ada)
    # Ablation (paper Fig. 16): the same without the SLO-customized phase (throughput-optimized only).
    ablated = spec.model_copy(update={"slo_selection": False})
    rows.append(run("adaserve-no-slo", profile, calibration, partial(AdaServePolicy, ablated, calibration, seed), seed))
    best_static = max(statics, key=lambda r: (r.goodput_tps, -r.violations))
    print_rows(title, rows)
    best = max(rows[:-2], key=lambda r: (r.goodput_tps, -r.violations))
    print(
        f"best baseline {best.name}: violations {best.violations} -> {ada.violations} "
        f"({best.violations / max(ada.violations, 1):.1f}x fewer), goodput x{ada.goodput_tps / best.goodput_tps:.2f}; "
        f"vs fcfs: {rows[0].violations / max(ada.violations, 1):.1f}x fewer violations, "
        f"goodput x{ada.goodput_tps / rows[0].goodput_tps:.2f}"
    )
    return rows[0], best_static, ada


def mismatch_sweep(profile: Profile, levels: list[float], biases: list[float], seed: int) -> None:
    """AdaServe with drafts that misjudge their acceptance: logit noise (mismatch) at no bias, then logit
    bias (overconfidence; negative: an underconfident draft) at the profile's mismatch."""
    calibration = load_calibration(profile)
    default = profile.adaserve.mismatch
    settings = [(level, 0.0) for level in levels] + [(default, bias) for bias in biases if bias != 0.0]
    rows = []
    for level, bias in settings:
        spec = profile.adaserve.model_copy(update={"mismatch": level, "overconfidence": bias})
        policy = partial(AdaServePolicy, spec, calibration, seed)
        rows.append(run(f"m={level:g} bias={bias:+g}", profile, calibration, policy, seed))
    title = f"AdaServe on {profile.name} vs the draft's mismatch (logit noise) and overconfidence (logit bias)"
    print_rows(title, rows)


def speed(profile: Profile, seed: int, repeats: int = 5) -> None:
    """Simulated requests per CPU-second (what holds on a shared machine; the median of `repeats` runs, and the
    best) and per wall-second (median). Each run includes building the workload, as the CLI does."""
    calibration = load_calibration(profile)
    for name, policy in (("adaserve", partial(AdaServePolicy, profile.adaserve, calibration, seed)), ("fcfs", None)):
        cpu_s: list[float] = []
        wall_s: list[float] = []
        requests = 0
        for _ in range(repeats):
            backend = SimBackend(calibration, profile.knobs, seed=seed, policy_factory=policy)
            cpu, wall = time.process_time(), time.perf_counter()
            requests = len(asyncio.run(backend.run(build_load_plan(profile, seed=seed))).records)
            cpu_s.append(time.process_time() - cpu)
            wall_s.append(time.perf_counter() - wall)
        print(
            f"simulator speed, {name} on {profile.name} ({repeats} runs): {requests / statistics.median(cpu_s):,.0f} "
            f"simulated req per CPU-second (median; best {requests / min(cpu_s):,.0f}; median CPU "
            f"{statistics.median(cpu_s):.3f} s), {requests / statistics.median(wall_s):,.0f} per wall-second"
        )


def diagnose(profile: Profile, n_max_values: list[int], widths: list[int], seed: int) -> None:
    """Where AdaServe's SLO-customized phase spends the budget (README: why it loses past saturation): per
    variant, the requests it served per selection step and how many of them needed more accepted drafts than
    the tree is deep (A(r) > d + 1, beyond one step's reach), its share of the draft tokens, the draft
    acceptance, the strictest category's TPOT percentiles; the default, without the phase, and other n_max;
    then the best static width for reference."""
    calibration = load_calibration(profile)
    ablated = profile.adaserve.model_copy(update={"slo_selection": False})
    variants = [("adaserve", profile.adaserve), ("no SLO phase", ablated)]
    variants += [
        (f"n_max={k}", profile.adaserve.model_copy(update={"n_max": k}))
        for k in n_max_values
        if k != profile.adaserve.n_max
    ]
    strict = min(profile.workload.tasks, key=lambda t: t.slo.tpot_s or float("inf")).name
    rate = getattr(profile.workload.arrival, "rate_rps", None)
    where = f"{profile.name} at {rate:g} RPS" if rate is not None else profile.name
    rates = ", ".join(f"{t.name} {t.acceptance:g}" for t in profile.workload.tasks)
    print(f"\nAdaServe's SLO-customized phase on {where} ({strict} has the strictest TPOT SLO; acceptance {rates})")
    print(
        f"{'variant':<14} {'violations':>10} {'goodput':>8} {'SLO share':>9} {'served/step':>11} {'beyond d':>8} "
        f"{'acceptance':>10} {strict[:10] + ' TPOT p50/p90 ms':>26}"
    )
    for label, spec in variants:
        policy = AdaServePolicy(spec, calibration, seed)  # one run, one replica: the factory is called once
        backend = SimBackend(calibration, profile.knobs, seed=seed, policy_factory=lambda policy=policy: policy)
        records = asyncio.run(backend.run(build_load_plan(profile, seed=seed))).records
        summary = summarize(records, slo=profile.slo, smooth=profile.smooth_goodput)
        measured = [r for r in records if not r.warmup]
        violations = len(measured) - round(summary.slo_attainment * len(measured))
        tpot = np.array([r.tpot_s for r in measured if r.task == strict and r.tpot_s is not None])
        p50, p90 = percentiles(tpot, (50.0, 90.0))
        info = policy.describe()
        print(
            f"{label:<14} {violations:>10} {summary.token_goodput_tps:>8.1f} {info['slo_share_of_drafts']:>9.3f} "
            f"{info['slo_served_per_selection_step']:>11.2f} {info['slo_served_beyond_tree_per_selection_step']:>8.2f} "
            f"{info['acceptance_of_drafts']:>10.3f} {1000 * p50:>15.1f} / {1000 * p90:.1f}"
        )
    statics = [
        run(
            f"static-spec-{w}",
            profile,
            calibration,
            partial(StaticSpeculationPolicy, w, profile.adaserve, calibration, seed),
            seed,
        )
        for w in widths
    ]
    best = max(statics, key=lambda r: (r.goodput_tps, -r.violations))
    print(f"{'best ' + best.name:<14} {best.violations:>10} {best.goodput_tps:>8.1f}")


def attainment(profile: Profile, calibration: Calibration, policy: Callable[[], Policy] | None) -> float:
    backend = SimBackend(calibration, profile.knobs, seed=profile.seed, policy_factory=policy)
    records = asyncio.run(backend.run(build_load_plan(profile, seed=profile.seed))).records
    return summarize(records, slo=profile.slo, smooth=profile.smooth_goodput).slo_attainment


def vs_fcfs() -> None:
    """Issue 21's check: AdaServe against fcfs on every shipped profile, as shipped (the simulator)."""
    print(f"{'profile':<24} {'fcfs':>7} {'adaserve':>9} {'- fcfs':>7} {'must_pay off':>13} {'- fcfs':>7}")
    for path in sorted(PROFILES_DIR.glob("*.yaml")):
        profile = load_profile(path)
        calibration = load_calibration(profile)
        before = profile.adaserve.model_copy(update={"must_pay": False})
        fcfs = attainment(profile, calibration, None)
        ada = attainment(profile, calibration, partial(AdaServePolicy, profile.adaserve, calibration, profile.seed))
        off = attainment(profile, calibration, partial(AdaServePolicy, before, calibration, profile.seed))
        line = f"{path.stem:<24} {fcfs:>7.3f} {ada:>9.3f} {ada - fcfs:>+7.3f} {off:>13.3f} {off - fcfs:>+7.3f}"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[10.0, 12.0, 14.0])
    parser.add_argument("--trace-scales", type=float, nargs="+", default=[1.0, 0.25])
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    parser.add_argument("--mismatch", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0])
    parser.add_argument("--overconfidence", type=float, nargs="+", default=[-2.0, -1.0, 1.0, 2.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speed-repeats", type=int, default=5, help="runs timed for the speed line")
    parser.add_argument("--speed-only", action="store_true", help="only the simulator speed lines")
    parser.add_argument(
        "--diagnose", action="store_true", help="only the SLO-phase diagnosis, at each of --rates on adaserve-mix"
    )
    parser.add_argument("--n-max", type=int, nargs="+", default=[2, 4], help="n_max values the diagnosis adds")
    parser.add_argument(
        "--strictest-least-predictable",
        action="store_true",
        help="diagnose a mix whose acceptance rates are permuted: the stricter the TPOT SLO, the lower the rate",
    )
    parser.add_argument(
        "--vs-fcfs", action="store_true", help="only AdaServe against fcfs on every shipped profile (issue 21)"
    )
    args = parser.parse_args()
    if args.vs_fcfs:
        vs_fcfs()
        return
    if args.diagnose:
        mix = load_profile("adaserve-mix")
        if args.strictest_least_predictable:
            mix = strictest_least_predictable(mix)
        for rate in args.rates:
            diagnose(with_rate(mix, rate), args.n_max, args.widths, args.seed)
        return
    if args.speed_only:
        speed(load_profile("adaserve-mix"), args.seed, args.speed_repeats)
        return
    mix = load_profile("adaserve-mix")
    for rate in args.rates:
        compare(f"adaserve-mix at {rate:g} RPS (60/20/20 Table 2 mix)", with_rate(mix, rate), args.widths, args.seed)
    trace = load_profile("adaserve-trace")
    for scale in args.trace_scales:
        title = f"adaserve-trace, time_scale {scale:g} (categories peak at different times)"
        compare(title, with_time_scale(trace, scale), args.widths, args.seed)
    middle = sorted(args.rates)[len(args.rates) // 2]
    mismatch_sweep(with_rate(mix, middle), args.mismatch, args.overconfidence, args.seed)
    speed(mix, args.seed, args.speed_repeats)


if __name__ == "__main__":
    main()
