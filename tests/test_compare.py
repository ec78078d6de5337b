"""`--job compare`: every mode on the same seeded arrivals, the best-static sweep, the table and the summary."""

from __future__ import annotations

import asyncio
import json

from core.compare import BEST_STATIC, compare_summary_event, format_table, run_compare
from core.modes import MODES
from core.profile import load_profile
from tests.fakes import run_batch

ROW_FIELDS = {
    "slo_attainment",
    "slo_attainment_per_task",
    "goodput_rps",
    "token_goodput_tps",
    "smooth_goodput",
    "p99_s",
    "cv_completion_over_slo",
    "rejected",
    "deferred",
}


def test_compare_runs_every_mode_and_the_best_static_cap_on_the_same_arrivals() -> None:
    profile = load_profile("saber-w1")
    profile = profile.model_copy(update={"saber": profile.saber.model_copy(update={"static_caps": [10, 40, 70]})})
    result = asyncio.run(run_compare(profile, requests=200))
    assert [row.mode for row in result.rows] == [*MODES, BEST_STATIC]
    # Same seeded arrivals: every mode accounts for the same measured requests.
    assert len({row.summary.requests for row in result.rows}) == 1
    assert set(result.static_sweep) == {10, 40, 70}
    best = result.row(BEST_STATIC)
    assert best.summary.slo_attainment == max(result.static_sweep.values())
    assert result.static_sweep[best.max_num_seqs] == best.summary.slo_attainment
    # A cap of 10 starves this workload: the sweep must see a real difference between caps.
    assert result.static_sweep[10] < best.summary.slo_attainment
    saber = result.row("saber")
    assert saber.policy["mode"] == "saber" and saber.policy["speed_model"]["kind"] == "usl"

    event = compare_summary_event(result)
    assert event["event"] == "summary" and event["job"] == "compare"
    assert set(event["modes"]) == {*MODES, BEST_STATIC}
    for fields in event["modes"].values():
        assert fields.keys() >= ROW_FIELDS
        assert set(fields["slo_attainment_per_task"]) == {t.name for t in profile.workload.tasks}
    table = format_table(result).splitlines()
    assert len(table) == 1 + len(result.rows)
    assert table[0].split()[0] == "mode" and "CV" in table[0]


def test_batch_compare_prints_a_summary_with_modes_and_exit_0() -> None:
    proc = run_batch("--profile", "saber-w2", "--job", "compare", "--requests", "150")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert [e["mode"] for e in lines if e["event"] == "compare_row"] == [*MODES, BEST_STATIC]
    assert set(lines[-1]["modes"]) == {*MODES, BEST_STATIC}
    assert "fcfs-best-static" in proc.stderr  # the text table on stderr


def test_unknown_mode_and_live_compare_are_usage_errors() -> None:
    proc = run_batch("--profile", "saber-w1", "--mode", "nope")
    assert proc.returncode == 2
    assert "'nope'" in proc.stderr and "saber" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    live = run_batch("--profile", "saber-w1", "--job", "compare", "--backend", "url", "--url", "http://127.0.0.1:9")
    assert live.returncode == 2
    assert "simulator" in live.stderr
