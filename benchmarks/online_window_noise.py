"""How noisy is an online window's score, and how well does the tuner's standard error say so (docs/gateway.md)?

On the load of benchmarks/online_tune_sim.py (saber-w1's mix at 3 req/s, queue 16), each static cap is served
for 20000 s; its completed stream (after the first 1000 s) is cut into consecutive windows of N requests, each
scored with eq. 3 as the online tuner scores a window (core/tune/score.py, lambda 5, the profile's SLO).
Printed per cap and N: the spread of those window scores (what a comparison of two windows really faces),
the mean batch-means standard error (eq. 3 on 8 consecutive slices, spread / sqrt(8): what the tuner used
until 2026-11-26, and still uses until its control variate is fitted, core/tune/online.py), and the mean
bootstrap standard error (the window's requests resampled 100 times).
Then the window's p99 latency beside the p99 of its completed requests' output tokens (which requests
happened to arrive, not the cap): their correlation, and the spread of the p99 before and after a linear
regression on that p99 of output tokens (what a control variate on it would leave; eq. 3 multiplies
the p99's spread by lambda).

    python benchmarks/online_window_noise.py --seeds 2 3 --caps 16 24 32 40
"""

from __future__ import annotations

import argparse
import math
from functools import partial

import numpy as np

from core.metrics.outcomes import RequestOutcomes, compute_outcomes
from core.profile import TunerSpec, load_calibration, load_profile
from core.tune.knobspace import Point
from core.tune.online_sim import run_static
from core.tune.score import score

RATE_RPS, QUEUE, DURATION_S, SKIP_S, BATCHES, RESAMPLES = 3.0, 16, 20000.0, 1000.0, 8, 100


def window_score(
    out: RequestOutcomes, point: Point, slo_s: float, tuner: TunerSpec, picks: np.ndarray, span_s: float
) -> float:
    """Eq. 3 of the requests `picks` over `span_s`, as the online tuner scores a window."""
    e2e = out.e2e_s[picks][out.ok[picks]]
    if len(e2e) == 0:
        return -math.inf
    goodput = float(out.good[picks].sum()) / span_s
    return score(goodput, float(np.percentile(e2e, 99)), slo_s, point, tuner, "live")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[2])
    parser.add_argument("--caps", type=int, nargs="+", default=[16, 24, 32, 40])
    parser.add_argument("--windows", type=int, nargs="+", default=[200, 400, 800, 1600])
    args = parser.parse_args()
    base = load_profile("saber-w1")
    arrival = base.workload.arrival.model_copy(update={"rate_rps": RATE_RPS})
    profile = base.model_copy(update={"workload": base.workload.model_copy(update={"arrival": arrival})})
    calibration = load_calibration(profile)
    slo_s = float(profile.slo.e2e_s or math.inf)
    rng = np.random.default_rng(0)
    print(
        "seed  cap  window  windows  spread of window scores  batch-means se  bootstrap se"
        "  corr(p99, p99 output tokens)  p99 spread  after regression"
    )
    for seed in args.seeds:
        for cap in args.caps:
            records = run_static(profile, calibration, cap, duration_s=DURATION_S, seed=seed, max_queue=QUEUE)
            records = sorted((r for r in records if r.end_s is not None and r.end_s >= SKIP_S), key=lambda r: r.end_s)
            out = compute_outcomes(records, fallback_slo=profile.slo, smooth=profile.smooth_goodput)
            end = np.array([r.end_s for r in records])
            point = Point(cap, profile.knobs.max_num_seqs, profile.knobs.spec_width, profile.knobs.spec_on)

            eq3 = partial(window_score, out, point, slo_s, profile.tuner)

            for n in args.windows:
                scores, batch_se, boot_se, p99, p99_tokens = [], [], [], [], []
                for start in range(1, len(records) - n, n):
                    picks = np.arange(start, start + n)
                    completed = picks[out.ok[picks]]
                    p99.append(float(np.percentile(out.e2e_s[completed], 99)))
                    p99_tokens.append(float(np.percentile(out.output_tokens[completed], 99)))
                    scores.append(eq3(picks, end[start + n - 1] - end[start - 1]))
                    edges = np.linspace(0, n, BATCHES + 1).astype(int)
                    slices = [picks[edges[b] : edges[b + 1]] for b in range(BATCHES)]
                    batch = [eq3(s, end[s[-1]] - end[s[0] - 1]) for s in slices]
                    batch_se.append(float(np.std(batch, ddof=1)) / math.sqrt(BATCHES))
                    span = end[start + n - 1] - end[start - 1]
                    boot = [eq3(picks[rng.integers(0, n, n)], span) for _ in range(RESAMPLES)]
                    boot_se.append(float(np.std(boot, ddof=1)))
                corr = float(np.corrcoef(p99, p99_tokens)[0, 1])
                spread = float(np.std(p99, ddof=1))
                print(
                    f"{seed:4d}  {cap:3d}  {n:6d}  {len(scores):7d}  {np.std(scores, ddof=1):23.2f}"
                    f"  {np.mean(batch_se):14.2f}  {np.mean(boot_se):12.2f}  {corr:28.2f}  {spread:10.2f}"
                    f"  {spread * math.sqrt(1 - corr**2):16.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
