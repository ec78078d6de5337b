"""An operator's own trace through the batch jobs: run (rows used of total), compare (with SABER), capacity
(the trace's own arrival times rescaled), and bad trace files (one line, exit 2)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from core.capacity import ArrivalScaling, find_capacity, format_table
from core.compare import BEST_STATIC, compare_summary_event, run_compare
from core.control.saber.speed_model import TraceLengths, fit_speed_model, profile_speeds
from core.modes import MODES
from core.profile import Profile, load_calibration, load_profile
from core.sim.engine import simulate
from core.workload import build_load_plan
from core.workload.operator_trace import GeneratedTrace, generate_operator_trace

REPO = Path(__file__).resolve().parent.parent
ENGINE = REPO / "profiles" / "calibrations" / "qwen2.5-coder-1.5b-l4.yaml"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console", "--batch", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def write_profile(tmp_path: Path, trace: Path, **workload: object) -> Path:
    data = {
        "name": "own-traffic",
        "seed": 0,
        "workload": {"trace": {"path": trace.name, "format": "csv"}, **workload},
        "slo": {"e2e_s": 20.0},
        "knobs": {"max_num_seqs": 64, "max_num_batched_tokens": 4096},
        "engine": {"calibration": str(ENGINE)},
    }
    path = tmp_path / "own-traffic.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


def operator_profile(tmp_path: Path, rows: int, *, rate_rps: float, cv: float, seed: int = 3) -> Profile:
    trace = tmp_path / "traffic.csv.gz"
    generate_operator_trace(rows, rate_rps=rate_rps, cv=cv, seed=seed).write(trace)
    return load_profile(write_profile(tmp_path, trace))


def test_a_batch_run_says_how_many_trace_rows_ran_of_how_many(tmp_path: Path) -> None:
    trace = tmp_path / "traffic.csv"
    generate_operator_trace(1400, rate_rps=20.0, cv=4.0).write(trace)
    whole = run_cli("--profile", str(write_profile(tmp_path, trace)))
    assert whole.returncode == 0, whole.stderr
    assert json.loads(whole.stdout.splitlines()[-1])["trace_rows"] == {"used": 1400, "total": 1400}
    assert "trace rows 1400 of 1400" in whole.stderr
    cut = run_cli("--profile", str(write_profile(tmp_path, trace, requests=990)))
    assert cut.returncode == 0, cut.stderr
    summary = json.loads(cut.stdout.splitlines()[-1])
    assert summary["trace_rows"] == {"used": 990, "total": 1400} and summary["requests"] == 990
    assert "trace rows 990 of 1400" in cut.stderr


def test_the_factsheet_says_a_trace_ran_whole_or_the_count_it_was_cut_to(tmp_path: Path) -> None:
    # The workload section once read "Requests: 1000" (the profile's default) for a trace replayed whole.
    trace = tmp_path / "traffic.csv"
    generate_operator_trace(1200, rate_rps=20.0, cv=4.0).write(trace)
    profile = write_profile(tmp_path, trace)
    for extra, limit, text in (
        ((), None, "Requests: no count limit (the whole trace)"),
        (("--requests", "300"), 300, "Requests: 300;"),
    ):
        out = tmp_path / f"out-{limit}"
        result = run_cli("--profile", str(profile), "--out", str(out), *extra)
        assert result.returncode == 0, result.stderr
        assert json.loads((out / "factsheet.json").read_text())["workload"]["requests"] == limit
        assert text in (out / "factsheet.md").read_text()


@pytest.mark.parametrize(
    "content", [b"timestamp_s,input_tokens,output_tokens\n0,5,5\x00\xff\xfe\n", b"\x1f\x8b\x08\x00"]
)
def test_an_undecodable_trace_is_one_line_and_exit_2_not_a_traceback(tmp_path: Path, content: bytes) -> None:
    trace = tmp_path / "traffic.csv.gz"
    trace.write_bytes(content)
    proc = run_cli("--profile", str(write_profile(tmp_path, trace)))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stdout.count('"event":"summary"') == 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(trace) in lines[0]


# ---------------------------------------------------------------- the generator and the shipped example


def test_the_generator_is_bursty_heavy_tailed_seeded_and_gives_each_request_its_slo() -> None:
    trace = generate_operator_trace(3000, rate_rps=2.0, cv=4.0, seed=11)
    assert 3.0 <= trace.interarrival_cv() <= 13.0
    assert (len(trace) - 1) / trace.timestamp_s[-1] == pytest.approx(2.0, rel=0.3)
    assert np.mean(trace.input_tokens > 8192) > 0.03  # long-context prompts past 8k tokens
    assert np.median(trace.input_tokens) < 2000  # ... in a mix that is mostly short
    assert len(np.unique(trace.slo_e2e_s)) > 100  # per request, not per class
    assert trace.to_csv() == generate_operator_trace(3000, rate_rps=2.0, cv=4.0, seed=11).to_csv()
    assert trace.to_csv() != generate_operator_trace(3000, rate_rps=2.0, cv=4.0, seed=12).to_csv()
    with pytest.raises(ValueError, match="cv must be within 3-13"):
        generate_operator_trace(100, cv=1.0)


def test_the_shipped_example_is_what_the_script_writes_and_replays_whole(tmp_path: Path) -> None:
    again = tmp_path / "again.csv.gz"
    script = REPO / "profiles" / "traces" / "make_operator_trace.py"
    proc = subprocess.run([sys.executable, str(script), "--out", str(again)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    shipped = REPO / "profiles" / "traces" / "operator-example.csv.gz"
    assert again.read_bytes() == shipped.read_bytes()
    assert shipped.stat().st_size < 100_000
    plan = build_load_plan(load_profile("operator-trace"))
    specs = list(plan.requests)
    assert len(specs) == plan.trace_rows == 2000
    assert all(s.slo.e2e_s is not None for s in specs) and len({s.slo.e2e_s for s in specs}) > 100


def test_the_slos_serve_trace_is_what_the_script_writes_with_stage_slos(tmp_path: Path) -> None:
    again = tmp_path / "again.csv.gz"
    script = REPO / "profiles" / "traces" / "make_operator_trace.py"
    args = ["--rows", "3000", "--rate", "4.5", "--cv", "6", "--seed", "21", "--stage-slos"]
    proc = subprocess.run([sys.executable, str(script), "--out", str(again), *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert again.read_bytes() == (REPO / "profiles" / "traces" / "slos-serve-trace.csv.gz").read_bytes()
    specs = list(build_load_plan(load_profile("slos-serve-trace")).requests)
    assert len(specs) == 3000
    # Each row's stage SLOs are its class's budgets, whose e2e form the default CSV writes.
    budgets = {(s.task, s.slo.ttft_s, s.slo.tpot_s) for s in specs}
    assert budgets == {("chat", 2.0, 0.06), ("code", 1.5, 0.04), ("long-context", 6.0, 0.06)}
    assert all(s.slo.e2e_s is None for s in specs)


# ---------------------------------------------------------------- compare: SABER on a trace


def test_compare_on_a_trace_runs_every_mode_saber_included(tmp_path: Path) -> None:
    profile = operator_profile(tmp_path, 300, rate_rps=2.5, cv=4.0)
    profile = profile.model_copy(update={"saber": profile.saber.model_copy(update={"static_caps": [64]})})
    result = asyncio.run(run_compare(profile))
    assert result.skipped == {}
    assert [row.mode for row in result.rows] == [*MODES, BEST_STATIC]
    assert {row.summary.requests for row in result.rows} == {300}
    assert compare_summary_event(result)["trace_rows"] == {"used": 300, "total": 300}
    saber = result.row("saber")
    assert saber.policy["mode"] == "saber" and saber.policy["admitted_high"] > 0
    assert set(saber.summary.per_task) == {"chat", "code", "long-context"}  # the trace's own task names


def test_saber_profiles_a_trace_on_its_own_lengths_never_its_arrivals_or_slos(tmp_path: Path) -> None:
    """The offline phase (paper 001 sec. IV-B) sees what an operator has before the run: the traffic's length
    mix. The same rows sent 4x faster with other SLOs give the same f(L); other lengths give another f(L)."""
    trace = generate_operator_trace(400, rate_rps=2.0, cv=4.0, seed=5)
    calibration = load_calibration(load_profile("operator-trace"))

    def fitted(name: str, table: GeneratedTrace) -> tuple[float, ...]:
        folder = tmp_path / name
        folder.mkdir()
        table.write(folder / "traffic.csv")
        profile = load_profile(write_profile(folder, folder / "traffic.csv"))
        # profile_speeds, not offline_phase: its cache must not be what makes two fits equal.
        samples = profile_speeds(profile, calibration, simulate, loads=[1, 4, 16, 64])
        assert len(samples) > 500 and {s.task for s in samples} == {"chat", "code", "long-context"}
        return fit_speed_model(samples).params

    as_recorded = fitted("recorded", trace)
    faster_other_slos = dataclasses.replace(trace, timestamp_s=trace.timestamp_s / 4, slo_e2e_s=trace.slo_e2e_s * 3)
    assert fitted("faster", faster_other_slos) == as_recorded
    short = dataclasses.replace(trace, input_tokens=np.minimum(trace.input_tokens, 64))
    assert fitted("short", short)[0] > as_recorded[0]  # f(1) is faster without the long prompts' prefill


def test_trace_profiling_plans_draw_whole_rows_of_the_trace(tmp_path: Path) -> None:
    profile = operator_profile(tmp_path, 200, rate_rps=2.0, cv=4.0)
    lengths = TraceLengths.of(profile)
    rows = set(zip(lengths.prompt_tokens.tolist(), lengths.output_tokens.tolist(), lengths.tasks, strict=True))
    mixes = lengths.mixes()
    assert len(mixes) == 2  # as recorded, and the three classes balanced
    for weights in mixes:
        plan = lengths.plan(weights, clients=8, count=500, rng=np.random.default_rng(0))
        assert plan.mode == "closed" and plan.concurrency == 8
        assert {(s.prompt_tokens, s.output_tokens, s.task) for s in plan.requests} <= rows
    balanced = lengths.plan(mixes[1], clients=1, count=3000, rng=np.random.default_rng(1))
    shares = Counter(s.task for s in balanced.requests)
    assert all(abs(n / 3000 - 1 / 3) < 0.04 for n in shares.values())


# ---------------------------------------------------------------- capacity: the trace's arrival times rescaled


def test_capacity_rescales_a_bursty_trace_keeping_its_burst_shape(tmp_path: Path) -> None:
    profile = operator_profile(tmp_path, 400, rate_rps=2.0, cv=8.0)
    recorded = np.array([s.arrival_s for s in build_load_plan(profile).requests])
    scaling = ArrivalScaling.of(profile)
    assert scaling.source == "trace"
    assert scaling.base_rate_rps == pytest.approx((len(recorded) - 1) / recorded[-1])
    doubled = np.array([s.arrival_s for s in build_load_plan(scaling.at(2 * scaling.base_rate_rps)).requests])
    assert doubled == pytest.approx(recorded / 2)  # every inter-arrival time halved: the same bursts, faster
    gaps = np.diff(recorded)
    assert gaps.std() / gaps.mean() > 5  # bursty: a Poisson trace has 1

    found = asyncio.run(find_capacity(profile, "fcfs", rel_tol=0.05))
    low, high = found.bracket
    assert found.capacity_rps == low > 0 and (high - low) <= 0.05 * high
    by_rate = {p.rate_rps: p.attainment for p in found.probes}
    assert by_rate[low] >= 0.9 > by_rate[high]
    assert found.scale == pytest.approx(low / scaling.base_rate_rps)
    assert all(p.scale == pytest.approx(p.rate_rps / scaling.base_rate_rps) for p in found.probes)
    fields = found.fields()
    assert fields["arrival_source"] == "trace" and fields["scale"] == found.scale
    table = format_table(profile, [found])
    assert "scale 1 = trace traffic.csv.gz" in table and f"{found.scale:.3f}" in table


def test_batch_capacity_on_a_trace_reports_rate_and_scale_per_mode(tmp_path: Path) -> None:
    trace = tmp_path / "traffic.csv.gz"
    generate_operator_trace(300, rate_rps=2.0, cv=4.0, seed=2).write(trace)
    proc = run_cli("--profile", str(write_profile(tmp_path, trace)), "--job", "capacity", "--mode", "saber")
    assert proc.returncode == 0, proc.stderr
    modes = json.loads(proc.stdout.splitlines()[-1])["modes"]
    assert set(modes) == {"fcfs", "saber"}
    for fields in modes.values():
        assert fields["arrival_source"] == "trace" and fields["capacity_rps"] > 0
        assert fields["scale"] == pytest.approx(fields["capacity_rps"] / fields["base_rate_rps"])
    assert "scale 1 = trace traffic.csv.gz" in proc.stderr
