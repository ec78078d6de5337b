"""Kill the tuner mid-run with SIGKILL and start it again with --resume: it finishes without measuring a
finished segment again, and ends where an uninterrupted run ends (issue 4, done-means (d)). Also the
batch contract of `--job tune`: events, the summary line, exit codes for bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.fakes import REPO, events

SUMMARY_FIELDS = {"p50_s", "p95_s", "p99_s", "goodput_rps", "slo_attainment", "requests", "failed"}


def slow_profile(tmp_path: Path) -> Path:
    """The paper's profile with segments long enough (~0.3-1 s each) to be killed between them."""
    data = yaml.safe_load((REPO / "profiles/slo-tuner-paper.yaml").read_text())
    data["engine"]["calibration"] = str(REPO / "profiles" / data["engine"]["calibration"])
    # The paper's hill-climb: its segments are journaled one by one (the guided default's simulator sweep
    # is not journaled, and at this segment length it would take minutes).
    data["tuner"] = {"algorithm": "hillclimb", "sim_min_requests": 12000, "sim_min_duration_s": 60}
    path = tmp_path / "tune-slow.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def tune_command(profile: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "console",
        "--batch",
        "--profile",
        str(profile),
        "--job",
        "tune",
        "--out",
        str(out),
        *extra,
    ]


def journal_segments(path: Path) -> list[dict]:
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn last line while the writer is mid-append
        if entry.get("kind") == "segment":
            found.append(entry)
    return found


def test_killed_tuner_resumes_without_repeating_a_finished_segment(tmp_path: Path) -> None:
    profile = slow_profile(tmp_path)
    out = tmp_path / "run"
    journal = out / "tune-journal.jsonl"
    proc = subprocess.Popen(tune_command(profile, out), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(journal_segments(journal)) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed; make its segments longer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = journal_segments(journal)
    assert len(before) >= 4
    finished_keys = {entry["key"] for entry in before}

    resumed = subprocess.run(
        tune_command(profile, out, "--resume"), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    lines = events(resumed.stdout)
    segments = [e for e in lines if e["event"] == "tune_segment"]
    from_journal = [e for e in segments if e["source"] == "journal"]
    measured_now = [e for e in segments if e["source"] == "measured"]
    assert len(from_journal) == len(before)
    after = journal_segments(journal)
    keys = [entry["key"] for entry in after]
    assert len(keys) == len(set(keys)), "a segment was journaled twice"
    assert finished_keys <= set(keys)
    assert len(after) == len(before) + len(measured_now)

    # The resumed run ends exactly where an uninterrupted one does.
    fresh = subprocess.run(
        tune_command(profile, tmp_path / "fresh"), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert fresh.returncode == 0, fresh.stderr
    resumed_summary, fresh_summary = events(resumed.stdout)[-1], events(fresh.stdout)[-1]
    assert resumed_summary["tuned_knobs"] == fresh_summary["tuned_knobs"]
    assert resumed_summary["p99_s"] == fresh_summary["p99_s"]
    assert resumed_summary["segments_used"] == fresh_summary["segments_used"]


def test_tune_batch_prints_steps_and_a_summary_line_with_the_headline_fields(tmp_path: Path) -> None:
    result = subprocess.run(
        tune_command(Path("slo-tuner-paper"), tmp_path / "out"), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    lines = events(result.stdout)
    assert lines[0]["event"] == "start" and lines[0]["job"] == "tune"
    steps = [e for e in lines if e["event"] == "tune_step"]
    assert len(steps) == 8
    tune_summary = next(e for e in lines if e["event"] == "tune_summary")
    assert tune_summary["baseline"]["p99_s"] > 1.2 >= tune_summary["tuned"]["p99_s"]
    summary = lines[-1]
    assert summary["event"] == "summary" and summary["job"] == "tune"
    assert summary.keys() >= SUMMARY_FIELDS | {"tuned_knobs", "baseline_goodput_rps", "segments_used"}
    assert (tmp_path / "out" / "summary.json").exists()


def test_bad_tuner_field_is_one_line_and_exit_2(tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "profiles/slo-tuner-paper.yaml").read_text())
    data["engine"]["calibration"] = str(REPO / "profiles" / data["engine"]["calibration"])
    data["tuner"] = {"stepz": 3}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    result = subprocess.run(tune_command(path, tmp_path / "o"), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "tuner.stepz" in errors[0]


def test_resume_of_another_run_is_refused_with_exit_2(tmp_path: Path) -> None:
    out = tmp_path / "o"
    first = subprocess.run(tune_command(Path("slo-tuner-paper"), out), cwd=REPO, capture_output=True, text=True)
    assert first.returncode == 0
    second = subprocess.run(
        tune_command(Path("slo-tuner-paper"), out, "--resume", "--seed", "9"), cwd=REPO, capture_output=True, text=True
    )
    assert second.returncode == 2
    assert "different run" in second.stderr and "--resume" in second.stderr


def test_ctrl_c_stops_with_130_keeps_the_journal_and_resume_finishes(tmp_path: Path) -> None:
    profile = slow_profile(tmp_path)
    out = tmp_path / "run"
    journal = out / "tune-journal.jsonl"
    proc = subprocess.Popen(
        tune_command(profile, out), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while len(journal_segments(journal)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before Ctrl-C; make its segments longer"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    last = events(stdout)[-1]
    assert last["event"] == "summary" and last["interrupted"] is True
    assert "--resume" in stderr
    kept = journal_segments(journal)
    assert len(kept) >= 3
    resumed = subprocess.run(
        tune_command(profile, out, "--resume"), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    sources = [e["source"] for e in events(resumed.stdout) if e["event"] == "tune_segment"]
    assert sources.count("journal") == len(kept)
