"""A seeded, production-like request trace, for tests, benchmarks and the "your own traffic" walkthrough.

Recorded LLM serving traffic differs from the textbook Poisson load in three ways, and this generator has all
three so that a job that works on it works on an operator's own recording:
- bursty arrivals: gamma inter-arrival times with a coefficient of variation (CV) of 3-13, where Poisson
  has 1 (production traces such as Azure's LLM inference traces and BurstGPT show CVs in that range);
- heavy-tailed lengths: lognormal prompt and output lengths per request class, with a long-context class
  whose prompts regularly exceed 8k tokens;
- per-request SLOs: each request carries its own end-to-end objective, the class's time-to-first-token
  budget plus a per-output-token budget times its own output length (what a client that streams at a
  reader's pace needs), rounded to 10 ms.

The CSV it writes uses columns the trace loader reads (core/workload/trace.py): `timestamp_s`,
`input_tokens`, `output_tokens`, `task`, `slo_e2e_s`. The command that writes it is
profiles/traces/make_operator_trace.py.
"""

from __future__ import annotations

import gzip
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CSV_HEADER = ("timestamp_s", "input_tokens", "output_tokens", "task", "slo_e2e_s")
# With `stage_slos`: the two budgets the e2e SLO is made of, as per-stage SLOs (what SLOs-Serve plans for).
STAGE_CSV_HEADER = ("timestamp_s", "input_tokens", "output_tokens", "task", "slo_ttft_s", "slo_tpot_s")
CV_RANGE = (3.0, 13.0)  # inter-arrival CVs seen in production LLM traces; the generator refuses others


@dataclass(frozen=True, slots=True)
class RequestClass:
    """One kind of request in the traffic: its share, length distributions and SLO budgets."""

    name: str
    share: float
    prompt_mean: float  # arithmetic mean of the lognormal, tokens
    prompt_sigma: float  # std of the underlying normal
    prompt_max: int
    output_mean: float
    output_sigma: float
    output_max: int
    ttft_budget_s: float
    per_token_budget_s: float


# A self-hosted assistant's mix. Lengths stay within a 32k context (prompt_max + output_max <= 28k).
DEFAULT_CLASSES: tuple[RequestClass, ...] = (
    RequestClass("chat", 0.55, 700, 1.0, 16_000, 260, 0.8, 2_048, 2.0, 0.06),
    RequestClass("long-context", 0.20, 7_000, 0.55, 24_000, 220, 0.7, 2_048, 6.0, 0.06),
    RequestClass("code", 0.25, 1_600, 0.8, 16_000, 140, 0.9, 4_096, 1.5, 0.04),
)


@dataclass(frozen=True, slots=True)
class GeneratedTrace:
    """Columns of the generated trace, row i is request i, in arrival order."""

    timestamp_s: np.ndarray  # float64, non-decreasing, from 0
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    task: list[str]
    slo_e2e_s: np.ndarray  # float64
    slo_ttft_s: np.ndarray  # float64: the class's TTFT budget (the e2e SLO is this + slo_tpot_s x output)
    slo_tpot_s: np.ndarray  # float64: the class's per-output-token budget

    def __len__(self) -> int:
        return len(self.timestamp_s)

    def interarrival_cv(self) -> float:
        gaps = np.diff(self.timestamp_s)
        return float(gaps.std() / gaps.mean())

    def to_csv(self, *, stage_slos: bool = False) -> str:
        """The trace as CSV; `stage_slos`: a TTFT and a TPOT SLO per row instead of the e2e one."""
        out = io.StringIO()
        out.write(",".join(STAGE_CSV_HEADER if stage_slos else CSV_HEADER) + "\n")
        rows = zip(
            self.timestamp_s.tolist(),
            self.input_tokens.tolist(),
            self.output_tokens.tolist(),
            self.task,
            self.slo_e2e_s.tolist(),
            self.slo_ttft_s.tolist(),
            self.slo_tpot_s.tolist(),
            strict=True,
        )
        for t, p, o, k, e2e, ttft, tpot in rows:
            slo = f"{ttft:g},{tpot:g}" if stage_slos else f"{e2e:.2f}"
            out.write(f"{t:.3f},{p},{o},{k},{slo}\n")
        return out.getvalue()

    def write(self, path: Path, *, stage_slos: bool = False) -> None:
        """CSV, gzip-compressed when the name ends in .gz (with a zero timestamp: the same bytes every run)."""
        data = self.to_csv(stage_slos=stage_slos).encode()
        if path.name.endswith(".gz"):
            data = gzip.compress(data, compresslevel=9, mtime=0)
        path.write_bytes(data)


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, high: int, n: int) -> np.ndarray:
    # mu such that the arithmetic mean is `mean` before clipping: E = exp(mu + sigma^2 / 2).
    mu = np.log(mean) - sigma**2 / 2
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), 1, high).astype(np.int64)


def generate_operator_trace(
    rows: int = 2000,
    *,
    rate_rps: float = 1.0,
    cv: float = 4.0,
    seed: int = 0,
    classes: tuple[RequestClass, ...] = DEFAULT_CLASSES,
) -> GeneratedTrace:
    """`rows` requests at a mean of `rate_rps`, gamma inter-arrivals with coefficient of variation `cv`.

    Gamma with shape k has CV 1/sqrt(k), so k = 1/cv^2, and scale 1/(rate * k) keeps the mean gap 1/rate
    (the `gamma` arrival of profiles, with burstiness k). Independent streams for arrivals, classes and each
    class's lengths, spawned from one seed: same arguments, same trace.
    """
    if rows < 2:
        raise ValueError(f"rows must be at least 2 (got {rows})")
    if rate_rps <= 0:
        raise ValueError(f"rate_rps must be > 0 (got {rate_rps})")
    if not CV_RANGE[0] <= cv <= CV_RANGE[1]:
        raise ValueError(f"cv must be within {CV_RANGE[0]:g}-{CV_RANGE[1]:g}, production's range (got {cv})")
    arrival_rng, class_rng, *length_rngs = np.random.default_rng(seed).spawn(2 + 2 * len(classes))
    shape = 1.0 / cv**2
    gaps = arrival_rng.gamma(shape, 1.0 / (rate_rps * shape), rows - 1)
    # Rounded to the millisecond the CSV keeps, so the file's CV is the one reported here.
    timestamp = np.round(np.concatenate([[0.0], np.cumsum(gaps)]), 3)
    shares = np.array([c.share for c in classes])
    chosen = class_rng.choice(len(classes), size=rows, p=shares / shares.sum())
    prompts = np.empty(rows, dtype=np.int64)
    outputs = np.empty(rows, dtype=np.int64)
    slo = np.empty(rows, dtype=float)
    ttft = np.empty(rows, dtype=float)
    tpot = np.empty(rows, dtype=float)
    for k, c in enumerate(classes):
        mask = chosen == k
        n = int(mask.sum())
        prompts[mask] = _lognormal(length_rngs[2 * k], c.prompt_mean, c.prompt_sigma, c.prompt_max, n)
        outputs[mask] = _lognormal(length_rngs[2 * k + 1], c.output_mean, c.output_sigma, c.output_max, n)
        slo[mask] = np.round(c.ttft_budget_s + c.per_token_budget_s * outputs[mask], 2)
        ttft[mask] = c.ttft_budget_s
        tpot[mask] = c.per_token_budget_s
    return GeneratedTrace(
        timestamp_s=timestamp,
        input_tokens=prompts,
        output_tokens=outputs,
        task=[classes[k].name for k in chosen.tolist()],
        slo_e2e_s=slo,
        slo_ttft_s=ttft,
        slo_tpot_s=tpot,
    )
