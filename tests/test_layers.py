"""The import layers of pyproject.toml's [tool.importlinter] hold (the same check as `lint-imports` in .ci/run):
layers only point down, core never imports the console or Textual, no circle between sibling modules."""

from __future__ import annotations

import subprocess
import sys

from tests.fakes import REPO

# In a child process: import-linter sets up logging for itself, which would leak into later tests' caplog.
LINT = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"


def test_import_contracts_are_kept() -> None:
    done = subprocess.run([sys.executable, "-c", LINT], cwd=REPO, capture_output=True, text=True, timeout=120)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert "0 broken" in report, report
