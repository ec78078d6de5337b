"""SLOs-Serve's fixed-seed runs stay what they were: speed work on its planner must not change results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.slos_serve_fingerprint import CASES, fingerprint_case

PINNED = json.loads((Path(__file__).parent / "data" / "slos_serve_fingerprints.json").read_text())["cases"]


def test_every_case_is_pinned() -> None:
    assert set(PINNED) == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_slos_serve_runs_stay_what_they_were(name: str) -> None:
    # Regenerate with tests/data/make_slos_serve_fingerprints.py only for a deliberate model or algorithm change.
    assert fingerprint_case(name) == PINNED[name]
