"""EngineSample: a snapshot of a serving engine, from the simulator's state or a live server's /metrics.

Its own module, compiled (core.COMPILED_MODULES): the simulator takes one every half virtual second (47k in a
100k-request bench-chat run), and built through the interpreter the dataclass's generated `__init__` cost
~2.2k instructions a sample (1.3% of the run). backend_api.py, the seam that speaks it, imports it from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.pickling import reduce_by_fields


@dataclass(slots=True)
class EngineSample:
    """A snapshot of the engine, from the simulator's state or a live server's /metrics."""

    time_s: float
    running: int
    waiting: int
    kv_usage: float  # 0..1
    preemptions_total: int = 0
    generated_tokens_total: int = 0
    spec_draft_tokens_total: int | None = None
    spec_accepted_tokens_total: int | None = None
    power_w: float | None = None
    # The engine's cumulative busy seconds at the sample (the simulator's; modelled energy integrates it, so an
    # idle gap between two samples adds nothing). A field, not an `extra` key: a dict per sample was 8 MiB of a
    # 100k-request run's 47k samples.
    busy_s: float | None = None
    extra: dict[str, float] | None = None  # a live server's other counters (core/serve/prom.py)

    def __init__(
        self,
        time_s: float,
        running: int,
        waiting: int,
        kv_usage: float,
        preemptions_total: int = 0,
        generated_tokens_total: int = 0,
        spec_draft_tokens_total: int | None = None,
        spec_accepted_tokens_total: int | None = None,
        power_w: float | None = None,
        busy_s: float | None = None,
        extra: dict[str, float] | None = None,
    ) -> None:
        # The dataclass's own __init__, written out (slos_serve/admission.py's NATIVE_INIT: compiled, a written-out
        # __init__ is the native constructor; tests/test_written_out_inits.py holds it to the generated one).
        self.time_s = time_s
        self.running = running
        self.waiting = waiting
        self.kv_usage = kv_usage
        self.preemptions_total = preemptions_total
        self.generated_tokens_total = generated_tokens_total
        self.spec_draft_tokens_total = spec_draft_tokens_total
        self.spec_accepted_tokens_total = spec_accepted_tokens_total
        self.power_w = power_w
        self.busy_s = busy_s
        self.extra = extra

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)
