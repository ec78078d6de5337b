"""Profile sections of the tuner and of each scheduling mode (AdaServe, SABER, SLOs-Serve)."""

# No `from __future__ import annotations` in the model modules: see core/profile/strict.py.
from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from core.profile.strict import Strict


class TunerSpec(Strict):
    """SLO-Tuner settings (paper 000 sec. II-B; the defaults are the paper's values). Used by `--job tune`.

    Score (eq. 3): goodput - violation_weight * max(0, p99 - SLO) - hw_cost, with violation_weight = lambda
    live and sim_violation_factor * lambda on the simulator; hw_cost (eq. 2) = the weights below times
    concurrency, max_num_seqs and the effective speculative width. Neighbours: each numeric knob moved by
    its step within its bounds (clamped), plus the speculation toggle.
    """

    # guided: sweep the calibrated simulator, verify its picks, climb on measurements (core/tune/guided.py;
    # the default, as it wins benchmarks/tuner_vs_grid.py); hillclimb = the paper's Algorithm 1.
    algorithm: Literal["guided", "hillclimb", "halving", "simrank"] = "guided"
    steps: Annotated[int, Field(ge=1)] = 8  # T, the step budget of the hill-climb
    # Segment budget (final re-measurement included) for guided, halving, simrank and guided live segments;
    # None: 16 for guided, else what the paper's hill-climb would spend without reusing measurements
    # (steps x 8 + 1).
    segment_budget: Annotated[int, Field(ge=2)] | None = None
    slo_penalty: Annotated[float, Field(ge=0)] = 5.0  # lambda
    min_gain: Annotated[float, Field(ge=0)] = 0.02  # delta
    concurrency_bounds: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = (2, 16)
    concurrency_step: Annotated[int, Field(ge=1)] = 2
    max_num_seqs_bounds: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = (4, 16)
    max_num_seqs_step: Annotated[int, Field(ge=1)] = 3
    spec_width_bounds: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=0, le=64)]] = (0, 16)
    spec_width_step: Annotated[int, Field(ge=1)] = 4
    spec_toggle: bool = True
    # The online tuner with launched servers (`gateway --tune --launch`, issue 23) halves and doubles the
    # server's max_num_batched_tokens within these bounds by replica swap; None keeps the profile's value (the
    # default: each move restarts a vLLM, and the batch tuner does not move it either).
    max_num_batched_tokens_bounds: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = None
    hw_weight_concurrency: Annotated[float, Field(ge=0)] = 0.01
    hw_weight_max_num_seqs: Annotated[float, Field(ge=0)] = 0.01
    hw_weight_spec_width: Annotated[float, Field(ge=0)] = 0.02
    # Live segments: warm-up discarded, then the measurement window (server start-up comes on top).
    warmup_s: Annotated[float, Field(ge=0)] = 10.0
    measure_s: Annotated[float, Field(gt=0)] = 30.0
    # Simulator variant: a segment runs until both minimums are reached; EMA of the current point's p99
    # (beta weighs the newest value; the paper gives no value); violation term weighted factor x lambda.
    sim_min_duration_s: Annotated[float, Field(gt=0)] = 90.0
    sim_min_requests: Annotated[int, Field(ge=1)] = 1500
    sim_ema_beta: Annotated[float, Field(gt=0, le=1)] = 0.5
    sim_violation_factor: Annotated[float, Field(ge=0)] = 10.0
    # Measure a configuration again when the search revisits it (the paper re-runs the current point at
    # every step); off: a configuration is measured once per run and its result reused.
    remeasure: bool = False
    # Simulator-guided: search on the calibrated simulator, then verify only the top `guided_verify`
    # configurations live (plus the baseline and the final re-measurement).
    guided: bool = False
    guided_verify: Annotated[int, Field(ge=1)] = 3
    # Verify first the configurations whose simulated p99 (guided: scaled by the error measured so far) is
    # within this share of the SLO (1.0: any that meets it). Below 1 when the simulator is known to
    # under-state this machine's tail latency.
    guided_headroom: Annotated[float, Field(gt=0, le=1)] = 1.0
    # Then, while the segment budget lasts, climb live from the best verified point over simulator-ranked
    # moves (simrank): a simulator that is wrong about this machine is corrected by measurement.
    guided_refine: bool = True
    # simrank: how many simulator-ranked neighbours are measured per step.
    simrank_top: Annotated[int, Field(ge=1)] = 2

    @model_validator(mode="after")
    def _ordered_bounds(self) -> Self:
        for name in ("concurrency_bounds", "max_num_seqs_bounds", "spec_width_bounds", "max_num_batched_tokens_bounds"):
            if getattr(self, name) is None:
                continue
            low, high = getattr(self, name)
            if low > high:
                raise ValueError(f"{name}: lower bound {low} is above upper bound {high}")
        return self


class AdaServeSpec(Strict):
    """AdaServe mode (paper 002; core/control/adaserve/). Used when `mode: adaserve` and by its benchmark.

    Each engine step, every decoding request gets a token tree sized to its TPOT SLO, chosen from a beam
    search of depth d and width w (eqs. 8-9 set both from the number of decoding requests), within a
    verification budget; the simulator's token-level model supplies drafts and the true acceptance.
    """

    # B: tokens verified per step, roots included. None: the calibration's roofline knee, the most tokens a
    # step verifies before the compute term overtakes the weight-streaming term (the paper profiles its GPU).
    budget: Annotated[int, Field(ge=1)] | None = None
    n_max: Annotated[int, Field(ge=1)] = 8  # most draft tokens one request takes in the SLO-customized phase
    # Eq. 8: d = clip(floor(B1 / (n + c1)) - 1, D_min, D_max), B1 = the verification budget.
    # Eq. 9: w = clip(floor(B2 / n) + c2, 1, W_max), B2 = the draft model's tokens per pass.
    # The paper picks these by grid search; these defaults come from one on adaserve-mix at 12 RPS with seed 1
    # (benchmarks/adaserve_vs_static.py reports seed 0): each draft pass costs a step ~15% on the shipped A100
    # calibration, so shallow, wide trees beat deep ones there.
    depth_bounds: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] = (1, 3)
    c1: Annotated[float, Field(ge=0)] = 1.0
    draft_budget: Annotated[int, Field(ge=1)] = 128
    max_width: Annotated[int, Field(ge=1, le=16)] = 8
    c2: int = 0
    # Draft model (speculation.py): per-step spread of the text's local acceptance around the request's
    # rate (Beta concentration; larger = steadier), and how far the draft's estimate of it is off: logit
    # noise (mismatch, 0 = a perfect drafter) and a logit bias (overconfidence > 0: the draft expects more).
    step_concentration: Annotated[float, Field(gt=0)] = 20.0
    mismatch: Annotated[float, Field(ge=0)] = 0.5
    overconfidence: float = 0.0
    # Algorithm 2's SLO-customized phase; false leaves only the throughput-optimized selection (an
    # ablation, as the paper's Fig. 16, which the benchmark reports).
    slo_selection: bool = True
    # Speculation that cannot pay costs nothing (issue 21): a step that carries a prompt chunk verifies only
    # the draft tokens that are free beside it (core/control/adaserve/scheduler.py, TreeScheduler.budget), and
    # a step drafts nothing unless some decoding request would miss its TPOT SLO at one token per step
    # (policy.py, TreePlanner.plan). False: both ignored, the behaviour before (an ablation).
    must_pay: bool = True
    # Live (--backend vllm): add eq. 8 as vLLM's batch-size speculation schedule to --speculative-config
    # (num_speculative_tokens_per_batch_size); turn off for a vLLM that does not have that key.
    live_schedule: bool = True

    @model_validator(mode="after")
    def _ordered_depths(self) -> Self:
        if self.depth_bounds[0] > self.depth_bounds[1]:
            raise ValueError(f"depth_bounds: D_min {self.depth_bounds[0]} is above D_max {self.depth_bounds[1]}")
        return self


class SaberSpec(Strict):
    """SABER settings (paper 001; core/control/saber/policy.py). Used by `--mode saber` and `--job compare`."""

    # Admission samples a window of this many requests at the high tier's head (sec. IV-C step 2); the paper
    # gives no value; 4 is ours.
    window_size: Annotated[int, Field(ge=1)] = 4
    # The estimation function f(L) (sec. IV-B): the paper's choice is USL; linear and logistic are the
    # alternatives of its sec. VII.
    speed_model: Literal["usl", "linear", "logistic"] = "usl"
    # Offline profiling: the concurrency levels of the closed-loop runs (about 1,000 points in all).
    profile_loads: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=2)] = Field(
        default_factory=lambda: [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 100]
    )
    # Low tier, best-effort: a replica takes a low-tier request only below this load (None: no cap beyond
    # protecting the admitted requests' recorded speeds; see SaberPolicy._release_low).
    best_effort_max_load: Annotated[int, Field(ge=1)] | None = None
    # Protect what running requests still need, estimated from f(L) since admission, instead of the speed
    # recorded at admission (see SaberPolicy._refreshed_floor; false is the paper's literal check).
    track_progress: bool = False
    # When a queued request counts as infeasible (demoted to the low tier): "fastest", the paper's rule, once
    # its required speed exceeds f(1); "offered-load" (ours), once it exceeds f(L*), L* the concurrency the
    # recent arrivals need (see SaberPolicy._feasible_speed).
    feasibility: Literal["fastest", "offered-load"] = "fastest"
    # Scale f(L) in the admission checks by observed / predicted speed of recent admitted requests (ours,
    # beyond the paper; see core/control/saber/speed_drift.py): for live servers whose speed drifts from the profile.
    drift_correction: bool = False
    # With drift_correction: scale by this quantile of the last 30 ratios instead of their mean (None), so a
    # request admitted at the edge of its SLA gets the speed it needs with probability about 1 - q on an
    # engine whose speed is noisy from request to request (see core/control/saber/speed_drift.py).
    drift_quantile: Annotated[float, Field(gt=0, lt=1)] | None = None
    # Ablation (not the paper): false drops Algorithm 1's second check (line 10: f(L+1) must still meet the
    # speed recorded for every running request), so a benchmark can measure what that check costs.
    protect_running: bool = True
    # `--job compare`'s fcfs-best-static baseline: fcfs at each of these max_num_seqs, the best one kept
    # (the paper sweeps static caps 10-100 in steps of 10, sec. III-B).
    static_caps: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)] = Field(
        default_factory=lambda: list(range(10, 101, 10))
    )


class SlosServeSpec(Strict):
    """SLOs-Serve settings (paper 004), used by `mode: slos-serve` (core/control/slos_serve).

    The scheduler runs the admission DP when the oldest waiting arrival has waited `schedule_window_s` or
    `schedule_batch` arrivals wait (Algorithm 1's timeout and threshold). A request no replica can attain
    after `routing_limit` replicas (sec. 4.2; None: every replica) goes to the best-effort tier (sec. 4.1),
    retried every `best_effort_retry_s` and on every completion. With `best_effort: false` (or a zero
    window) each arrival is decided on its own when it arrives, and one that cannot be attained is rejected.
    """

    schedule_window_s: Annotated[float, Field(ge=0)] = 0.01
    schedule_batch: Annotated[int, Field(ge=1)] = 16
    routing_limit: Annotated[int, Field(ge=1)] | None = None
    best_effort: bool = True
    best_effort_retry_s: Annotated[float, Field(gt=0)] = 0.05
    # Upper bound of the SLO-adaptive speculation length (sec. 3.2.3); None: the knobs' spec_width when
    # speculation is on (a draft model is deployed), else 0.
    max_spec_len: Annotated[int, Field(ge=0, le=16)] | None = None
    # Largest batch the planner forms (tokens); None: knobs.max_num_batched_tokens.
    max_batch_tokens: Annotated[int, Field(ge=1)] | None = None
    # Algorithm 2's batch formation and the adaptive speculation inside the simulated engine; false:
    # admission control only, in front of vLLM's own batching (what a live deployment gets).
    batch_formation: bool = True
    # Batch size: None = as large as the tightest TPOT allows (Algorithm 2 as published); a share (0.95) =
    # the smallest batch with that share of the largest one's token throughput (the roofline's knee): past
    # it a larger batch adds little throughput but slows every decode, so requests hold their KV longer.
    knee_efficiency: Annotated[float, Field(gt=0, le=1)] | None = 0.95
    # SLOs assumed for requests that carry none of their own.
    default_ttft_s: Annotated[float, Field(gt=0)] = 1.0
    default_tpot_s: Annotated[float, Field(gt=0)] = 0.1
