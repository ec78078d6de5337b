"""An engine in SABER's own regime: fitted to the paper's static-baseline figures, before any SABER run.

The paper gives no f(L) and no engine model, only Table I's task means and SLAs and what its static baseline
did. The shipped calibration (qwen2.5-coder-1.5b-l4) contradicts those figures: on W1 its best static cap's
mean completion/SLA is 0.78 at 1 RPS and 1.13 at 20 RPS where the paper has 0.58 and 3.0, and its attainment
at 1 RPS is 0.75-0.89 where the paper has near 100%. So the regime is inferred here from the paper's
static-baseline figures alone (ANCHORS: each with the section it is read from), by a procedure fixed before
SABER runs: a small parametric engine (`PaperEngine`: fixed step time, cost per running sequence per step,
lognormal spread of the task lengths) whose parameters minimise LOSS over a grid (FIT_GRID), with the static
baseline simulated exactly as benchmarks/saber_vs_static.py simulates it (best of caps 10-100 per workload
and rate). SABER is never run inside the fit and no SABER figure of the paper is a target; two targets
(W1 and W2 at 20 RPS) are the static goodput the paper states as SABER's goodput less its stated lead.

LOSS = the mean over the anchors of the squared log ratio simulated / paper (one-sided for the bounds the
paper states as "below" or "from ... onwards"), so every anchor counts by its relative error; sqrt(LOSS) is
the typical factor by which the fitted engine misses an anchor (0.1: about 10%).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from saber_static_baseline import StaticBest, best_static, with_engine, with_length_sigma

from core.profile import Profile, load_profile

Metric = Literal["ratio", "attainment"]  # best static cap's mean completion/SLA, or its SLO attainment
Bound = Literal["=", "<=", ">="]


@dataclass(frozen=True)
class Anchor:
    """One static-baseline figure of the paper: the best static cap's `metric` on `workload` at `rate`."""

    workload: str
    rate: float
    metric: Metric
    bound: Bound
    value: float
    source: str
    derived: bool = False  # the paper states SABER's goodput and its lead; this is the difference

    def error(self, simulated: float) -> float:
        """Squared log ratio simulated / paper; zero on the right side of a one-sided bound."""
        log_ratio = math.log(max(simulated, 0.01) / self.value)
        if (self.bound == "<=" and log_ratio <= 0) or (self.bound == ">=" and log_ratio >= 0):
            return 0.0
        return log_ratio * log_ratio


# Read from the paper (001, sec. V-C and VI-C with Fig. 5-6) before any SABER run of the fitted engine.
ANCHORS: tuple[Anchor, ...] = (
    Anchor("saber-w1", 1, "ratio", "=", 0.58, "VI-C, Fig. 6: W1 baseline completion/SLA rises from 0.58 at 1 RPS"),
    Anchor("saber-w1", 20, "ratio", "=", 3.0, "VI-C, Fig. 6: ... to 3 at 20 RPS"),
    Anchor("saber-w1", 6, "ratio", "<=", 1.0, "VI-C, Fig. 6: W1 baseline mean above the SLA from 7 RPS onwards"),
    Anchor("saber-w1", 7, "ratio", ">=", 1.0, "VI-C, Fig. 6: (same)"),
    Anchor("saber-w3", 15, "ratio", "=", 1.79, "VI-C, Fig. 6: W3 baseline ratio peaks at 1.79 at 15 RPS"),
    Anchor("saber-w2", 20, "ratio", "<=", 1.0, "VI-C, Fig. 6: W2 both well below the SLA threshold"),
    Anchor("saber-w3", 10, "attainment", "=", 0.56, "V-C, Fig. 3: W3 at 10 RPS, 56% for the best static"),
    Anchor(
        "saber-w2", 20, "attainment", "=", 0.56, "V-C: W2 at 20 RPS, SABER 63%, 7 points above the best static", True
    ),
    Anchor("saber-w1", 20, "attainment", "=", 0.28, "V-C: W1 SABER 36%, 8 points above the best static (20 RPS)", True),
    Anchor("saber-w1", 3, "attainment", ">=", 0.95, "VI-C, Fig. 5: below 4 RPS near 100% goodput (V-C: below 5)"),
    Anchor("saber-w2", 3, "attainment", ">=", 0.95, "VI-C, Fig. 5: (same)"),
    Anchor("saber-w3", 3, "attainment", ">=", 0.95, "VI-C, Fig. 5: (same)"),
)

# Static-baseline figures kept out of the loss, printed beside the frozen engine's sweep as a held-out check:
# the best cap per workload and rate (sec. V-C's CDF comparison; Fig. 1's blue boxes, sec. III-C) and the CV of
# the per-rate mean completion/SLA across rates (sec. VI-C; W2's 17.5% / 20.8% does not say which is which).
HELD_OUT_CAPS: dict[tuple[str, float], int] = {
    ("saber-w1", 5.0): 50,
    ("saber-w2", 20.0): 100,
    ("saber-w3", 10.0): 80,
    ("saber-w3", 5.0): 100,
}
HELD_OUT_CV: dict[str, str] = {"saber-w1": "0.524", "saber-w2": "0.175 or 0.208", "saber-w3": "0.364"}


@dataclass(frozen=True, order=True)
class PaperEngine:
    """A hypothetical single-accelerator engine: the shipped calibration's step-time model with its fixed
    step time set to `base_s`, `per_seq_s` seconds added per running sequence per step (so per-request
    speed falls with concurrency as steeply as the paper's figures need), and every task's prompt and output
    lengths drawn lognormal with spread `length_sigma` around Table I's means."""

    base_s: float
    per_seq_s: float
    length_sigma: float

    def apply(self, profile: Profile) -> Profile:
        return with_length_sigma(with_engine(profile, self.per_seq_s, self.base_s), self.length_sigma)

    def describe(self) -> str:
        return (
            f"fixed step {self.base_s * 1e3:g} ms, +{self.per_seq_s * 1e3:g} ms per running sequence per step, "
            f"length sigma {self.length_sigma:g}"
        )

    def cli(self) -> str:
        return f"--base-s {self.base_s:g} --per-seq-s {self.per_seq_s:g} --length-sigma {self.length_sigma:g}"


# The grid, fixed before any SABER run (set from static runs only): fixed step time (f(1) about 1 / base),
# per-sequence cost, length spread.
FIT_GRID: tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]] = (
    (0.006, 0.008, 0.010, 0.012, 0.014),
    (0.0001, 0.0002, 0.00035, 0.0005),
    (0.1, 0.25, 0.5),
)
# The loss below which the fitted engine counts as in the paper's regime: an RMS log error of 0.32, the anchors
# met within about 37% on average (the shipped engine's loss is 0.18). Fixed with the anchors, before any SABER run.
FIT_LOSS_BOUND = 0.1
FIT_REQUESTS = 100  # the paper's 100 requests per run (sec. III-B)
FIT_SEEDS = 3  # and its three repetitions


def grid(axes: Sequence[Sequence[float]] = FIT_GRID) -> list[PaperEngine]:
    return [PaperEngine(*point) for point in itertools.product(*axes)]


@dataclass
class Fit:
    """The fitted engine, its loss, its simulated anchors and best caps, and every candidate's simulated anchors."""

    engine: PaperEngine
    loss: float
    simulated: dict[Anchor, float]
    caps: dict[tuple[str, float], int]
    tried: dict[PaperEngine, dict[Anchor, float]] = field(default_factory=dict)


async def static_at_anchors(
    engine: PaperEngine | None, requests: int, seeds: int
) -> dict[tuple[str, float], StaticBest]:
    """The best static cap at every (workload, rate) an anchor names, on `engine` (None: the profiles as shipped)."""
    points = sorted({(a.workload, a.rate) for a in ANCHORS})
    shipped = {name: load_profile(name) for name in {w for w, _ in points}}
    profiles = shipped if engine is None else {name: engine.apply(p) for name, p in shipped.items()}
    return {(w, rate): await best_static(profiles[w], rate, requests, seeds) for w, rate in points}


def anchor_values(static: dict[tuple[str, float], StaticBest]) -> dict[Anchor, float]:
    values = {}
    for anchor in ANCHORS:
        best = static[(anchor.workload, anchor.rate)]
        values[anchor] = best.mean_ratio if anchor.metric == "ratio" else best.attainment
    return values


def loss(values: dict[Anchor, float], anchors: Sequence[Anchor] = ANCHORS) -> float:
    return sum(anchor.error(values[anchor]) for anchor in anchors) / len(anchors)


# Is the choice carried by a few anchors? The fit's winner with some left out (printed, never used to choose).
LEAVE_OUTS: dict[str, tuple[Anchor, ...]] = {
    "the 2 derived": tuple(a for a in ANCHORS if not a.derived),
    "the 3 near-100% at 3 RPS": tuple(a for a in ANCHORS if a.bound != ">=" or a.metric != "attainment"),
    "both": tuple(a for a in ANCHORS if not a.derived and (a.bound != ">=" or a.metric != "attainment")),
}


async def fit(
    candidates: Iterable[PaperEngine] | None = None,
    requests: int = FIT_REQUESTS,
    seeds: int = FIT_SEEDS,
    verbose: bool = True,
) -> Fit:
    """The candidate whose simulated static baseline is nearest the paper's (least LOSS; the first on a tie)."""
    best: Fit | None = None
    tried: dict[PaperEngine, dict[Anchor, float]] = {}
    for engine in candidates if candidates is not None else grid():
        static = await static_at_anchors(engine, requests, seeds)
        values = anchor_values(static)
        this = loss(values)
        tried[engine] = values
        if verbose:
            print(f"  {engine.describe()}: loss {this:.4f}", flush=True)
        if best is None or this < best.loss:
            best = Fit(engine, this, values, {point: s.cap for point, s in static.items()})
    assert best is not None, "no candidate engine"
    best.tried = tried
    return best


def print_fit(result: Fit, requests: int, seeds: int, shipped: dict[Anchor, float]) -> None:
    """The fit, each anchor beside the shipped engine's value (`shipped`: the profiles' own calibration)."""
    print(
        f"fitted engine: {result.engine.describe()} ({result.engine.cli()}); loss {result.loss:.4f} "
        f"(RMS log error {math.sqrt(result.loss):.3f}) over {len(ANCHORS)} anchors, "
        f"{len(result.tried)} candidates, {requests} requests x {seeds} seeds per static run; "
        + ("within" if result.loss <= FIT_LOSS_BOUND else "NOT within")
        + f" the bound {FIT_LOSS_BOUND} for the paper's regime"
    )
    print(f"  the shipped engine's loss: {loss(shipped):.4f}")
    print(
        f"  {'workload':9} {'RPS':>4} {'metric':10} {'paper':>10} {'shipped':>7} {'fitted':>7} {'cap':>4} {'error':>7}"
        "  source"
    )
    for anchor, value in result.simulated.items():
        cap = result.caps[(anchor.workload, anchor.rate)]
        print(
            f"  {anchor.workload:9} {anchor.rate:4g} {anchor.metric:10} {anchor.bound:>2} {anchor.value:7.2f} "
            f"{shipped[anchor]:7.3f} {value:7.3f} {cap:4d} {anchor.error(value):7.4f}  {anchor.source}"
        )
    for name, anchors in LEAVE_OUTS.items():
        winner = min(result.tried, key=lambda engine: loss(result.tried[engine], anchors))
        print(f"  without {name}: {winner.describe()}, loss {loss(result.tried[winner], anchors):.4f}")
