"""The README's first command prints the same summary line, byte for byte, as the stored golden copy.

Refactors that move code (issue 20) must not change a single number; a change that means to (a new metric,
a model fix) regenerates the copy with SLO_CONSOLE_UPDATE_GOLDEN=1 and says so in its commit message."""

from __future__ import annotations

import os

from tests.fakes import REPO, run_batch

GOLDEN = REPO / "tests" / "golden" / "quickstart-summary.json"
UPDATE_GOLDEN = os.environ.get("SLO_CONSOLE_UPDATE_GOLDEN") == "1"


def test_quickstart_summary_is_byte_identical_to_the_golden_copy() -> None:
    done = run_batch("--profile", "profiles/quickstart.yaml")
    assert done.returncode == 0, done.stderr
    summary = done.stdout.splitlines()[-1] + "\n"
    assert '"event":"summary"' in summary
    if UPDATE_GOLDEN:
        GOLDEN.write_text(summary, encoding="utf-8")
    hint = "if the change is intended, rerun with SLO_CONSOLE_UPDATE_GOLDEN=1 and review the diff"
    assert summary == GOLDEN.read_text(encoding="utf-8"), f"{GOLDEN} differs; {hint}"
