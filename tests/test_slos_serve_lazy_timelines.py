"""SLOs-Serve's lazy timelines: a stretch's tokens left owed to the decoding requests give the same answers.

With a planner that sets `lazy_timelines` (SLOs-Serve's), the stepwise replica appends a stretch's step ends to
its `stretch_log` instead of writing them into every decoding request's token count and timeline
(StepRequest.owed_from); `plan`, a completion or a preemption settles them first, and the planner's `sync`
counts the log. Held here to the same replica with the flag off (every segment settled at once, as before) and
to the step-by-step reference: the same records, engine samples and, at every admission decision, the same
progress reported to the controller's virtual replica.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from core.backend_api import EngineSample
from core.control.slos_serve import stepping
from core.control.slos_serve.virtual import VirtualReplica
from core.records import RequestRecord
from tests.fakes import compiled
from tests.test_sim_fast_path import _run as run_profile
from tests.test_sim_fast_path import assert_same_records

REQUESTS = 300


def _run(
    monkeypatch: pytest.MonkeyPatch, profile: str, *, lazy: bool, reference: bool = False
) -> tuple[list[RequestRecord], list[EngineSample], list[tuple[Any, ...]], list[int]]:
    """One run, with the virtual replicas' records after every progress report and, at each `sync`, the log's
    length."""
    observed: list[tuple[Any, ...]] = []
    logged: list[int] = []
    with monkeypatch.context() as patch:
        original_init = stepping.SlosServeStepPlanner.__init__
        original_sync = stepping.SlosServeStepPlanner.sync

        def init(self: stepping.SlosServeStepPlanner, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            self.lazy_timelines = lazy

        def sync(self: stepping.SlosServeStepPlanner, virtual: VirtualReplica) -> None:
            if self.replica is not None:
                logged.append(len(self.replica.stretch_log))
            original_sync(self, virtual)
            # What the controller's virtual replica holds after the progress report (sync writes it in place).
            for rid, t in virtual.requests.items():
                observed.append((virtual.index, rid, t.prefill_left, t.decode_left, t.decode_start_s))

        patch.setattr(stepping.SlosServeStepPlanner, "__init__", init)
        patch.setattr(stepping.SlosServeStepPlanner, "sync", sync)
        records, samples = run_profile(profile, "slos-serve", reference=reference, requests=REQUESTS)
    return records, samples, observed, logged


# Turning lazy_timelines off patches SlosServeStepPlanner.__init__, which a compiled policy calls directly
# (tests.fakes.compiled); test_settle_writes_what_the_log_owes needs no patch to hold and runs there too.
@pytest.mark.skipif(compiled(stepping), reason="patches a method of a mypyc-compiled class")
@pytest.mark.parametrize("profile", ["bench-chat", "quickstart", "slos-serve-mixed"])
def test_lazy_timelines_equal_settled_ones_and_the_reference(monkeypatch: pytest.MonkeyPatch, profile: str) -> None:
    lazy, lazy_samples, lazy_observed, logged = _run(monkeypatch, profile, lazy=True)
    settled, settled_samples, settled_observed, settled_logged = _run(monkeypatch, profile, lazy=False)
    reference, reference_samples, reference_observed, _ = _run(monkeypatch, profile, lazy=True, reference=True)
    assert_same_records(lazy, settled)
    assert_same_records(lazy, reference)
    assert lazy_samples == settled_samples == reference_samples
    # The controller hears the same progress at every decision (a stale count there changes admissions only
    # sometimes; this catches it at once).
    assert lazy_observed == settled_observed == reference_observed
    # The lazy path ran: decisions were taken with stretch steps still owed (none with the flag off).
    assert sum(1 for n in logged if n > 0) > 20
    assert not any(settled_logged)


def test_settle_writes_what_the_log_owes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every completed request's timeline is its steps' ends in order, whichever stretch logged them: the
    timelines are strictly increasing and each ends at its record's end (a request settled twice, or owed the
    steps before its first token, breaks one of them)."""
    records, _, _, _ = _run(monkeypatch, "bench-chat", lazy=True)
    assert records
    for record in records:
        times = record.chunk_times
        assert times is not None and len(times) == record.output_tokens, record.request_id
        assert all(a < b for a, b in itertools.pairwise(times)), record.request_id
        assert times[-1] == record.end_s, record.request_id
