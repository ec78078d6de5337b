"""slo-console killed mid-job (issue 25, item 2): every file in --out reads back, and a tune resumes to the
same answer.

A SIGKILL runs no handler, no `finally`: whatever was being written stays as it is. The guarantee
(core/durable_files.py): every JSONL line parses, but a last line the kernel cut at a page boundary (no
newline, the file's size a multiple of the page size), which readers drop; summary.json,
factsheet.json/.md, calibration.yaml and sweep.json are absent or whole; a `--resume` of a killed or
interrupted tune finishes from its journal with the answer an uninterrupted run gives (same seed).
The tune journal's own resume tests are in test_tune_resume.py; SIGKILL with a vLLM in test_vllm_kill.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from core.backend_api import LoadPlan, RunOutcome
from core.calibrate.sweep import run_sweep
from core.calibrate.sweep_points import SweepSettings
from core.calibrate.sweep_targets import SimTarget
from core.durable_files import JsonlAppender, replace_atomically, whole_lines
from core.profile import load_profile
from core.serve.process_group import group_members
from tests.fakes import REPO, events
from tests.fakeserver import FakeOpenAIServer, StreamReply
from tests.test_calibrate import known_calibration
from tests.test_tune_resume import journal_segments, slow_profile, tune_command

WHOLE_FILES = ("summary.json", "factsheet.json", "factsheet.md", "calibration.yaml", "sweep.json")


PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def assert_every_file_whole(out: Path) -> None:
    """Every JSONL line parses and ends with its newline, but a last line torn where the kernel stops a write
    for SIGKILL (a page boundary); each whole-file output is absent or complete."""
    for path in out.glob("*.jsonl"):
        data = path.read_bytes()
        torn = not data.endswith(b"\n") and bool(data)
        assert not torn or len(data) % PAGE_SIZE == 0, f"{path.name}: torn last line {data[-80:]!r} off a page boundary"
        for number, line in enumerate(whole_lines(data), start=1):
            try:
                json.loads(line)
            except ValueError:
                raise AssertionError(f"{path.name}: line {number} does not parse: {line[:120]!r}") from None
    for name in WHOLE_FILES:
        path = out / name
        if not path.exists():
            continue
        text = path.read_text()
        assert text.endswith("\n"), f"{name}: cut short"
        if name.endswith(".json"):
            json.loads(text)


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen[Any], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, "the job ended before it could be killed; make it longer"
        assert time.monotonic() < deadline, "the job never reached the point to kill it at"
        time.sleep(0.02)


# ---------------------------------------------------------------- the writers themselves


def test_a_jsonl_line_is_one_system_call_and_survives_a_sigkill_loop(tmp_path: Path, monkeypatch: Any) -> None:
    calls: list[bytes] = []
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: calls.append(bytes(data)) or real_write(fd, data))
    appender = JsonlAppender(tmp_path / "a.jsonl", truncate=True)
    appender.write_line(json.dumps({"x": "y" * 20000}))
    appender.close()
    monkeypatch.undo()
    assert len(calls) == 1 and calls[0].endswith(b"}\n")

    # A writer killed while it writes as fast as it can: whatever is on disk is whole lines.
    path = tmp_path / "b.jsonl"
    writer = (
        "import json,sys; from pathlib import Path; from core.durable_files import JsonlAppender\n"
        "a = JsonlAppender(Path(sys.argv[1]), truncate=True)\n"
        "i = 0\n"
        "while True:\n"
        "    a.write_line(json.dumps({'i': i, 'pad': 'z' * (i % 3000)})); i += 1\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", writer, str(path)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    try:
        wait_until(lambda: path.exists() and path.stat().st_size > 2_000_000, proc, timeout_s=60)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert_every_file_whole(tmp_path)
    data = path.read_bytes()
    numbers = [json.loads(line)["i"] for line in whole_lines(data)]
    assert numbers == list(range(len(numbers))) and len(numbers) > 100
    # A torn tail (1 kill in ~60 here) is the start of exactly the next line, nothing else.
    tail = data[data.rfind(b"\n") + 1 :]
    n = len(numbers)
    assert json.dumps({"i": n, "pad": "z" * (n % 3000)}).encode().startswith(tail)


def test_only_a_last_line_cut_at_a_page_boundary_counts_as_killed_mid_write(tmp_path: Path) -> None:
    line = b'{"pad": "' + b"z" * 90 + b'"}\n'
    whole = line * (2 * PAGE_SIZE // len(line) + 1)
    (tmp_path / "a.jsonl").write_bytes(whole[: 2 * PAGE_SIZE])  # what a SIGKILL between two page copies leaves
    assert_every_file_whole(tmp_path)
    assert len(whole_lines((tmp_path / "a.jsonl").read_bytes())) == 2 * PAGE_SIZE // len(line)
    for damaged in (
        whole[: 2 * PAGE_SIZE - 7],
        whole[: len(line)] + whole[len(line) + 9 :],
    ):  # off a page; torn inside the file
        (tmp_path / "a.jsonl").write_bytes(damaged)
        with pytest.raises(AssertionError):
            assert_every_file_whole(tmp_path)


def test_replace_atomically_keeps_the_old_file_until_the_new_one_is_whole(tmp_path: Path, monkeypatch: Any) -> None:
    target = tmp_path / "summary.json"
    replace_atomically(target, '{"old": 1}\n')

    def dies(*_: Any) -> None:
        raise OSError("killed before the rename")

    monkeypatch.setattr(os, "replace", dies)
    with pytest.raises(OSError):
        replace_atomically(target, '{"new": 2}\n')
    monkeypatch.undo()
    assert target.read_text() == '{"old": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # no partial file left behind
    replace_atomically(target, '{"new": 2}\n')
    assert json.loads(target.read_text()) == {"new": 2}


# Run in a child: every write to the file named in argv[2] writes half its text, then the process SIGKILLs
# itself (a kill landing in the middle of writing that file).
KILLED_WHILE_WRITING = """
import io, os, signal, sys
from pathlib import Path
real_open = io.open

class HalfThenKilled:
    def __init__(self, fh):
        self.fh = fh
    def write(self, text):
        self.fh.write(text[: len(text) // 2])
        self.fh.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    def __getattr__(self, name):
        return getattr(self.fh, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.fh.close()

def dying_open(file, mode="r", *args, **kwargs):
    fh = real_open(file, mode, *args, **kwargs)
    name = os.path.basename(str(file))
    watched = sys.argv[2]
    return HalfThenKilled(fh) if "w" in mode and (name == watched or name.startswith("." + watched)) else fh

io.open = dying_open
from console.batch import run_batch
from core.jobs.options import OperatorOptions
run_batch(OperatorOptions(profile="quickstart", requests=200, speed=None, out=Path(sys.argv[1])))
"""


@pytest.mark.parametrize("name", ["summary.json", "factsheet.json", "factsheet.md"])
def test_killed_while_writing_a_whole_file_leaves_it_absent_not_cut(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WHILE_WRITING, str(out), name],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    assert not (out / name).exists(), f"{name} was left cut short: {(out / name).read_text()[:200]!r}"
    assert_every_file_whole(out)


# ---------------------------------------------------------------- a tune killed at several points


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("fresh")
    profile = slow_profile(tmp)
    done = subprocess.run(tune_command(profile, tmp / "out"), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return profile, events(done.stdout)[-1]


# (signal, finished segments to wait for): before any segment is journaled, in the middle, near the end.
KILL_POINTS = [(signal.SIGKILL, 0), (signal.SIGKILL, 6), (signal.SIGINT, 2), (signal.SIGINT, 10)]


@pytest.mark.parametrize(("sig", "segments"), KILL_POINTS, ids=[f"{s.name}-after-{n}" for s, n in KILL_POINTS])
def test_a_killed_tune_leaves_whole_files_and_resumes_to_the_uninterrupted_answer(
    tmp_path: Path, uninterrupted: tuple[Path, dict[str, Any]], sig: signal.Signals, segments: int
) -> None:
    profile, fresh = uninterrupted
    out = tmp_path / "run"
    journal = out / "tune-journal.jsonl"
    proc = subprocess.Popen(tune_command(profile, out), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if segments == 0:
            wait_until(lambda: journal.exists() and journal.stat().st_size > 0, proc)
        else:
            wait_until(lambda: len(journal_segments(journal)) >= segments, proc)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (-signal.SIGKILL if sig == signal.SIGKILL else 130)
    assert_every_file_whole(out)
    kept = journal_segments(journal)
    assert len(kept) >= segments
    if sig == signal.SIGINT:  # Ctrl-C ends the job like an end: its summary says it was interrupted
        assert json.loads((out / "summary.json").read_text())["interrupted"] is True

    resumed = subprocess.run(
        tune_command(profile, out, "--resume"), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    assert_every_file_whole(out)
    sources = [e["source"] for e in events(resumed.stdout) if e["event"] == "tune_segment"]
    assert sources.count("journal") == len(kept)
    final = json.loads((out / "summary.json").read_text())
    for field in ("tuned_knobs", "p99_s", "goodput_rps", "segments_used"):
        assert final[field] == fresh[field], field


# ---------------------------------------------------------------- calibrate against a server that is not vLLM


def test_calibrate_interrupted_or_killed_leaves_whole_files(tmp_path: Path) -> None:
    """`--job calibrate` refuses the simulator; against a scripted server (tests/fakeserver.py) it sweeps
    until stopped: Ctrl-C keeps the sweep measured so far (sweep.json, whole), SIGKILL leaves whole lines."""

    async def scenario() -> dict[str, int]:
        codes: dict[str, int] = {}
        async with FakeOpenAIServer(StreamReply(chunk_delay_s=0.002)) as fake:
            for sig in (signal.SIGINT, signal.SIGKILL):
                out = tmp_path / sig.name
                argv = [
                    sys.executable,
                    "-m",
                    "console",
                    "--batch",
                    "--profile",
                    str(REPO / "profiles" / "vllm-cpu-tiny.yaml"),
                    "--job",
                    "calibrate",
                ]
                argv += ["--backend", "url", "--url", fake.base_url, "--out", str(out)]
                served_before = len(fake.bodies)
                proc = await asyncio.create_subprocess_exec(
                    *argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
                try:
                    deadline = time.monotonic() + 120
                    # Kill mid-sweep, once the server has answered 10 completions: the first point (decode c1:
                    # one warm-up and 6 measured requests) has finished one repeat, the sweep is far from done.
                    while len(fake.bodies) - served_before < 10:
                        assert proc.returncode is None and time.monotonic() < deadline, "calibrate ended too soon"
                        await asyncio.sleep(0.01)
                    assert proc.returncode is None, "calibrate ended before it could be killed"
                    proc.send_signal(sig)
                    await asyncio.wait_for(proc.wait(), 60)
                finally:
                    if proc.returncode is None:
                        proc.kill()
                        await proc.wait()
                codes[sig.name] = proc.returncode
                assert_every_file_whole(out)
        return codes

    codes = asyncio.run(scenario())
    assert codes == {"SIGINT": 130, "SIGKILL": -signal.SIGKILL}
    sweep = json.loads((tmp_path / "SIGINT" / "sweep.json").read_text())
    assert sweep["interrupted"] is True
    assert len(sweep["points"]) >= 1, "the interrupted sweep kept nothing of what it measured"
    assert not (tmp_path / "SIGINT" / "calibration.yaml").exists()  # no fit from a partial sweep


class CancelledAtRun(SimTarget):
    """The simulator, until Ctrl-C lands as a CancelledError at the `runs`-th run (between two of a point's
    requests, or while /metrics is read: the run returns nothing it measured)."""

    def __init__(self, runs: int) -> None:
        super().__init__(known_calibration())
        self.runs_left = runs

    async def run(self, plan: LoadPlan) -> RunOutcome:
        if self.runs_left == 0:
            raise asyncio.CancelledError
        self.runs_left -= 1
        return await super().run(plan)


def test_a_sweep_cancelled_mid_point_keeps_the_repeats_it_finished() -> None:
    """The sweep said 'the points measured so far are in sweep.json' and kept none of a group's repeats
    when the cancellation arrived as an exception (decode repeats are interleaved and summed per group)."""
    profile = load_profile("profiles/vllm-cpu-tiny.yaml")
    found: list[dict[str, Any]] = []
    sweep = asyncio.run(
        run_sweep(CancelledAtRun(runs=3), SweepSettings.reduced(), profile.knobs, with_spec=False, sink=found.append)
    )
    assert sweep.interrupted
    assert len(sweep.points) == 3 and [e["event"] for e in found].count("calibrate_point") == 3


# ---------------------------------------------------------------- the standalone gateway


def test_gateway_ctrl_c_ends_with_its_account_and_sigkill_leaves_no_child(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with FakeOpenAIServer(StreamReply()) as fake:
            for sig in (signal.SIGINT, signal.SIGKILL):
                argv = [sys.executable, "-m", "console", "gateway", "--profile", "quickstart"]
                argv += ["--upstream", fake.base_url, "--port", "0"]
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=REPO,
                    start_new_session=True,
                    env={**os.environ, "PYTHONPATH": str(REPO)},
                )
                try:
                    assert process.stderr is not None and process.stdout is not None
                    line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
                    url = re.search(r"serving on (http://\S+)", line)
                    assert url, line
                    body = {"model": "fake-model", "prompt": "hi", "max_tokens": 3, "stream": True}
                    async with aiohttp.ClientSession() as session:
                        for _ in range(3):
                            async with session.post(url.group(1) + "/v1/completions", json=body) as response:
                                assert response.status == 200
                                await response.read()
                    process.send_signal(sig)
                    code = await asyncio.wait_for(process.wait(), 30)
                    if sig == signal.SIGINT:
                        assert code == 130
                        lines = [json.loads(x) for x in (await process.stdout.read()).decode().splitlines()]
                        assert lines[-1]["event"] == "gateway_stopped"
                        assert (lines[-1]["received"], lines[-1]["completed"]) == (3, 3)
                    else:
                        assert code == -signal.SIGKILL
                        # Nothing it started outlives it: its session (= process group) is empty.
                        deadline = time.monotonic() + 10
                        while group_members(process.pid) and time.monotonic() < deadline:
                            await asyncio.sleep(0.1)
                        assert group_members(process.pid) == []
                finally:
                    if process.returncode is None:
                        os.killpg(process.pid, signal.SIGKILL)
                        await process.wait()

    asyncio.run(scenario())
