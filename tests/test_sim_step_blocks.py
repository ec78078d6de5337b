"""Step end times kept in blocks (core/sim/blocks.STEP_BLOCK) give the same records whatever the block size.

With the default block, a test-sized run never leaves the first block; with blocks of a few steps nearly every
request's timeline spans several, so the copying path (`_step_span`) and the block switch inside the decode
runs are both exercised, on the fast path and the step-by-step reference, with preemptions.

Each module that reads STEP_BLOCK holds its own name for it (`from core.sim.blocks import STEP_BLOCK`: a global
read, not an attribute lookup, in the decode runs' loop), so the test sets it in every one of them.
"""

from __future__ import annotations

import sys

import pytest

from core.sim import blocks, decode_runs, replica
from tests.test_sim_fast_path import _run, assert_same_records

PROFILES = ["bench-chat", "quickstart"]


@pytest.mark.parametrize("reference", [False, True])
@pytest.mark.parametrize("name", PROFILES)
def test_tiny_step_blocks_give_the_same_records(name: str, reference: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    default, default_samples = _run(name, "fcfs", reference=reference)
    patched = _set_step_block(monkeypatch, 7)
    assert {replica.__name__, decode_runs.__name__} <= patched
    blocked, blocked_samples = _run(name, "fcfs", reference=reference)
    assert_same_records(blocked, default)
    assert blocked_samples == default_samples
    # Most timelines crossed a block boundary (so the test is not passing on views of one block).
    assert sum(len(r.chunk_times) > 7 for r in blocked if r.chunk_times is not None) > len(blocked) // 2


def _set_step_block(monkeypatch: pytest.MonkeyPatch, size: int) -> set[str]:
    """Set STEP_BLOCK in every loaded module of core.sim that has one; returns their names."""
    patched = set()
    default = blocks.STEP_BLOCK
    for name, module in list(sys.modules.items()):
        if name.startswith("core.sim.") and hasattr(module, "STEP_BLOCK"):
            assert default == module.STEP_BLOCK
            monkeypatch.setattr(module, "STEP_BLOCK", size)
            patched.add(name)
    return patched
