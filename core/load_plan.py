"""LoadPlan: the load a backend is asked to serve (the seam's request side; backend_api.py imports it).

Its own module, compiled (core.COMPILED_MODULES): the simulator's client driver reads the plan's limits once or
twice per request (may_take, is_warmup, the duration and concurrency caps: ~600k reads in a 100k-request run),
and an interpreted dataclass's fields are read from compiled code through the generic attribute lookup.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from core.pickling import reduce_by_fields
from core.records import RequestSpec


@dataclass(slots=True)
class LoadPlan:
    """The load to offer. `requests` is consumed lazily so closed-loop runs can be open-ended.

    mode "open": each spec is sent at its `arrival_s`; `concurrency` (if set) caps requests in flight,
      later ones wait client-side (like `vllm bench serve --max-concurrency`).
    mode "closed": `concurrency` clients each send their next request when the previous one ends
      (plus `think_time_s`); arrival times are assigned on send.
    The run ends when the requests are exhausted, `max_requests` were sent, or `duration_s` has passed
    (no new sends after it; requests in flight are allowed to finish).
    """

    requests: Iterator[RequestSpec]
    mode: Literal["open", "closed"] = "open"
    concurrency: int | None = None
    think_time_s: float = 0.0
    max_requests: int | None = None
    duration_s: float | None = None
    # Requests sent before this time (or the first `warmup_requests`) are flagged warmup and discarded.
    warmup_s: float = 0.0
    warmup_requests: int = 0
    # Rows in the replayed trace file (None: synthetic arrivals); the run reports how many of them it sent.
    trace_rows: int | None = None

    def __init__(
        self,
        requests: Iterator[RequestSpec],
        mode: Literal["open", "closed"] = "open",
        concurrency: int | None = None,
        think_time_s: float = 0.0,
        max_requests: int | None = None,
        duration_s: float | None = None,
        warmup_s: float = 0.0,
        warmup_requests: int = 0,
        trace_rows: int | None = None,
    ) -> None:
        # The dataclass's own __init__, written out (slos_serve/admission.py's NATIVE_INIT: compiled, a written-out
        # __init__ is the native constructor; tests/test_written_out_inits.py holds it to the generated one).
        self.requests = requests
        self.mode = mode
        self.concurrency = concurrency
        self.think_time_s = think_time_s
        self.max_requests = max_requests
        self.duration_s = duration_s
        self.warmup_s = warmup_s
        self.warmup_requests = warmup_requests
        self.trace_rows = trace_rows

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)
