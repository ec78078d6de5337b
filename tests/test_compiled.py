"""The mypyc-compiled install (setup.py) prints what the source tree prints, byte for byte.

Skipped unless SLO_CONSOLE_COMPILED_PYTHON names the python of a regular (non-editable) install of this
checkout, which setup.py compiles. How CI runs it (a job beside the pure one; the build takes ~1-3 min):

    python -m venv /tmp/venv-compiled && /tmp/venv-compiled/bin/pip install .
    SLO_CONSOLE_COMPILED_PYTHON=/tmp/venv-compiled/bin/python pytest tests/test_compiled.py

When the variable is set but that install came out pure (setup.py fell back: no compiler, mypyc refused the
sources), the test fails instead of skipping: the job is there to catch exactly that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPILED_PYTHON = os.environ.get("SLO_CONSOLE_COMPILED_PYTHON")

pytestmark = pytest.mark.skipif(not COMPILED_PYTHON, reason="SLO_CONSOLE_COMPILED_PYTHON is unset")

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


def test_the_install_is_compiled(tmp_path: Path) -> None:
    proc = _installed(["-c", "import core; print(len(core.compiled()), len(core.COMPILED_MODULES))"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    built, listed = map(int, proc.stdout.split())
    assert built == listed > 0, f"{COMPILED_PYTHON}'s install is not (fully) compiled: {built} of {listed}"


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


@pytest.mark.parametrize("case", CASES)
def test_compiled_stdout_equals_the_source_tree(case: str, tmp_path: Path) -> None:
    args = ["-m", "console", "--batch", *CASES[case]]
    compiled = _installed(args, tmp_path)
    source = subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert compiled.returncode == source.returncode == 0, compiled.stderr + source.stderr
    assert compiled.stdout == source.stdout


def test_compiled_compare_on_two_workers_equals_the_source_tree(tmp_path: Path) -> None:
    """Every mode's run (SLOs-Serve's compiled control modules included) crosses the process pool and back:
    each compiled class on the way must pickle (a compiled frozen dataclass needs its __reduce__). The
    table (stderr) and the summary line, wall-clock fields aside, are the source tree's."""
    from tests.test_executor import printed_table, without_wall

    args = ["-m", "console", "--batch", "--profile", str(ROOT / "profiles/quickstart.yaml"), "--job", "compare"]
    args += ["--requests", "200", "--workers", "2"]
    compiled = _installed(args, tmp_path)
    source = subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
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
for value in (PlannerSettings(512, 4096, 2, 0.7, 0.9, 16), DecodePlan(0.02, 300.0, (0, 2), (1.0, 1.25))):
    assert pickle.loads(pickle.dumps(value)) == value, value
print("ok")
"""


def test_compiled_frozen_dataclasses_pickle(tmp_path: Path) -> None:
    proc = _installed(["-c", FROZEN], tmp_path)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr
