"""Step end times kept in blocks (core/sim/replica.STEP_BLOCK) give the same records whatever the block size.

With the default block, a test-sized run never leaves the first block; with blocks of a few steps nearly every
request's timeline spans several, so the copying path (`_step_span`) and the block switch inside the decode
runs are both exercised, on the fast path and the step-by-step reference, with preemptions.
"""

from __future__ import annotations

import pytest

from core.sim import replica
from tests.test_sim_fast_path import _run, assert_same_records

PROFILES = ["bench-chat", "quickstart"]


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("name", PROFILES)
def test_tiny_step_blocks_give_the_same_records(name: str, reference: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    default, default_samples = _run(name, "fcfs", reference=reference)
    monkeypatch.setattr(replica, "STEP_BLOCK", 7)
    blocked, blocked_samples = _run(name, "fcfs", reference=reference)
    assert_same_records(blocked, default)
    assert blocked_samples == default_samples
    # Most timelines crossed a block boundary (so the test is not passing on views of one block).
    assert sum(len(r.chunk_times) > 7 for r in blocked if r.chunk_times is not None) > len(blocked) // 2
