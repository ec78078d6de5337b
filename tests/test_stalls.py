"""Stalls of a shared machine: found in clients' token streams, fitted, and replayed by the simulator."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from core.backend_api import LoadPlan
from core.backends.sim import SimBackend
from core.calibrate.job import run_calibrate
from core.calibrate.stalls import StallSample, fit_stalls, observe_stalls
from core.calibrate.sweep_targets import SimTarget
from core.metrics import percentiles
from core.profile import Calibration, KnobsSpec, PerfTerm, StallModel, load_profile
from core.records import RequestSpec
from tests.test_calibrate import record


def test_a_pause_of_every_stream_at_once_is_one_stall_and_think_time_is_none() -> None:
    step = 0.002
    # Two overlapping streams, 2 ms steps, both paused 200 ms from t=0.1.
    a = [i * step for i in range(100)]
    a = [t if t < 0.1 else t + 0.2 for t in a]
    b = [0.001 + t for t in a]
    # A third request after a 1 s pause in which nothing was in flight (client think time): not observed.
    c = [1.5 + i * step for i in range(20)]
    sample = observe_stalls([record(1, a), record(2, b), record(3, c)])
    assert sample.typical_step_s == pytest.approx(step)
    assert len(sample.durations_s) == 1
    assert sample.durations_s[0] == pytest.approx(0.2 - step + step / 2, abs=0.002)
    # Observed: from the first send (10 ms before its first token) to the two streams' end (0.399 s), plus the
    # third request's 0.048 s in flight; not the second of think time before it.
    assert sample.observed_s == pytest.approx(0.409 + 0.01 + 19 * step, abs=0.003)
    # Request 1 spans the stall; request 3 came after it.
    assert sample.stalled_within(0.0, 0.4) == pytest.approx(sample.durations_s[0])
    assert sample.stalled_within(1.5, 1.6) == 0.0
    assert sample.stalled_within(0.2, 0.25) == pytest.approx(0.05)


def test_whole_responses_written_at_once_after_a_silence_are_a_stall() -> None:
    """vLLM's API process on a starved CPU sometimes writes each response whole: first token = last token."""
    step = 0.002
    normal = [record(i, [0.01 + i * 0.003 + k * step for k in range(64)]) for i in range(4)]
    # Then four requests sent at 0.2 s that nobody hears of for 0.4 s, each arriving in one read.
    whole = [record(10 + i, [0.6 + i * 0.01] * 64) for i in range(4)]
    for held_back in whole:
        held_back.arrival_s = held_back.sent_s = 0.2
    sample = observe_stalls(normal + whole)
    assert sample.typical_step_s == pytest.approx(step)
    assert len(sample.durations_s) == 1
    # The engine made each response's 64 tokens in that time: the stall is the rest.
    assert sample.durations_s[0] == pytest.approx(0.4 - 64 * step, abs=0.001)
    assert sample.stalled_within(0.2, 0.63) == pytest.approx(0.4 - 64 * step, abs=0.001)


def test_a_response_held_back_and_written_whole_at_full_speed_is_no_stall() -> None:
    step = 0.002
    normal = [record(i, [0.01 + i * 0.003 + k * step for k in range(64)]) for i in range(2)]
    # Sent at 0.2 s, its 64 tokens written at once 64 steps later (+ a 7 ms first token): on time.
    held = record(10, [0.2 + 0.007 + 64 * step] * 64)
    held.arrival_s = held.sent_s = 0.2
    assert observe_stalls([*normal, held]).durations_s == []


def test_bursty_delivery_is_judged_against_the_engine_step_not_the_socket_gaps() -> None:
    """A starved API process writes each response in a few reads microseconds apart. The engine's step
    (from /metrics) is then the yardstick: a response that took its tokens' worth of engine steps is no stall,
    whatever the gaps between its reads."""
    engine_step = 0.0017
    # Closed loop, 4 clients from t = 0: every response written in two reads 0.2 ms apart, 64 engine steps
    # (plus a few ms of first token) after its send, the next send at once.
    records = []
    for client in range(4):
        sent = 0.0
        for turn in range(5):
            done = sent + 0.004 + 0.002 * client + 64 * engine_step
            r = record(10 * client + turn, [done] * 32 + [done + 0.0002] * 32)
            r.arrival_s = r.sent_s = sent
            records.append(r)
            sent = done
    assert observe_stalls(records).durations_s  # the socket gaps as the yardstick: nearly all of it "stalls"
    floored = observe_stalls(records, step_floor_s=engine_step)
    assert floored.typical_step_s == pytest.approx(engine_step)
    assert floored.durations_s == []

    # A real silence still counts: the same run with nothing heard by any client for 0.3 s from t = 0.25.
    def paused(t: float) -> float:
        return t + 0.3 if t > 0.25 else t

    for r in records:
        r.chunk_times = np.array([paused(t) for t in r.chunk_times])
        r.arrival_s = r.sent_s = paused(r.sent_s)
    held = observe_stalls(records, step_floor_s=engine_step)
    assert len(held.durations_s) == 1 and held.durations_s[0] == pytest.approx(0.3, abs=0.12)


def test_fit_needs_enough_stalls_and_gives_rate_per_observed_second() -> None:
    assert fit_stalls([StallSample(10.0, 0.002, [0.1, 0.2])]) is None
    model = fit_stalls([StallSample(10.0, 0.002, [0.1, 0.3]), StallSample(10.0, 0.002, [0.2])])
    assert model is not None
    assert model.rate_per_s == pytest.approx(3 / 20)
    assert model.mean_s == pytest.approx(0.2)
    assert model.cv == pytest.approx(np.std([0.1, 0.3, 0.2]) / 0.2)


def engine(stalls: StallModel | None) -> Calibration:
    return Calibration(
        name="cpu-like",
        model="m",
        hardware="h",
        terms=[PerfTerm(name="sum", base_s=0.002, per_token_s=1e-5, per_seq_s=2e-4)],
        kv_capacity_tokens=200000,
        block_size=16,
        noise_cv=0.05,
        max_model_len=2048,
        stalls=stalls,
    )


def closed_loop(clients: int, requests: int) -> LoadPlan:
    specs = (RequestSpec(request_id=i, prompt_tokens=32, output_tokens=64) for i in range(requests))
    return LoadPlan(requests=specs, mode="closed", concurrency=clients, max_requests=requests)


def e2e_percentiles(calibration: Calibration) -> dict[str, float]:
    outcome = asyncio.run(SimBackend(calibration, KnobsSpec(max_num_seqs=8), seed=3).run(closed_loop(8, 4000)))
    e2e = np.array([r.e2e_s for r in outcome.records if r.ok and r.e2e_s is not None])
    p50, p99 = percentiles(e2e, (50, 99))
    return {"p50": p50, "p99": p99}


def test_stalls_lift_the_tail_far_more_than_the_median() -> None:
    calm = e2e_percentiles(engine(None))
    # One 300 ms stall every 4 s of engine work: a few percent of requests are caught in one.
    stalled = e2e_percentiles(engine(StallModel(rate_per_s=0.25, mean_s=0.3, cv=0.5)))
    assert stalled["p50"] < 1.1 * calm["p50"]
    assert stalled["p99"] > calm["p99"] + 0.15
    # A stall model that never fires is the calm machine, draw for draw.
    assert e2e_percentiles(engine(StallModel(rate_per_s=0.0, mean_s=0.3))) == calm


def test_a_sweep_of_a_stalling_simulator_recovers_its_stalls(tmp_path: Path) -> None:
    """The calibration job against the simulator with known stalls: rate and mean duration come back."""
    truth = StallModel(rate_per_s=0.5, mean_s=0.1, cv=0.5)
    profile = load_profile("profiles/vllm-cpu-tiny.yaml")
    result = asyncio.run(
        run_calibrate(
            profile, backend_kind="sim", sink=lambda _: None, out_dir=tmp_path, target=SimTarget(engine(truth))
        )
    )
    assert result.calibration is not None and result.calibration.stalls is None  # reported, not modelled
    fitted = fit_stalls(result.sweep.stall_samples)
    assert fitted is not None
    assert f"{fitted.rate_per_s:.3g} per second" in result.calibration.derivation
    # Measured bias of the detection on the simulator: at 1 stall/s it finds about 0.7 of them and their mean
    # 20-25% long (near-coincident stalls merge into one gap); the stalled share of time comes back within 10%.
    assert fitted.rate_per_s == pytest.approx(truth.rate_per_s, rel=0.3)
    assert fitted.mean_s == pytest.approx(truth.mean_s, rel=0.3)
    # Taken out of each request's latency, the stalls leave the engine's own step for the fit.
    true_step = engine(None).terms[0]
    step = result.calibration.terms[0]
    for name in ("base_s", "per_seq_s"):
        assert getattr(step, name) == pytest.approx(getattr(true_step, name), rel=0.25), name
    # Without stalls in the engine, the calibration has none either.
    calm = asyncio.run(
        run_calibrate(
            profile, backend_kind="sim", sink=lambda _: None, out_dir=tmp_path / "calm", target=SimTarget(engine(None))
        )
    )
    assert calm.calibration is not None and fit_stalls(calm.sweep.stall_samples) is None
