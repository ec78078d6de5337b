"""The README's first command prints the same summary line, byte for byte, as the stored golden copy.

Refactors that move code (issue 20) must not change a single number; a change that means to (a new metric,
a model fix) regenerates the copy with SLO_CONSOLE_UPDATE_GOLDEN=1 and says so in its commit message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "quickstart-summary.json"
UPDATE_GOLDEN = os.environ.get("SLO_CONSOLE_UPDATE_GOLDEN") == "1"


def test_quickstart_summary_is_byte_identical_to_the_golden_copy() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "console", "--batch", "--profile", "profiles/quickstart.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    summary = done.stdout.splitlines()[-1] + "\n"
    assert '"event":"summary"' in summary
    if UPDATE_GOLDEN:
        GOLDEN.write_text(summary, encoding="utf-8")
    hint = "if the change is intended, rerun with SLO_CONSOLE_UPDATE_GOLDEN=1 and review the diff"
    assert summary == GOLDEN.read_text(encoding="utf-8"), f"{GOLDEN} differs; {hint}"
