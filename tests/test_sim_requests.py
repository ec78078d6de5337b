"""Positional constructors on the simulator's per-request path: the same objects as the keyword forms.

`SimRequest.arrived`, the workload's `RequestSpec`s and the engine's `EngineSample`s are built positionally
(100k requests and 47k samples in a bench-chat run, where keywords cost twice as much); a field added,
removed or reordered in any of them must fail here rather than shift every value after it."""

from __future__ import annotations

import dataclasses

from core.backend_api import EngineSample
from core.profile import load_profile
from core.profile.loading import load_calibration
from core.records import RequestSLO, RequestSpec
from core.sim.engine import SimEngine
from core.sim.sim_request import SimRequest
from core.workload import build_load_plan


def _fields(obj: object) -> dict[str, object]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}  # type: ignore[arg-type]


def test_arrived_is_the_keyword_form() -> None:
    spec = RequestSpec(request_id=7, prompt_tokens=123, output_tokens=45, arrival_s=1.5)
    controlled = object()
    built = SimRequest.arrived(spec, 1.25, 1.75, 2.5, controlled, "low")
    expected = SimRequest(
        spec=spec,
        latency_from_s=1.25,
        sent_s=1.75,
        dispatched_s=2.5,
        prompt_left=123,
        out_left=45,
        controlled=controlled,
        tier="low",
    )
    assert _fields(built) == _fields(expected)
    assert built.done_runs is not SimRequest.arrived(spec, 0.0, 0.0, 0.0, None, None).done_runs  # not shared


def test_synthetic_specs_are_the_keyword_form() -> None:
    profile = load_profile("quickstart")
    plan = build_load_plan(profile, seed=3, requests=200)
    specs = list(plan.requests)
    assert len(specs) == 200
    warm = 0
    for spec in specs:
        rebuilt = RequestSpec(
            request_id=spec.request_id,
            prompt_tokens=spec.prompt_tokens,
            output_tokens=spec.output_tokens,
            arrival_s=spec.arrival_s,
            task=spec.task,
            slo=spec.slo,
            acceptance=spec.acceptance,
            warmup=spec.warmup,
        )
        assert _fields(spec) == _fields(rebuilt)
        assert type(spec.prompt_tokens) is int and type(spec.output_tokens) is int
        assert type(spec.arrival_s) is float and isinstance(spec.task, str) and isinstance(spec.slo, RequestSLO)
        assert type(spec.warmup) is bool and spec.client_id is None
        warm += spec.warmup
    assert 0 < warm < 200  # quickstart has warm-up requests: the flag is really computed per spec


def test_engine_samples_are_the_keyword_form() -> None:
    profile = load_profile("quickstart")
    calibration = load_calibration(profile)
    engine = SimEngine(calibration, profile.knobs, build_load_plan(profile, seed=5, requests=300), seed=5)
    taken = 0
    while not engine.advance_until(engine.clock + 1.0):
        before = engine._last_sample
        sample = engine.sample()
        last_time_s, last_busy_s = before
        busy_s = engine.busy_s
        span_s = engine.clock - last_time_s
        utilisation = min(1.0, (busy_s - last_busy_s) / span_s) if span_s > 0 else float(engine.replicas[0].running > 0)
        expected = EngineSample(
            time_s=engine.clock,
            running=engine.replicas[0].running,
            waiting=len(engine.replicas[0].waiting) + len(engine.clients.blocked),
            kv_usage=engine.replicas[0].kv_usage,
            preemptions_total=engine.preemptions,
            generated_tokens_total=int(engine.generated_tokens),
            power_w=None if calibration.power is None else calibration.power.power_w(utilisation),
            busy_s=busy_s,
        )
        assert sample == expected
        taken += 1
    assert taken > 10 and calibration.power is not None
