"""Write a production-like request trace: bursty gamma arrivals, heavy-tailed lengths, per-request SLOs.

    python profiles/traces/make_operator_trace.py                 # regenerate operator-example.csv.gz
    python profiles/traces/make_operator_trace.py --out my.csv --rows 5000 --rate 3 --cv 8 --seed 1
    python profiles/traces/make_operator_trace.py --out slos-serve-trace.csv.gz --rows 3000 --rate 4.5 \
        --cv 6 --seed 21 --stage-slos    # what profiles/slos-serve-trace.yaml replays

The generator is core/workload/operator_trace.py (its docstring says what is realistic about it and why).
Without arguments this writes the trace that profiles/operator-trace.yaml replays, byte for byte the same
file every run. The output is CSV (`timestamp_s,input_tokens,output_tokens,task,slo_e2e_s`), gzip-compressed
when the name ends in .gz; point a profile's `workload.trace` at it with `format: csv`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from core.workload.operator_trace import CV_RANGE, generate_operator_trace

HERE = Path(__file__).resolve().parent
# The shipped example: 2,000 requests at 2 req/s (about 17 minutes) with an inter-arrival CV of 4; at this
# rate vLLM's default scheduling on operator-trace.yaml's engine meets about 90% of the per-request SLOs.
DEFAULT_OUT = HERE / "operator-example.csv.gz"
DEFAULT_ROWS = 2000
DEFAULT_RATE_RPS = 2.0
DEFAULT_CV = 4.0
DEFAULT_SEED = 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="CSV path (.gz: gzip-compressed)")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="requests")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE_RPS, help="mean arrival rate, req/s")
    parser.add_argument(
        "--cv", type=float, default=DEFAULT_CV, help=f"inter-arrival CV, {CV_RANGE[0]:g}-{CV_RANGE[1]:g}"
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument(
        "--stage-slos",
        action="store_true",
        help="write each row's TTFT and TPOT SLOs (slo_ttft_s, slo_tpot_s) instead of its e2e SLO",
    )
    args = parser.parse_args(argv)
    try:
        trace = generate_operator_trace(args.rows, rate_rps=args.rate, cv=args.cv, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    trace.write(args.out, stage_slos=args.stage_slos)
    long_prompts = int(np.sum(trace.input_tokens > 8192))
    print(
        f"wrote {len(trace)} requests to {args.out} ({args.out.stat().st_size:,} bytes): "
        f"{trace.timestamp_s[-1]:.0f} s at {(len(trace) - 1) / trace.timestamp_s[-1]:.2f} req/s, "
        f"inter-arrival CV {trace.interarrival_cv():.2f}, {long_prompts} prompts over 8k tokens, "
        f"median SLO {np.median(trace.slo_e2e_s):.1f} s"
    )


if __name__ == "__main__":
    main()
