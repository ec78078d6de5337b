"""Why requests failed, in a few lines: the failed records grouped by status and message shape.

A run on an operator's own traffic can fail most of its requests for one reason (prompts longer than the
model's context, a server that refuses a parameter), and "987 failed" alone sends the user to requests.jsonl.
Messages differ in their numbers (each request's token count), so a cause is the status with the message's
digit runs blanked; each cause keeps its first message as the example a person reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from core.records import RequestRecord, Status

# Policy decisions and the client's account, not faults: judged by attainment, not explained as failures.
NOT_FAULTS = frozenset({Status.OK, Status.REJECTED, Status.DEFERRED, Status.NOT_SENT})
_DIGITS = re.compile(r"\d+")
EXAMPLE_CHARS = 160  # an example message is cut here: an HTTP error body can be a page long


@dataclass(frozen=True, slots=True)
class FailureCause:
    status: str
    example: str  # the first message of this shape, as the record has it (cut to EXAMPLE_CHARS)
    count: int


def failure_causes(records: Iterable[RequestRecord], *, limit: int = 3) -> list[FailureCause]:
    """The `limit` most common causes among failed (faulted) records, most common first, ties in order seen."""
    counts: dict[tuple[str, str], int] = {}
    examples: dict[tuple[str, str], str] = {}
    for record in records:
        if record.status in NOT_FAULTS or record.warmup:
            continue
        message = (record.error or "no message").strip()
        key = (record.status.value, _DIGITS.sub("N", message))
        if key not in counts:
            counts[key] = 0
            examples[key] = message if len(message) <= EXAMPLE_CHARS else message[: EXAMPLE_CHARS - 3] + "..."
        counts[key] += 1
    ranked = sorted(counts, key=lambda key: -counts[key])  # stable: ties keep the order first seen
    return [
        FailureCause(status, examples[(status, shape)], counts[(status, shape)]) for status, shape in ranked[:limit]
    ]


def failures_line(causes: list[FailureCause], faulted: int, requests: int) -> str:
    """ "987 of 1000 requests failed: 987 error (prompt+output 12734 tokens exceeds max_model_len 4096)"."""
    parts = [f"{cause.count} {cause.status} ({cause.example})" for cause in causes]
    shown = sum(cause.count for cause in causes)
    if faulted > shown:
        parts.append(f"{faulted - shown} other")
    return f"{faulted} of {requests} requests failed: " + "; ".join(parts)
