"""The load client's own account of a live run: every planned request, and how well it kept the schedule.

Flat, unit-suffixed keys prefixed `client_`, so they can join the summary event and the factsheet's
`other_metrics` as they are. Empty for the simulator (its client is exact by construction).

planned = completed + failed + not sent, where `client_not_sent` counts requests still queued client-side
when the run's duration ended (records with status not_sent) and `client_failed` counts requests that were
sent and did not complete (error, timeout, cancelled, rejected, deferred). Schedule error is how late each
open-loop request left against its scheduled time; queue wait is the time a request waited client-side for
an in-flight slot (open loop with a concurrency cap).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from core.backend_api import RunOutcome
from core.records import Status


def client_account(outcome: RunOutcome) -> dict[str, Any]:
    notes = outcome.notes
    if "sent" not in notes:
        return {}  # not a live load client's run
    statuses = Counter(record.status for record in outcome.records)
    completed = statuses[Status.OK]
    not_sent = statuses[Status.NOT_SENT]
    account: dict[str, Any] = {
        "client_planned": len(outcome.records),
        "client_completed": completed,
        "client_failed": len(outcome.records) - completed - not_sent,
        "client_not_sent": not_sent,
    }
    for key, name in (("schedule_error_s", "client_schedule_error"), ("client_queue_wait_s", "client_queue_wait")):
        figures = notes.get(key)
        if figures:
            account[f"{name}_p50_s"] = figures["p50"]
            account[f"{name}_p99_s"] = figures["p99"]
    return account
