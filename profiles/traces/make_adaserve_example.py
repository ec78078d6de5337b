"""Regenerate adaserve-example.jsonl: a small trace in the AdaServe artifact's row format.

    python profiles/traces/make_adaserve_example.py

Rows are {emission_time_ms, input_length, output_length, slo_ratio} plus our optional `task`. Like the
synthetic trace of AdaServe sec. 6.3 (Fig. 13), each category's request rate rises and falls on its own
phase, so the categories peak at different times. Lengths come from the adaserve-mix profile's tasks;
slo_ratio is each category's TPOT SLO divided by the baseline per-token latency that adaserve-trace.yaml
declares (10.5 ms): 1.2 for the coding copilot (Table 2), 4.7619 for chat (50 ms), 14.2857 for
summaries (150 ms).
Deterministic: the same file every run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from core.profile import load_profile
from core.workload import resolve_tasks

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "adaserve-example.jsonl"
BASELINE_TPOT_S = 0.0105
DURATION_S = 100.0
MEAN_RATE_RPS = 3.0
PERIOD_S = 50.0  # one rise and fall per category every 50 s
SWING = 0.8  # the rate moves between 20% and 180% of its mean
SEED = 2025


def main() -> None:
    rng = np.random.default_rng(SEED)
    tasks = resolve_tasks(load_profile(HERE.parent / "adaserve-mix.yaml"))
    rows = []
    for index, task in enumerate(tasks):
        mean_rate = MEAN_RATE_RPS * task.share
        phase = 2 * math.pi * index / len(tasks)
        # Thinning: a Poisson process at the peak rate, each arrival kept with probability rate(t)/peak.
        peak = mean_rate * (1 + SWING)
        candidates = np.sort(rng.uniform(0, DURATION_S, rng.poisson(peak * DURATION_S)))
        rate = mean_rate * (1 + SWING * np.sin(2 * math.pi * candidates / PERIOD_S + phase))
        times = candidates[rng.uniform(0, peak, len(candidates)) < rate]
        prompts = task.prompt.sample(rng, len(times))
        outputs = task.output.sample(rng, len(times))
        assert task.slo.tpot_s is not None
        ratio = round(task.slo.tpot_s / BASELINE_TPOT_S, 4)
        for time_s, prompt, output in zip(times.tolist(), prompts.tolist(), outputs.tolist(), strict=True):
            rows.append(
                {
                    "emission_time_ms": round(time_s * 1000, 1),
                    "input_length": prompt,
                    "output_length": output,
                    "slo_ratio": ratio,
                    "task": task.name,
                }
            )
    rows.sort(key=lambda row: row["emission_time_ms"])
    OUTPUT.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} rows to {OUTPUT}")


if __name__ == "__main__":
    main()
