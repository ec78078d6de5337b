"""The SLO-Tuner paper's knob sweeps (paper 000, Fig. 5) on the simulator's TinyLlama/L40S-class profile.

    python benchmarks/sim_trends.py

Prints p99 and goodput under the 1.2 s SLO for one-knob sweeps around the paper's default-like point
(concurrency 8, max_num_seqs 8, speculative width 8, speculation on): concurrency, batch size and width.
"""

from __future__ import annotations

import asyncio

from core.backends.sim import SimBackend
from core.metrics import Summary, summarize
from core.profile import Profile, load_calibration, load_profile
from core.workload import build_load_plan


def segment(profile: Profile, conc: int, seqs: int, width: int, seed: int = 5) -> Summary:
    arrival = profile.workload.arrival.model_copy(update={"clients": conc})  # type: ignore[union-attr]
    knobs = profile.knobs.model_copy(
        update={"concurrency": conc, "max_num_seqs": seqs, "spec_width": width, "spec_on": width > 0}
    )
    varied = profile.model_copy(
        update={"workload": profile.workload.model_copy(update={"arrival": arrival}), "knobs": knobs}
    )
    backend = SimBackend(load_calibration(varied), knobs, seed=seed)
    outcome = asyncio.run(backend.run(build_load_plan(varied)))
    return summarize(outcome.records, slo=varied.slo, smooth=varied.smooth_goodput)


def table(title: str, label: str, rows: list[tuple[int, Summary]]) -> None:
    print(f"\n{title}\n| {label} | p99 s | goodput req/s | throughput req/s |\n|---|---|---|---|")
    for value, s in rows:
        print(f"| {value} | {s.p99_s:.2f} | {s.goodput_rps:.2f} | {s.throughput_rps:.2f} |")


def main() -> None:
    profile = load_profile("slo-tuner-paper")
    table(
        "Concurrency (max_num_seqs 8, width 8, on)",
        "concurrency",
        [(c, segment(profile, c, 8, 8)) for c in (2, 4, 6, 8, 10, 12, 16)],
    )
    table(
        "max_num_seqs (concurrency 8, speculation off)",
        "max_num_seqs",
        [(b, segment(profile, 8, b, 0)) for b in (1, 2, 4, 8, 16)],
    )
    table(
        "Speculative width (concurrency 8, max_num_seqs 8)",
        "width",
        [(w, segment(profile, 8, 8, w)) for w in (0, 2, 4, 8, 12, 16)],
    )


if __name__ == "__main__":
    main()
