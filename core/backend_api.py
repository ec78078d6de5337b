"""One interface for "serve this load, give me each request's token timeline".

The simulator and live servers both implement `Backend`, so metrics, tuner, policies, batch runner and
console never care which world they run in. A backend drives the whole load plan (open-loop arrivals or
closed-loop clients) because how clients wait differs between worlds: the simulator advances a virtual
clock, a live backend awaits real HTTP streams.

This is the bottom layer of the seam (it imports only core/records.py, and core/load_plan.py and
core/engine_sample.py, whose LoadPlan and EngineSample it speaks): the simulator, the workload builder, the
server manager and the energy meters all speak these types, and none of them may import the backends package
above them (the layers are checked by `lint-imports`, see pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.engine_sample import EngineSample
from core.load_plan import LoadPlan
from core.records import RequestRecord


class BackendUnavailable(RuntimeError):
    """The backend cannot serve at all (server down, engine missing). Batch exit code 3."""


class RunObserver(Protocol):
    def on_record(self, record: RequestRecord) -> None: ...

    def on_engine_sample(self, sample: EngineSample) -> None: ...


@dataclass(slots=True, repr=False)
class RunOutcome:
    records: list[RequestRecord]
    duration_s: float  # run clock from start to the last completion
    samples: list[EngineSample] = field(default_factory=list)
    interrupted: bool = False
    notes: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"RunOutcome(records={len(self.records)}, duration_s={self.duration_s}, interrupted={self.interrupted})"


class Backend(Protocol):
    """Serve a load plan and report each request. Implementations: `SimBackend`, live backends."""

    name: str

    def describe(self) -> dict[str, Any]:
        """Engine, version, model and hardware facts for the factsheet."""
        ...

    async def run(self, plan: LoadPlan, observer: RunObserver | None = None) -> RunOutcome: ...

    async def close(self) -> None: ...


class CallbackObserver:
    """Adapts two plain callables to `RunObserver`."""

    def __init__(
        self,
        on_record: Callable[[RequestRecord], None] | None = None,
        on_engine_sample: Callable[[EngineSample], None] | None = None,
    ) -> None:
        self._on_record = on_record
        self._on_sample = on_engine_sample

    def on_record(self, record: RequestRecord) -> None:
        if self._on_record is not None:
            self._on_record(record)

    def on_engine_sample(self, sample: EngineSample) -> None:
        if self._on_sample is not None:
            self._on_sample(sample)
