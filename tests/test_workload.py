"""Synthetic workloads: arrivals, lengths, task mixes, SLO fallbacks and the load plan's fields."""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

import numpy as np
import pytest

from core.profile import Profile, ProfileError
from core.records import RequestSLO, RequestSpec
from core.workload import BLOCK_SIZE, build_load_plan, make_length_sampler, mean_rate_rps
from core.workload.lengths import LengthModelError

CHAT_TASK: dict[str, Any] = {
    "name": "chat",
    "prompt_tokens": {"dist": "fixed", "value": 100},
    "output_tokens": {"dist": "fixed", "value": 20},
}


def make_profile(arrival: dict[str, Any], tasks: list[dict[str, Any]] | None = None, **workload: Any) -> Profile:
    return Profile.model_validate(
        {"name": "test", "workload": {"arrival": arrival, "tasks": tasks or [CHAT_TASK], **workload}}
    )


def specs_of(profile: Profile, **kwargs: Any) -> list[RequestSpec]:
    return list(build_load_plan(profile, **kwargs).requests)


def arrival_times(profile: Profile, n: int) -> np.ndarray:
    return np.array([spec.arrival_s for spec in specs_of(profile, requests=n)])


def inter_arrival_gaps(profile: Profile, n: int) -> np.ndarray:
    return np.diff(arrival_times(profile, n))


# ---------------------------------------------------------------- determinism


def test_same_seed_gives_identical_specs() -> None:
    profile = make_profile(
        {"kind": "gamma", "rate_rps": 5, "burstiness": 0.5},
        [
            {**CHAT_TASK, "prompt_tokens": {"dist": "lognormal", "mean": 300}},
            {**CHAT_TASK, "name": "code", "output_tokens": {"dist": "uniform", "low": 1, "high": 500}},
        ],
    )
    assert specs_of(profile, seed=7, requests=5000) == specs_of(profile, seed=7, requests=5000)


def test_different_seeds_give_different_specs() -> None:
    profile = make_profile(
        {"kind": "poisson", "rate_rps": 5},
        [{**CHAT_TASK, "prompt_tokens": {"dist": "lognormal", "mean": 300}}],
    )
    first, second = specs_of(profile, seed=1, requests=200), specs_of(profile, seed=2, requests=200)
    assert [s.arrival_s for s in first] != [s.arrival_s for s in second]
    assert [s.prompt_tokens for s in first] != [s.prompt_tokens for s in second]


def test_profile_seed_is_the_default() -> None:
    base = make_profile({"kind": "poisson", "rate_rps": 5})
    seeded = base.model_copy(update={"seed": 42})
    assert specs_of(seeded, requests=100) == specs_of(base, seed=42, requests=100)


def test_changing_the_rate_keeps_the_same_lengths_and_tasks() -> None:
    """Independent random streams: two runs that differ in load still see the same requests."""
    tasks = [
        {**CHAT_TASK, "prompt_tokens": {"dist": "lognormal", "mean": 300}},
        {**CHAT_TASK, "name": "code"},
    ]
    slow = specs_of(make_profile({"kind": "poisson", "rate_rps": 1}, tasks), requests=500)
    fast = specs_of(make_profile({"kind": "poisson", "rate_rps": 9}, tasks), requests=500)
    assert [(s.task, s.prompt_tokens) for s in slow] == [(s.task, s.prompt_tokens) for s in fast]


def test_request_ids_run_in_order_and_specs_hold_plain_python_numbers() -> None:
    specs = specs_of(make_profile({"kind": "poisson", "rate_rps": 50}), requests=BLOCK_SIZE + 10)
    assert [s.request_id for s in specs] == list(range(BLOCK_SIZE + 10))
    assert all(type(s.prompt_tokens) is int and type(s.arrival_s) is float for s in specs[:5])
    times = [s.arrival_s for s in specs]
    assert times == sorted(times)


# ---------------------------------------------------------------- arrivals


def test_first_request_is_sent_at_time_zero() -> None:
    for kind in ("poisson", "constant", "gamma"):
        assert specs_of(make_profile({"kind": kind, "rate_rps": 3}), requests=3)[0].arrival_s == 0.0


def test_poisson_rate_and_exponential_gaps() -> None:
    gaps = inter_arrival_gaps(make_profile({"kind": "poisson", "rate_rps": 20}), 50_000)
    assert gaps.mean() == pytest.approx(1 / 20, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)  # exponential: CV = 1


def test_constant_arrivals_are_evenly_spaced() -> None:
    gaps = inter_arrival_gaps(make_profile({"kind": "constant", "rate_rps": 4}), 1000)
    np.testing.assert_allclose(gaps, 0.25)


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gamma_keeps_the_rate_and_its_cv_is_one_over_root_burstiness(burstiness: float) -> None:
    profile = make_profile({"kind": "gamma", "rate_rps": 10, "burstiness": burstiness})
    gaps = inter_arrival_gaps(profile, 60_000)
    assert gaps.mean() == pytest.approx(0.1, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.04)


def test_on_off_sends_nothing_in_off_windows_and_poisson_while_on() -> None:
    on_s, off_s, rate = 2.0, 3.0, 25.0
    profile = make_profile({"kind": "onoff", "rate_rps": rate, "on_s": on_s, "off_s": off_s})
    times = arrival_times(profile, 40_000)
    position_in_cycle = np.mod(times, on_s + off_s)
    assert (position_in_cycle < on_s + 1e-9).all()
    # The long-run rate is thinned by the duty cycle; within on windows it is the full rate.
    assert len(times) / times[-1] == pytest.approx(rate * on_s / (on_s + off_s), rel=0.03)
    assert mean_rate_rps(profile.workload.arrival) == pytest.approx(10.0)  # type: ignore[arg-type]
    counts_per_on_window = np.bincount((times // (on_s + off_s)).astype(int))[:-1]
    assert counts_per_on_window.mean() == pytest.approx(rate * on_s, rel=0.03)


# ---------------------------------------------------------------- lengths


def lengths(dist: dict[str, Any], n: int = 100_000, seed: int = 0) -> np.ndarray:
    task = {**CHAT_TASK, "prompt_tokens": dist}
    profile = Profile.model_validate(
        {"name": "t", "workload": {"arrival": {"kind": "poisson", "rate_rps": 1}, "tasks": [task]}}
    )
    return make_length_sampler(profile.workload.tasks[0].prompt_tokens).sample(np.random.default_rng(seed), n)


def test_lognormal_has_the_requested_arithmetic_mean() -> None:
    draws = lengths({"dist": "lognormal", "mean": 400, "sigma": 0.8, "max": 1_000_000})
    assert draws.mean() == pytest.approx(400, rel=0.02)
    # sigma is the std of the underlying normal
    assert np.log(draws).std() == pytest.approx(0.8, rel=0.03)


def test_lognormal_is_clipped_to_its_bounds() -> None:
    draws = lengths({"dist": "lognormal", "mean": 100, "sigma": 1.5, "min": 20, "max": 300})
    assert draws.min() == 20 and draws.max() == 300
    assert draws.dtype == np.int64


def test_uniform_includes_both_ends() -> None:
    draws = lengths({"dist": "uniform", "low": 3, "high": 6}, n=10_000)
    assert set(np.unique(draws).tolist()) == {3, 4, 5, 6}


def test_empirical_follows_its_weights() -> None:
    draws = lengths({"dist": "empirical", "values": [10, 20, 30], "weights": [1, 0, 3]})
    assert set(np.unique(draws).tolist()) == {10, 30}
    assert (draws == 30).mean() == pytest.approx(0.75, abs=0.01)


def test_empirical_without_weights_is_uniform_over_values() -> None:
    draws = lengths({"dist": "empirical", "values": [5, 7]}, n=20_000)
    assert (draws == 5).mean() == pytest.approx(0.5, abs=0.02)


def test_fixed_length() -> None:
    assert set(lengths({"dist": "fixed", "value": 9}, n=10).tolist()) == {9}


@pytest.mark.parametrize(
    "dist",
    [
        {"dist": "lognormal", "mean": 100, "min": 50, "max": 10},
        {"dist": "uniform", "low": 9, "high": 2},
        {"dist": "empirical", "values": [1, 2], "weights": [1]},
        {"dist": "empirical", "values": [1, 2], "weights": [0, 0]},
    ],
)
def test_unsamplable_length_models_are_refused(dist: dict[str, Any]) -> None:
    with pytest.raises(LengthModelError):
        lengths(dist, n=1)
    profile = make_profile({"kind": "poisson", "rate_rps": 1}, [{**CHAT_TASK, "output_tokens": dist}])
    with pytest.raises(ProfileError, match=r"workload\.tasks\.0\.output_tokens"):
        build_load_plan(profile)  # refused when the plan is built, before any spec is drawn


# ---------------------------------------------------------------- task mixes and SLOs


def test_task_mix_shares_follow_weights() -> None:
    tasks = [
        {**CHAT_TASK, "name": "a", "weight": 40},
        {**CHAT_TASK, "name": "b", "weight": 40},
        {**CHAT_TASK, "name": "c", "weight": 10},
        {**CHAT_TASK, "name": "d", "weight": 10},
    ]
    specs = specs_of(make_profile({"kind": "poisson", "rate_rps": 10}, tasks), requests=50_000)
    names = np.array([s.task for s in specs])
    for name, share in {"a": 0.4, "b": 0.4, "c": 0.1, "d": 0.1}.items():
        assert (names == name).mean() == pytest.approx(share, abs=0.01)


def test_each_task_draws_its_own_lengths() -> None:
    tasks = [
        {**CHAT_TASK, "name": "short", "output_tokens": {"dist": "fixed", "value": 5}},
        {**CHAT_TASK, "name": "long", "output_tokens": {"dist": "fixed", "value": 500}},
    ]
    specs = specs_of(make_profile({"kind": "poisson", "rate_rps": 10}, tasks), requests=2000)
    assert all(s.output_tokens == (5 if s.task == "short" else 500) for s in specs)


def test_task_slo_falls_back_to_the_profile_slo() -> None:
    tasks = [
        {**CHAT_TASK, "name": "own", "slo": {"ttft_s": 0.2, "tpot_s": 0.05}, "acceptance": 0.7},
        {**CHAT_TASK, "name": "inherits"},
    ]
    profile = Profile.model_validate(
        {
            "name": "t",
            "slo": {"e2e_s": 3.0},
            "workload": {"arrival": {"kind": "poisson", "rate_rps": 1}, "tasks": tasks},
        }
    )
    by_task = {s.task: s for s in specs_of(profile, requests=200)}
    # A task that states an SLO states all of it: no merging with the profile's e2e objective.
    assert by_task["own"].slo == RequestSLO(ttft_s=0.2, tpot_s=0.05)
    assert by_task["own"].acceptance == 0.7
    assert by_task["inherits"].slo == RequestSLO(e2e_s=3.0)
    assert by_task["inherits"].acceptance is None


# ---------------------------------------------------------------- plan fields


def test_open_loop_plan_fields() -> None:
    profile = Profile.model_validate(
        {
            "name": "t",
            "knobs": {"concurrency": 16},
            "workload": {
                "arrival": {"kind": "poisson", "rate_rps": 2},
                "tasks": [CHAT_TASK],
                "requests": 50,
                "warmup_requests": 5,
                "warmup_s": 1.0,
            },
        }
    )
    plan = build_load_plan(profile)
    assert (plan.mode, plan.concurrency, plan.max_requests) == ("open", 16, 50)
    assert (plan.warmup_requests, plan.warmup_s, plan.duration_s) == (5, 1.0, None)
    specs = list(plan.requests)
    assert len(specs) == 50
    assert all(s.warmup for s in specs[:5])
    assert all(s.warmup == (s.arrival_s < 1.0) for s in specs[5:])
    assert all(s.client_id is None for s in specs)


def test_requests_argument_overrides_the_profile() -> None:
    profile = make_profile({"kind": "poisson", "rate_rps": 2}, requests=50)
    plan = build_load_plan(profile, requests=7)
    assert plan.max_requests == 7 and len(list(plan.requests)) == 7


def test_duration_ends_open_loop_arrivals() -> None:
    profile = make_profile({"kind": "constant", "rate_rps": 10}, duration_s=3.0)
    plan = build_load_plan(profile)
    specs = list(plan.requests)
    # Only a duration was set, so the default request count does not cut the window short.
    assert plan.max_requests is None and plan.duration_s == 3.0
    assert len(specs) == 30 and specs[-1].arrival_s < 3.0
    assert len(list(build_load_plan(profile, duration_s=1.0).requests)) == 10
    # An explicit count still caps a timed run.
    assert len(list(build_load_plan(profile, requests=5).requests)) == 5


def test_closed_loop_plan_is_lazy_and_open_ended() -> None:
    profile = make_profile({"kind": "closed", "clients": 8, "think_time_s": 0.5}, duration_s=60.0, warmup_requests=3)
    plan = build_load_plan(profile)
    assert (plan.mode, plan.concurrency, plan.think_time_s) == ("closed", 8, 0.5)
    assert plan.max_requests is None and plan.duration_s == 60.0
    specs = list(itertools.islice(plan.requests, 3 * BLOCK_SIZE))  # far more than one block: never ends
    assert len(specs) == 3 * BLOCK_SIZE
    assert all(s.arrival_s == 0.0 for s in specs)  # the backend stamps arrival on send
    assert [s.warmup for s in specs[:4]] == [True, True, True, False]


def test_closed_loop_with_a_request_count_stops_there() -> None:
    profile = make_profile({"kind": "closed", "clients": 2}, requests=10)
    plan = build_load_plan(profile)
    assert plan.max_requests == 10 and len(list(plan.requests)) == 10


def test_one_hundred_thousand_specs_generate_quickly() -> None:
    tasks = [
        {**CHAT_TASK, "name": f"t{i}", "prompt_tokens": {"dist": "lognormal", "mean": 100 * (i + 1)}} for i in range(4)
    ]
    profile = make_profile({"kind": "gamma", "rate_rps": 30, "burstiness": 0.5}, tasks)
    started = time.perf_counter()
    count = sum(1 for _ in build_load_plan(profile, requests=100_000).requests)
    elapsed = time.perf_counter() - started
    print(f"100k specs in {elapsed:.2f} s")
    assert count == 100_000
