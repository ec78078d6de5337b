"""Fakes and helpers more than one test file uses (one definition each; tests/conftest.py uses them too).

The scripted OpenAI-compatible server has its own module, tests/fakeserver.py; the simulator fingerprints
theirs, tests/sim_fingerprint.py and tests/adaserve_fingerprint.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import core
from core.controller_api import ControlledRequest
from core.serve.install_probe import ENV_VLLM_PYTHON

REPO = Path(__file__).resolve().parent.parent
# The published factsheet schema in this checkout (core.factsheet.schema writes it; a wheel does not ship it).
PUBLISHED_SCHEMA = REPO / "schema" / "factsheet.schema.json"

# The python of a real vLLM install for the `vllm`-marked tests; tests/conftest.py skips them when unset.
VLLM_PYTHON = os.environ.get(ENV_VLLM_PYTHON)


def compiled(module: ModuleType) -> bool:
    """Whether `module` is mypyc-compiled (a regular install's, tests/test_compiled.py). Compiled callers reach its
    classes' methods directly: a test that monkeypatches one of them sees none of those calls, so such a test
    is skipped there (the pure CI job runs it)."""
    return module.__name__ in core.compiled()


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """`python -m console ARGS` as a user runs it, with its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "console", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def run_batch(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m console --batch ARGS` from the repository root."""
    return run_cli("--batch", *args)


def events(stdout: str) -> list[dict]:
    """The JSON Lines events a batch run printed."""
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


@dataclass
class FakeReplica:
    """A `ReplicaView` (core/controller_api.py) a test fills by hand: what a policy sees of one replica."""

    index: int
    in_flight: dict[int, ControlledRequest] = field(default_factory=dict)
    engine_waiting: int = 0
    kv_usage: float = 0.0

    @property
    def load(self) -> int:
        return len(self.in_flight)
