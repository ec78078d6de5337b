"""Every job through the registry: a factsheet with its own section and a verdict headline that the batch
runner's last stderr line repeats; the SLO verdict's arithmetic; the options' usage errors."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from core.events import null_sink
from core.exit_codes import ExitCode
from core.factsheet.render import render_json, render_markdown
from core.job_registry import JOBS, JobContext
from core.jobs.options import JOB_NAMES, OperatorOptions, UsageError
from core.metrics.verdict import check_slo, slo_verdict
from core.profile import SCHEDULING_MODES, ProfileError, load_profile
from tests.fakes import PUBLISHED_SCHEMA

REPO = Path(__file__).resolve().parent.parent


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "console", *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )


def validate(factsheet: dict[str, Any]) -> None:
    schema = json.loads(PUBLISHED_SCHEMA.read_text())
    jsonschema.validate(factsheet, schema, cls=jsonschema.Draft202012Validator)


# ---------------------------------------------------------------- the verdict


def test_check_slo_says_met_or_violated_and_by_how_much() -> None:
    violated = check_slo("p99", 1.31, 1.2)
    assert violated.state == "violated" and violated.margin == pytest.approx(0.0917, abs=1e-3)
    assert violated.text() == "p99 1.31 s vs SLO 1.2 s: violated by 9%"
    met = check_slo("p99", 0.84, 1.2)
    assert met.state == "met" and met.text() == "p99 0.840 s vs SLO 1.2 s: met with 30% to spare"
    assert check_slo("p99", float("nan"), 1.2).state == "unmeasured"
    assert check_slo("p99", 0.5, None).state == "no_slo"


def test_check_slo_at_the_limit_meets_it_and_nothing_measured_has_no_margin() -> None:
    # A p99 equal to the SLO meets it (p99 <= SLO, paper 000 sec. II-B), with nothing to spare.
    limit = check_slo("p99", 1.2, 1.2)
    assert limit.state == "met" and limit.margin == 0.0 and limit.short() == "met, at the limit"
    # The margin is relative to the SLO, on one scale either side: 25% under, 12% over.
    assert check_slo("p99", 0.9, 1.2).margin == pytest.approx(-0.25)
    assert check_slo("p99", 1.344, 1.2).margin == pytest.approx(0.12)
    # No measurement proves an SLO: unmeasured, never met, and no margin to report.
    for value in (None, float("nan"), float("inf")):
        check = check_slo("p99", value, 1.2)
        assert check.state == "unmeasured" and check.margin is None and check.short() == "unknown"


def test_verdict_per_task_where_tasks_set_their_own_slos() -> None:
    profile = load_profile("saber-w1")  # four tasks, each with its own e2e SLO
    tasks = {t.name: t for t in profile.workload.tasks}
    per_task = {name: {"requests": 10, "completed": 10, "p99_s": 0.5 * t.slo.e2e_s} for name, t in tasks.items()}
    worst = next(iter(tasks))
    per_task[worst]["p99_s"] = 1.25 * tasks[worst].slo.e2e_s
    verdict = slo_verdict({"requests": 40, "completed": 40, "p99_s": 1.0, "per_task": per_task}, profile)
    assert verdict.state == "violated" and verdict.margin == pytest.approx(0.25)
    assert verdict.headline().startswith(f"SLO violated by 25% (worst: {worst}, p99 ")
    assert set(verdict.per_task) == set(tasks)
    assert all(v.state == "met" for name, v in verdict.per_task.items() if name != worst)


def test_a_run_that_measured_nothing_says_so() -> None:
    profile = load_profile("quickstart")
    failed = slo_verdict({"requests": 5, "completed": 0, "p99_s": None}, profile)
    assert failed.state == "unmeasured" and failed.headline().startswith("nothing measured: no request completed")
    empty = slo_verdict({"requests": 0, "completed": 0}, profile)
    assert "no request was sent" in empty.headline()


# ---------------------------------------------------------------- the registry and its factsheets


def test_the_registry_has_every_job_and_every_mode_has_a_policy() -> None:
    from core.modes import MODES

    assert set(JOBS) == set(JOB_NAMES)
    assert tuple(MODES) == SCHEDULING_MODES


@pytest.mark.parametrize(
    ("job", "section", "args"),
    [
        ("run", None, ("--requests", "300")),
        ("tune", "tuning", ("--profile", "SMALL_TUNE")),
        ("compare", "compare", ("--requests", "300")),
        ("capacity", "capacity", ("--requests", "200", "--mode", "saber")),
    ],
)
def test_every_job_writes_a_factsheet_with_its_section_and_the_verdict_on_stderr(
    job: str, section: str | None, args: tuple[str, ...], tmp_path: Path
) -> None:
    out = tmp_path / job
    if "SMALL_TUNE" in args:  # the quickstart with the paper's hill-climb, 2 steps on short segments
        small = tmp_path / "small-tune.yaml"
        small.write_text(
            (REPO / "profiles" / "quickstart.yaml").read_text()
            + "\ntuner: {algorithm: hillclimb, steps: 2, sim_min_duration_s: 20, sim_min_requests: 200}\n"
        )
        args = tuple(str(small) if arg == "SMALL_TUNE" else arg for arg in args)
    proc = run_cli("--batch", "--job", job, "--out", str(out), *args)
    assert proc.returncode == 0, proc.stderr
    factsheet = json.loads((out / "factsheet.json").read_text())
    validate(factsheet)
    assert factsheet["job"] == job
    for name in ("tuning", "compare", "capacity", "calibration"):
        assert (factsheet[name] is not None) == (name == section), name
    headline = factsheet["verdict"]["headline"]
    # The batch runner's last stderr line says what the factsheet's headline says.
    assert proc.stderr.strip().splitlines()[-1].endswith(f": {job}: {headline}")
    page = (out / "factsheet.md").read_text()
    assert f"**{headline}.**" in page.split("## Headline")[1]
    assert json.loads((out / "summary.json").read_text())["event"] == "summary"
    if job in ("run", "tune", "compare"):
        assert factsheet["verdict"]["state"] in ("met", "violated")
        assert "SLO met" in headline or "SLO violated" in headline
    if job == "tune":
        tuning = factsheet["tuning"]
        assert tuning["objective"] and tuning["tuned"]["slo_attainment"] is not None
        assert tuning["spread"]["measurements"] >= 1 and tuning["spread"]["p99_s"]["min"] is not None
        assert factsheet["performance"]["requests"] > 0
    if job == "compare":
        assert [row["mode"] for row in factsheet["compare"]["rows"]][:4] == list(SCHEDULING_MODES)
        assert all(row["verdict"]["state"] in ("met", "violated") for row in factsheet["compare"]["rows"])
        assert "## Compare" in page
    if job == "capacity":
        rows = factsheet["capacity"]["rows"]
        assert [row["mode"] for row in rows] == ["fcfs", "saber"] and all(row["capacity_rps"] > 0 for row in rows)
        assert factsheet["performance"] is None and factsheet["workload"]["requests"] == 200
        assert "capacity at ≥ 90% SLO attainment: fcfs " in headline and "## Capacity" in page


def test_calibrate_factsheet_has_the_fit(tmp_path: Path) -> None:
    """--job calibrate needs a live server; here the job's sweep runs against the simulator (test_calibrate)."""
    from core.calibrate.job import run_calibrate
    from core.calibrate.sweep_targets import SimTarget
    from tests.test_calibrate import known_calibration

    profile = load_profile("profiles/vllm-cpu-tiny.yaml")
    target = SimTarget(known_calibration())
    result = asyncio.run(run_calibrate(profile, backend_kind="sim", sink=null_sink, out_dir=tmp_path, target=target))
    spec = JOBS["calibrate"]
    ctx = JobContext(profile, OperatorOptions(profile=profile, job="calibrate", backend="url"), null_sink)
    factsheet = spec.factsheet(result, ctx)
    data = json.loads(render_json(factsheet))
    validate(data)
    calibration = data["calibration"]
    assert calibration["path"] == str(tmp_path / "calibration.yaml") and calibration["observations"] > 3
    assert calibration["rms_relative_error"] < 0.1 and calibration["terms"]
    assert data["workload"] is None and data["performance"] is None and data["verdict"]["state"] == "no_slo"
    report = spec.report(result, ctx)
    assert report.status == ExitCode.OK and report.verdict == data["verdict"]["headline"]
    assert report.verdict.startswith("calibration fitted: RMS error")
    assert "## Calibration" in render_markdown(factsheet)
    assert spec.summary(result)["job"] == "calibrate"


def test_a_run_that_measured_nothing_says_so_in_its_factsheet_and_on_stderr(tmp_path: Path) -> None:
    out = tmp_path / "nothing"
    proc = run_cli("--batch", "--requests", "50", "--out", str(out))  # 100 warm-up requests: none measured
    assert proc.returncode == 0, proc.stderr
    assert "nothing was measured: the first 100 requests" in proc.stderr
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .endswith("run: nothing measured: no request was sent in the measurement window, so there is no SLO verdict")
    )
    factsheet = json.loads((out / "factsheet.json").read_text())
    validate(factsheet)
    assert factsheet["verdict"]["state"] == "unmeasured"
    assert "Nothing was measured" in (out / "factsheet.md").read_text()


# ---------------------------------------------------------------- options and usage


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (OperatorOptions(backend="url"), "--backend url needs --url"),
        (OperatorOptions(url="http://127.0.0.1:8000"), "--url is for --backend url"),
        (OperatorOptions(requests=0), "--requests must be at least 1"),
        (OperatorOptions(duration_s=-1.0), "--duration must be positive"),
        (OperatorOptions(resume=True), "--resume continues a tune"),
        (OperatorOptions(mode="sabre"), "did you mean saber?"),  # type: ignore[arg-type]
    ],
)
def test_usage_errors_are_one_line(options: OperatorOptions, message: str) -> None:
    with pytest.raises(ProfileError, match=re.escape(message)):  # UsageError is a ProfileError: exit 2
        options.check()


def test_a_job_on_a_backend_it_cannot_use_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="runs on the simulator"):
        JOBS["compare"].check(OperatorOptions(job="compare", backend="vllm"))
    with pytest.raises(UsageError, match="measures a live server"):
        JOBS["calibrate"].check(OperatorOptions(job="calibrate"))


def test_a_traces_verdict_judges_each_request_against_its_own_slo() -> None:
    """A trace's rows carry their own SLOs, so the p99 against the profile's default SLO says nothing (it
    read 'violated by 58%' at 91% attainment): the verdict checks the share of requests over their own SLO
    against the 1% the p99 constraint allows, overall and per task."""
    profile = load_profile("operator-trace")
    summary = {
        "requests": 1000,
        "completed": 1000,
        "p99_s": 31.6,  # far over the profile's default 20 s: must not decide
        "slo_attainment": 0.995,
        "per_task": {
            "chat": {"requests": 600, "completed": 600, "slo_attainment": 1.0, "p99_s": 40.0},
            "code": {"requests": 400, "completed": 400, "slo_attainment": 0.98, "p99_s": 3.0},
        },
    }
    verdict = slo_verdict(summary, profile)
    assert verdict.state == "violated"
    assert verdict.worst is not None and verdict.worst[0] == "code"
    assert "2.0% missed (p99 allows 1%)" in verdict.headline()
    summary["per_task"]["code"]["slo_attainment"] = 0.995
    assert slo_verdict(summary, profile).state == "met"


def test_progress_and_engine_fields_are_cleaned_as_make_event_cleans_them() -> None:
    # _RunObserver builds its progress and engine events itself (compiled) instead of through make_event: each
    # field must come out as make_event's _clean gives it, numpy scalars and non-finite floats included.
    import numpy as np

    from core.events import make_event
    from core.jobs.run import _cleaned

    values = [0.1234567891, -2.5e-7, 1e300, float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 3, True, None, "x"]
    values += [np.float64(0.30000000000000004), np.int64(7), np.float32(1.5), [1.23456789, None], {"a": 2.0000001}]
    for value in values:
        cleaned = make_event("e", v=value)["v"]
        assert repr(_cleaned(value)) == repr(cleaned)
        assert type(_cleaned(value)) is type(cleaned)
