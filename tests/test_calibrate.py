"""Calibration without a server: the fit recovers known parameters from synthetic steps, a sweep of the
simulator recovers the simulator's own calibration, and the written YAML loads as a `Calibration`."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import numpy as np
import pytest

from console.batch import run_batch
from core.calibrate.fit import (
    FitError,
    StepObservation,
    acceptance_from_length,
    build_calibration,
    fit_step_model,
    read_calibration,
    robust_cv,
    write_calibration,
)
from core.calibrate.job import CALIBRATION_FILE, run_calibrate
from core.calibrate.step_observations import decode_step_samples
from core.calibrate.sweep_points import SweepSettings
from core.calibrate.sweep_targets import SimTarget, cache_facts_from_metrics, kv_tokens_from_log
from core.exit_codes import ExitCode
from core.jobs.options import OperatorOptions
from core.profile import Calibration, PerfTerm, load_calibration, load_profile
from core.records import RequestRecord, RequestSLO
from core.step_time import expected_accepted_tokens

DATA = Path(__file__).parent / "data"
COEFFICIENTS = ("base_s", "per_token_s", "per_ctx_token_s", "per_spec_step_s", "per_seq_s")

# A CPU-like engine: one sum of costs (nothing overlaps), plus a per-request latency seen in TTFT.
TRUE_TERM = PerfTerm(
    name="true", base_s=0.003, per_token_s=2e-5, per_ctx_token_s=2e-7, per_spec_step_s=0.002, per_seq_s=4e-4
)
TRUE_OVERHEAD_S = 0.02


def step(term: PerfTerm, tokens: float, ctx: float, spec: float, seqs: float) -> float:
    return (
        term.base_s
        + term.per_token_s * tokens
        + term.per_ctx_token_s * ctx
        + term.per_spec_step_s * spec
        + term.per_seq_s * seqs
    )


def synthetic_observations(noise: float = 0.02, seed: int = 1) -> list[StepObservation]:
    """The sweep's design: decode at batches 1-16, short and long context, with and without width-4
    speculation; prefill at concurrency 1 for five prompt lengths."""
    rng = np.random.default_rng(seed)
    observations = []
    for batch in (1, 2, 4, 8, 16):
        for prompt in (32, 512):
            ctx = batch * (prompt + 32)
            for width in (0, 4):
                tokens = batch * (width + 1)
                true = step(TRUE_TERM, tokens, ctx, width, batch)
                observations.append(
                    StepObservation(true * rng.lognormal(0, noise), tokens, ctx, width, batch, label=f"b{batch}")
                )
    for prompt in (16, 128, 256, 512, 768):
        true = TRUE_OVERHEAD_S + step(TRUE_TERM, prompt, prompt + 16, 0, 1)
        observations.append(
            StepObservation(true * rng.lognormal(0, noise), prompt, prompt + 16, kind="prefill", with_overhead=True)
        )
    return observations


def test_one_term_fit_recovers_known_parameters() -> None:
    fit = fit_step_model(synthetic_observations(), terms="auto")
    assert len(fit.terms) == 1, fit.alternatives  # the sum-of-costs data is not explained better by a max
    term = fit.terms[0]
    for name in COEFFICIENTS:
        assert getattr(term, name) == pytest.approx(getattr(TRUE_TERM, name), rel=0.15), name
    assert fit.request_overhead_s == pytest.approx(TRUE_OVERHEAD_S, rel=0.1)
    assert fit.rms_relative_error < 0.04


def test_exact_data_is_fitted_exactly() -> None:
    fit = fit_step_model(synthetic_observations(noise=0.0), terms=1)
    for name in COEFFICIENTS:
        assert getattr(fit.terms[0], name) == pytest.approx(getattr(TRUE_TERM, name), rel=1e-4), name
    assert fit.max_relative_error < 1e-6


def test_two_term_roofline_fit_finds_both_bottlenecks() -> None:
    """Data from a max of a memory term and a compute term (an accelerator): the fit keeps two terms."""
    memory = PerfTerm(name="memory", base_s=0.005, per_ctx_token_s=1e-7, per_seq_s=3e-4)
    compute = PerfTerm(name="compute", base_s=0.001, per_token_s=1e-3)
    rng = np.random.default_rng(3)
    observations = []
    for batch in (1, 2, 4, 8, 16, 32):
        for width in (0, 2, 4):
            tokens, ctx = batch * (width + 1), batch * 200
            true = max(step(memory, tokens, ctx, width, batch), step(compute, tokens, ctx, width, batch))
            observations.append(StepObservation(true * rng.lognormal(0, 0.02), tokens, ctx, width, batch))
    fit = fit_step_model(observations, terms="auto")
    assert len(fit.terms) == 2, fit.alternatives
    fitted_memory, fitted_compute = fit.terms
    assert fitted_memory.base_s == pytest.approx(0.005, rel=0.1)
    assert fitted_memory.per_seq_s == pytest.approx(3e-4, rel=0.2)
    assert fitted_compute.per_token_s == pytest.approx(1e-3, rel=0.1)
    assert fit.rms_relative_error < 0.04 < fit.alternatives["one term"]


def test_fit_refuses_what_cannot_determine_the_model() -> None:
    with pytest.raises(FitError, match="at least 3"):
        fit_step_model([StepObservation(0.01, 1, 10)])
    with pytest.raises(FitError, match="positive"):
        fit_step_model([StepObservation(0.01, 1, 10), StepObservation(0.0, 2, 10), StepObservation(0.01, 3, 10)])


@pytest.mark.parametrize("acceptance", [0.0, 0.2, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("width", [1, 4, 8])
def test_acceptance_from_mean_acceptance_length_inverts_the_simulator(acceptance: float, width: int) -> None:
    length = expected_accepted_tokens(acceptance, width)
    assert acceptance_from_length(length, width) == pytest.approx(acceptance, abs=1e-6)


def test_acceptance_is_clamped() -> None:
    assert acceptance_from_length(0.9, 4) == 0.0
    assert acceptance_from_length(5.0, 4) == 0.99


def test_robust_cv_ignores_rare_stalls() -> None:
    rng = np.random.default_rng(0)
    steps = rng.normal(0.01, 0.0005, 2000)
    steps[::50] = 0.2  # a shared CPU: 2% of steps stall
    assert robust_cv(steps) == pytest.approx(0.05, rel=0.15)


def record(rid: int, times: list[float], prompt: int = 20, warmup: bool = False) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        task="t",
        slo=RequestSLO(),
        prompt_tokens=prompt,
        max_tokens=len(times),
        scheduled_s=times[0] - 0.01,
        arrival_s=times[0] - 0.01,
        end_s=times[-1],
        output_tokens=len(times),
        chunk_times=np.array(times),
        warmup=warmup,
    )


def test_decode_samples_reconstruct_batch_context_and_mixed_steps() -> None:
    # Request 1 decodes alone for two steps, then request 2 joins (its first token at t=0.3 ends a mixed
    # step); both decode together; request 2 is a warm-up request: counted in batches, not sampled.
    first = record(1, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    second = record(2, [0.3, 0.4, 0.5, 0.6, 0.7], warmup=True)
    samples = decode_step_samples([first, second], block_size=16)
    assert len(samples.step_s) == 5  # request 1's five gaps only
    np.testing.assert_allclose(samples.step_s, 0.1)
    assert samples.batch.tolist() == [1, 1, 2, 2, 2]
    assert samples.mixed.tolist() == [False, True, False, False, False]
    # Context: 32 reserved per request (20 + 1 rounded to 16) plus tokens so far minus the first.
    assert samples.context_tokens.tolist() == [32, 33, 32 + 2 + 32 + 0, 32 + 3 + 32 + 1, 32 + 4 + 32 + 2]


def test_server_facts_from_vllm_metrics_and_log() -> None:
    tokens, block = cache_facts_from_metrics((DATA / "vllm_metrics.txt").read_text())
    assert (tokens, block) == (1048576, 128)
    assert cache_facts_from_metrics("vllm:num_requests_running 1.0\n") == (None, None)
    log = ["INFO 01-01 kv_cache_utils.py:1 GPU KV cache size: 1,048,576 tokens", "INFO ready"]
    assert kv_tokens_from_log(log) == 1048576
    assert kv_tokens_from_log(["nothing"]) is None


def known_calibration() -> Calibration:
    return Calibration(
        name="known",
        model="m",
        hardware="h",
        terms=[TRUE_TERM],
        kv_capacity_tokens=200000,
        block_size=16,
        noise_cv=0.03,
        default_acceptance=0.3,
        max_model_len=2048,
    )


def test_a_sweep_of_the_simulator_recovers_its_calibration(tmp_path: Path) -> None:
    """The whole job against the simulator with a known calibration: the same quantities the simulator
    charges are the ones the sweep measures, so the fit must give them back."""
    profile = load_profile("profiles/vllm-cpu-tiny.yaml")
    events: list[dict] = []
    result = asyncio.run(
        run_calibrate(
            profile, backend_kind="sim", sink=events.append, out_dir=tmp_path, target=SimTarget(known_calibration())
        )
    )
    assert result.calibration is not None and result.fit is not None
    fitted = result.calibration.terms[0]
    for name in COEFFICIENTS:
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE_TERM, name), rel=0.1), name
    assert result.fit.request_overhead_s < 0.001  # the simulator has no latency outside its steps
    assert result.calibration.noise_cv == pytest.approx(0.03, abs=0.01)
    # Per-request acceptance is drawn from a Beta around 0.3; the mean acceptance length maps back near it.
    assert result.calibration.default_acceptance == pytest.approx(0.3, abs=0.06)
    assert (result.calibration.kv_capacity_tokens, result.calibration.block_size) == (200000, 16)
    assert events[0]["event"] == "start" and events[-1]["event"] == "calibrate_summary"
    assert sum(e["event"] == "calibrate_point" for e in events) == len(result.sweep.points)
    assert read_calibration(tmp_path / CALIBRATION_FILE) == result.calibration
    assert (tmp_path / "sweep.json").exists()


def test_calibration_yaml_round_trip_and_use_in_a_profile(tmp_path: Path) -> None:
    fit = fit_step_model(synthetic_observations(), terms=1)
    calibration = build_calibration(
        fit,
        name="round-trip",
        model="tiny",
        hardware="cpu",
        derivation="synthetic: a line that is long enough to be folded by the YAML writer " * 3,
        kv_capacity_tokens=1048576,
        block_size=128,
        noise_cv=0.08,
        default_acceptance=0.01,
        max_model_len=1024,
    )
    path = write_calibration(calibration, tmp_path / "calibrations" / "rt.yaml", header="measured\nby a test")
    text = path.read_text()
    assert text.startswith("# measured\n# by a test\n")
    assert read_calibration(path) == calibration
    profile_path = tmp_path / "p.yaml"
    profile_path.write_text(
        "name: p\nworkload:\n  arrival: {kind: closed, clients: 2}\n  requests: 20\n  tasks:\n"
        "    - {name: t, prompt_tokens: {dist: fixed, value: 32}, output_tokens: {dist: fixed, value: 16}}\n"
        "engine: {calibration: calibrations/rt.yaml}\n"
    )
    assert load_calibration(load_profile(profile_path)) == calibration


def test_batch_calibrate_refuses_the_simulator_and_reports_an_unreachable_server(tmp_path: Path) -> None:
    args = OperatorOptions(profile="profiles/vllm-cpu-tiny.yaml", job="calibrate", backend="sim", out=tmp_path)
    assert run_batch(args, stdout=io.StringIO()) == ExitCode.USAGE
    args = OperatorOptions(
        profile="profiles/vllm-cpu-tiny.yaml", job="calibrate", backend="url", url="http://127.0.0.1:9", out=tmp_path
    )
    assert run_batch(args, stdout=io.StringIO()) == ExitCode.BACKEND


def test_reduced_settings_stay_small() -> None:
    reduced = SweepSettings.reduced()
    assert reduced.spec_width == 0 and len(reduced.decode_concurrency) <= 3


def test_engine_counters_from_captured_vllm_metrics() -> None:
    """The engine-timed sums and counts the sweep reads (vLLM 0.32's /metrics, captured)."""
    from core.calibrate.engine_counters import EngineCounters

    counters = EngineCounters.parse((DATA / "vllm_metrics.txt").read_text())
    assert counters.count("itl") == 1165 and counters.count("iteration_tokens") == 528
    assert counters.mean("itl") == pytest.approx(14.558449675999327 / 1165)
    assert counters.mean("iteration_tokens") == pytest.approx(17440 / 528)
    assert counters.count("prefill_time") > 0 and counters.prompt_tokens > 0
    nothing = counters.since(counters)
    assert nothing.count("itl") == 0 and nothing.mean("itl") is None


def test_shipped_measured_calibration_loads_and_drives_the_simulator() -> None:
    """profiles/vllm-cpu-tiny-sim.yaml points at the calibration measured on the CPU vLLM."""
    from core.backends.sim import SimBackend, run_to_completion
    from core.workload import build_load_plan

    profile = load_profile("profiles/vllm-cpu-tiny-sim.yaml")
    calibration = load_calibration(profile)
    assert calibration == read_calibration(Path("profiles/calibrations/vllm-cpu-tiny.yaml"))
    assert calibration.block_size == 128 and calibration.max_model_len == 1024
    outcome = run_to_completion(SimBackend(calibration, profile.knobs), build_load_plan(profile, requests=50))
    assert sum(r.ok for r in outcome.records) == 50
