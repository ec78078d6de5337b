"""The mypyc-compiled install (setup.py) prints what the source tree prints, byte for byte, and the two builds
read each other's pickles (a Ray worker may run the checkout's pure sources beside a compiled driver).

The first test runs everywhere; the others are skipped unless SLO_CONSOLE_COMPILED_PYTHON names the python of
a regular (non-editable) install of this checkout, which setup.py compiles (~1 min). By hand:

    python -m venv /tmp/venv-compiled && /tmp/venv-compiled/bin/pip install '.[test]'
    SLO_CONSOLE_COMPILED_PYTHON=/tmp/venv-compiled/bin/python pytest tests/test_compiled.py

CI (.ci/run) runs it, and a subset of the suite, with --import-mode=append from the install's own python.

When the variable is set but that install came out pure (setup.py fell back: no compiler, mypyc refused the
sources), the test fails instead of skipping: the job is there to catch exactly that.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPILED_PYTHON = os.environ.get("SLO_CONSOLE_COMPILED_PYTHON")

needs_compiled = pytest.mark.skipif(not COMPILED_PYTHON, reason="SLO_CONSOLE_COMPILED_PYTHON is unset")

# fcfs (the compiled fast path), and slos-serve (the interpreted step-by-step replica on the compiled base).
CASES = {
    "fcfs-quickstart": ["--profile", str(ROOT / "profiles/quickstart.yaml")],
    "fcfs-bench-3k": ["--profile", str(ROOT / "profiles/bench-chat.yaml"), "--requests", "3000"],
    "slos-serve-quickstart-500": [
        "--profile",
        str(ROOT / "profiles/quickstart.yaml"),
        "--mode",
        "slos-serve",
        "--requests",
        "500",
    ],
}


def _installed(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The installed package, from outside the checkout so that the checkout's core/ cannot shadow it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([COMPILED_PYTHON or "", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _source(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The checkout's sources (pure Python), by this interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_every_dataclass_of_a_compiled_module_pickles_by_its_fields() -> None:
    """mypyc's default pickling of a native class and Python's of a slots dataclass cannot read each other's
    (a pure RequestRecord loads into a compiled one with no fields set), so every dataclass that is compiled
    defines its own __reduce__ (by its fields, which both builds construct alike)."""
    import core

    missing = []
    for name in core.COMPILED_MODULES:
        module = importlib.import_module(name)
        for cls in vars(module).values():
            compiled_dataclass = inspect.isclass(cls) and cls.__module__ == name and dataclasses.is_dataclass(cls)
            if compiled_dataclass and "__reduce__" not in vars(cls):
                missing.append(f"{name}.{cls.__name__}")
    assert not missing, f"compiled dataclasses without a __reduce__: {missing}"


# Run by either build: `dump` pickles a small simulator run's RunResult (records with chunk arrays, their
# specs' SLOs, the summary) to stdout; `load` reads one from stdin and prints what a caller reads from it.
ROUND_TRIP = """
import asyncio, pickle, sys
from core.backends.factory import make_backend
from core.events import null_sink
from core.jobs import RunOptions, run_workload
from core.profile import load_profile
if sys.argv[1] == "dump":
    profile = load_profile("quickstart")
    result = asyncio.run(run_workload(profile, make_backend("sim", profile), null_sink, RunOptions(requests=80)))
    sys.stdout.buffer.write(pickle.dumps(result, protocol=5))
else:
    result = pickle.loads(sys.stdin.buffer.read())
    rows = [(r.request_id, r.status, r.e2e_s, r.slo, list(r.chunk_times), r.tier) for r in result.records]
    print(len(rows), result.summary.p99_s, rows)
"""


@needs_compiled
@pytest.mark.parametrize("dump_by, load_by", [("compiled", "source"), ("source", "compiled"), ("source", "source")])
def test_the_builds_read_each_others_pickles(dump_by: str, load_by: str, tmp_path: Path) -> None:
    def run(build: str, *args: str, data: bytes | None = None) -> bytes:
        python, env = (COMPILED_PYTHON or "", {k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        if build == "source":
            python, env = sys.executable, {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            [python, "-c", ROUND_TRIP, *args], input=data, cwd=tmp_path, env=env, capture_output=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr.decode()
        return proc.stdout

    crossed = run(load_by, "load", data=run(dump_by, "dump"))
    assert crossed == run("compiled", "load", data=run("compiled", "dump"))
    assert crossed.startswith(b"80 ")


@needs_compiled
def test_the_install_is_compiled(tmp_path: Path) -> None:
    proc = _installed(["-c", "import core; print(len(core.compiled()), len(core.COMPILED_MODULES))"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    built, listed = map(int, proc.stdout.split())
    assert built == listed > 0, f"{COMPILED_PYTHON}'s install is not (fully) compiled: {built} of {listed}"


@needs_compiled
def test_this_process_runs_the_compiled_install() -> None:
    """CI's compiled step runs its subset with --import-mode=append from the install's own python: the
    modules under test in this process must then be the compiled ones, not the checkout's sources."""
    proc = subprocess.run(
        [COMPILED_PYTHON or "", "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True
    )
    if proc.stdout.strip() != sys.prefix:
        pytest.skip("this pytest runs in another environment than the compiled install")
    import core

    assert sorted(core.compiled()) == sorted(core.COMPILED_MODULES), "run with --import-mode=append"


@needs_compiled
@pytest.mark.parametrize("case", CASES)
def test_compiled_stdout_equals_the_source_tree(case: str, tmp_path: Path) -> None:
    args = ["-m", "console", "--batch", *CASES[case]]
    compiled = _installed(args, tmp_path)
    source = _source(args, tmp_path)
    assert compiled.returncode == source.returncode == 0, compiled.stderr + source.stderr
    assert compiled.stdout == source.stdout


@needs_compiled
def test_compiled_compare_on_two_workers_equals_the_source_tree(tmp_path: Path) -> None:
    """Every mode's run (SLOs-Serve's compiled control modules included) crosses the process pool and back:
    each compiled class on the way must pickle (a compiled frozen dataclass needs its __reduce__). The
    table (stderr) and the summary line, wall-clock fields aside, are the source tree's."""
    from tests.test_executor import printed_table, without_wall

    args = ["-m", "console", "--batch", "--profile", str(ROOT / "profiles/quickstart.yaml"), "--job", "compare"]
    args += ["--requests", "200", "--workers", "2"]
    compiled = _installed(args, tmp_path)
    source = _source(args, tmp_path)
    assert compiled.returncode == source.returncode == 0, compiled.stderr + source.stderr
    assert "slos-serve" in compiled.stdout.splitlines()[-1]
    assert printed_table(compiled.stderr) == printed_table(source.stderr)
    summaries = [json.loads(proc.stdout.splitlines()[-1]) for proc in (compiled, source)]
    assert without_wall(summaries[0]) == without_wall(summaries[1])


# The compiled frozen dataclasses: each unpickles only through its __reduce__ (mypyc's own pickling restores
# by setattr, which frozen refuses). One made of each, by the install's interpreter.
FROZEN = """
import pickle
from core.control.slos_serve.admission import PlannerSettings
from core.control.slos_serve.budget import DecodePlan
from core.control.adaserve.scheduler import PrefillLoad
values = (PlannerSettings(512, 4096, 2, 0.7, 0.9, 16), DecodePlan(0.02, 300.0, (0, 2), (1.0, 1.25)))
for value in (*values, PrefillLoad(96, 2, 2048, True)):
    assert pickle.loads(pickle.dumps(value)) == value, value
print("ok")
"""


@needs_compiled
def test_compiled_frozen_dataclasses_pickle(tmp_path: Path) -> None:
    proc = _installed(["-c", FROZEN], tmp_path)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr
