"""The headless batch runner: JSON Lines contract, exit codes, determinism, and no Textual import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import REPO, events, run_cli

SUMMARY_FIELDS = {
    "p50_s",
    "p95_s",
    "p99_s",
    "goodput_rps",
    "slo_attainment",
    "smooth_goodput",
    "ttft_p99_s",
    "tpot_p99_s",
    "requests",
    "failed",
}


def test_quickstart_prints_progress_then_a_summary_with_every_headline_field() -> None:
    proc = run_cli("--batch", "--requests", "300")
    assert proc.returncode == 0, proc.stderr
    lines = events(proc.stdout)
    assert lines[0]["event"] == "start"
    assert any(e["event"] == "progress" for e in lines)
    summary = lines[-1]
    assert summary["event"] == "summary"
    assert summary.keys() >= SUMMARY_FIELDS
    assert summary["requests"] > 0 and summary["failed"] == 0
    assert 0 < summary["p50_s"] <= summary["p95_s"] <= summary["p99_s"]


def test_same_profile_and_seed_give_the_same_summary_byte_for_byte() -> None:
    first = run_cli("--batch", "--requests", "400", "--seed", "11").stdout.splitlines()[-1]
    second = run_cli("--batch", "--requests", "400", "--seed", "11").stdout.splitlines()[-1]
    other = run_cli("--batch", "--requests", "400", "--seed", "12").stdout.splitlines()[-1]
    assert first == second
    assert first != other


def test_unknown_profile_key_is_one_line_with_file_and_field_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "typo.yaml"
    bad.write_text(
        "name: typo\nworkload:\n  arrival: {kind: poisson, rate_rps: 2}\n  tasks:\n"
        "    - name: t\n      prompt_tokens: {dist: fixed, value: 8}\n"
        "      output_tokens: {dist: fixed, value: 8}\n      slo_e2e: 3\n"
    )
    proc = run_cli("--batch", "--profile", str(bad))
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    message = proc.stderr.strip().splitlines()
    assert len(message) == 1
    assert str(bad) in message[0] and "workload.tasks.0.slo_e2e" in message[0]


def test_wrong_value_names_the_expectation(tmp_path: Path) -> None:
    bad = tmp_path / "neg.yaml"
    bad.write_text("name: neg\nworkload:\n  arrival: {kind: poisson, rate_rps: -3}\n  tasks: []\n")
    proc = run_cli("--batch", "--profile", str(bad))
    assert proc.returncode == 2
    assert "rate_rps" in proc.stderr and "greater than 0" in proc.stderr


def test_missing_profile_and_bad_arguments_exit_2() -> None:
    assert run_cli("--batch", "--profile", "no-such-profile").returncode == 2
    assert run_cli("--batch", "--requests", "0").returncode == 2


def test_unreachable_server_exits_3() -> None:
    proc = run_cli("--batch", "--backend", "url", "--url", "http://127.0.0.1:9", "--requests", "5")
    assert proc.returncode == 3, proc.stderr
    assert "backend unavailable" in proc.stderr


def test_out_dir_keeps_events_requests_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli("--batch", "--requests", "200", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["event"] == "summary"
    requests = (out / "requests.jsonl").read_text().splitlines()
    assert len(requests) == 200
    assert (out / "events.jsonl").read_text().splitlines()[-1] == proc.stdout.splitlines()[-1]
    # The factsheet: JSON valid against the published schema, Markdown with the headline and every section.
    import jsonschema

    from tests.fakes import PUBLISHED_SCHEMA

    factsheet = json.loads((out / "factsheet.json").read_text())
    jsonschema.validate(factsheet, json.loads(PUBLISHED_SCHEMA.read_text()), cls=jsonschema.Draft202012Validator)
    assert factsheet["performance"]["e2e"]["p99_s"] == pytest.approx(summary["p99_s"], abs=1e-5)
    # It describes the workload that ran (--requests 200), not the profile file's 2,000.
    assert factsheet["workload"]["requests"] == 200
    page = (out / "factsheet.md").read_text()
    for heading in (
        "## Headline",
        "## System",
        "## Configuration",
        "## Workload",
        "## Performance",
        "## Sustainability",
        "## Provenance",
        "## Caveats",
    ):
        assert heading in page
    assert "modelled" in page


def test_batch_path_never_imports_textual() -> None:
    code = (
        "import sys, io\n"
        "from console.cli import main\n"
        "rc = main(['--batch', '--requests', '50'])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('textual', 'textual_plotext', 'plotext'))\n"
        "assert rc == 0, rc\n"
        "assert not bad, bad\n"
        "assert 'console.app' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("module", ["core"])
def test_core_never_imports_console_or_textual(module: str) -> None:
    offenders = []
    for path in (REPO / module).rglob("*.py"):
        text = path.read_text()
        for banned in ("import textual", "from textual", "from console", "import console"):
            if banned in text:
                offenders.append(f"{path.relative_to(REPO)}: {banned}")
    assert not offenders


def test_mode_saber_is_the_mode_in_the_summary_and_the_factsheet(tmp_path: Path) -> None:
    """--mode reaches the job on one channel (the profile's mode) and the mode that ran is reported."""
    out = tmp_path / "saber"
    proc = run_cli("--batch", "--mode", "saber", "--requests", "200", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = events(proc.stdout)
    assert lines[0]["scheduling_mode"] == "saber" and lines[0]["backend"]["mode"] == "saber"
    assert lines[-1]["scheduling_mode"] == "saber"
    assert json.loads((out / "summary.json").read_text())["scheduling_mode"] == "saber"
    factsheet = json.loads((out / "factsheet.json").read_text())
    assert factsheet["configuration"]["scheduling_mode"] == "saber"
    assert "Scheduling mode: saber" in (out / "factsheet.md").read_text()
    # Without --mode the profile's own mode runs and is reported.
    assert events(run_cli("--batch", "--requests", "50").stdout)[-1]["scheduling_mode"] == "fcfs"


def test_unknown_mode_is_a_usage_error_that_names_the_modes() -> None:
    proc = run_cli("--batch", "--mode", "sabre", "--requests", "10")
    assert proc.returncode == 2
    assert "saber" in proc.stderr and "Traceback" not in proc.stderr


def test_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    proc = run_cli("--version")
    # Then whether the hot modules run compiled (setup.py): "(pure Python)" from a source checkout.
    assert proc.returncode == 0 and proc.stdout.strip() == f"slo-console {version('slo-console')} (pure Python)"


@pytest.mark.parametrize("batch", [("--batch",), ()], ids=["batch", "console"])
def test_backend_url_without_url_is_a_usage_error(batch: tuple[str, ...]) -> None:
    proc = run_cli(*batch, "--backend", "url")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "slo-console: --backend url needs --url http://HOST:PORT of a running server"


def test_an_unknown_profile_name_lists_the_shipped_profiles() -> None:
    proc = run_cli("--batch", "--profile", "quickstrat")
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert "did you mean quickstart?" in line
    shipped = sorted(path.stem for path in (REPO / "profiles").glob("*.yaml"))
    assert line.endswith(", ".join(shipped))


def test_an_unknown_field_suggests_the_nearest_known_one(tmp_path: Path) -> None:
    bad = tmp_path / "typos.yaml"
    bad.write_text(
        "name: typos\nworkload:\n  arrival: {kind: poisson, rate_rpz: 2}\n  tasks:\n"
        "    - name: t\n      prompt_tokens: {dist: fixed, value: 8}\n      output_tokens: {dist: fixed, value: 8}\n"
    )
    proc = run_cli("--batch", "--profile", str(bad))
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert "workload.arrival.poisson.rate_rpz: unknown field; did you mean rate_rps?" in line
    bad.write_text("name: typos\nworklod: {}\n")
    [line] = run_cli("--batch", "--profile", str(bad)).stderr.strip().splitlines()
    assert f"{bad}: worklod: unknown field; did you mean workload?" in line


def test_batch_engine_events_come_at_the_progress_cadence_each_the_latest_sample() -> None:
    """Batch (engine_events_with_progress): the engine event before each progress event is the latest engine
    sample the full stream had by then; progress events and the summary are unchanged (docs/batch.md)."""
    import asyncio

    from core.backends.factory import make_backend
    from core.jobs.run import RunOptions, run_workload
    from core.profile import load_profile

    def stream(with_progress: bool) -> list[dict]:
        profile = load_profile("quickstart")
        sink: list[dict] = []
        options = RunOptions(requests=1000, engine_events_with_progress=with_progress)
        asyncio.run(run_workload(profile, make_backend("sim", profile), sink.append, options))
        return sink

    full, thinned = stream(False), stream(True)
    assert [e for e in thinned if e["event"] != "engine"] == [e for e in full if e["event"] != "engine"]
    progress_count = sum(e["event"] == "progress" for e in full)
    engine = [e for e in thinned if e["event"] == "engine"]
    assert 0 < len(engine) <= progress_count + 1 < sum(e["event"] == "engine" for e in full)
    latest = None
    for event in full:
        if event["event"] == "engine":
            latest = event
        elif event["event"] == "progress":
            # in the thinned stream a progress event follows the latest sample, if one came since the last
            before = thinned[thinned.index(event) - 1]
            assert before == latest if latest is not None else before["event"] != "engine"
            latest = None
