"""The simulator as a Backend: serves a load plan in virtual time, optionally paced to the wall clock."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

from core.backend_api import LoadPlan, RunObserver, RunOutcome
from core.controller_api import Policy
from core.profile import Calibration, KnobsSpec
from core.sim.engine import SimEngine

PACE_TICK_S = 0.05  # how often a paced run hands control back to the event loop
UNPACED_SLICE_S = 30.0  # virtual seconds simulated between yields when running flat out


class SimBackend:
    """Embedded discrete-event simulator of a vLLM-like engine.

    `speed`: None runs as fast as possible; a number paces virtual time to `speed` x wall time (the console
    uses this so panels move like a live system). `policy_factory` builds the scheduling mode for each run
    (None: fcfs, vLLM's default); `replicas` engine replicas serve behind it on one virtual clock.
    """

    name = "sim"

    def __init__(
        self,
        calibration: Calibration,
        knobs: KnobsSpec,
        *,
        seed: int = 0,
        speed: float | None = None,
        sample_interval_s: float = 0.5,
        policy_factory: Callable[[], Policy] | None = None,
        replicas: int = 1,
    ) -> None:
        self.calibration = calibration
        self.policy_factory = policy_factory
        self.replicas = replicas
        self.knobs = knobs
        self.seed = seed
        self.speed = speed
        self.sample_interval_s = sample_interval_s
        self.last_engine: SimEngine | None = None

    @property
    def mode(self) -> str:
        return "fcfs" if self.policy_factory is None else self.policy_factory().name

    def describe(self) -> dict[str, Any]:
        return {
            "backend": "sim",
            "mode": self.mode,
            "replicas": self.replicas,
            "engine": "simulator",
            "calibration": self.calibration.name,
            "model": self.calibration.model,
            "hardware": self.calibration.hardware,
            "power_model": None if self.calibration.power is None else self.calibration.power.model_dump(),
        }

    async def run(self, plan: LoadPlan, observer: RunObserver | None = None) -> RunOutcome:
        samples = []

        def on_sample(sample):  # type: ignore[no-untyped-def]
            samples.append(sample)
            if observer is not None:
                observer.on_engine_sample(sample)

        engine = SimEngine(
            self.calibration,
            self.knobs,
            plan,
            seed=self.seed,
            policy=None if self.policy_factory is None else self.policy_factory(),
            replicas=self.replicas,
            on_record=None if observer is None else observer.on_record,
            on_sample=on_sample,
            sample_interval_s=self.sample_interval_s,
        )
        self.last_engine = engine
        interrupted = False
        try:
            if self.speed is None:
                # Yield to the event loop between slices of virtual time so Ctrl-C (task cancellation)
                # can stop a long run and keep what it measured. A slice in which the engine took no step
                # was idle time, which costs nothing to simulate: the next slice is twice as long, so a gap
                # of 1e9 s between two trace rows (milliseconds read as seconds) takes ~25 slices, not 3e7.
                slice_s = UNPACED_SLICE_S
                while True:
                    steps = engine.step
                    if engine.advance_until(engine.clock + slice_s):
                        break
                    slice_s = UNPACED_SLICE_S if engine.step != steps else slice_s * 2
                    await asyncio.sleep(0)
            else:
                start = time.monotonic()
                while not engine.advance_until((time.monotonic() - start) * self.speed):
                    await asyncio.sleep(PACE_TICK_S)
        except asyncio.CancelledError:
            interrupted = True
        end = max((r.end_s or 0.0 for r in engine.records), default=0.0)
        return RunOutcome(
            records=engine.records,
            duration_s=end,
            samples=samples,
            interrupted=interrupted,
            notes={
                "busy_s": engine.busy_s,
                "virtual_time_s": engine.clock,
                "steps": engine.step,
                "preemptions": engine.preemptions,
                "mode": engine.policy.describe(),
            },
        )

    async def close(self) -> None:
        return None


def run_to_completion(backend: SimBackend, plan: LoadPlan) -> RunOutcome:
    """Synchronous convenience for callers without an event loop (tuner, tests)."""
    if backend.speed is not None and not math.isinf(backend.speed):
        raise ValueError("run_to_completion needs an unpaced simulator (speed=None)")
    return asyncio.run(backend.run(plan))
