"""The whole profile: one validated document made of the workload, serving and mode sections."""

# No `from __future__ import annotations` in the model modules: see core/profile/strict.py.
from pathlib import Path
from typing import Annotated, Self

from pydantic import Field, PrivateAttr

from core.profile.mode_specs import AdaServeSpec, SaberSpec, SlosServeSpec, TunerSpec
from core.profile.scheduling_mode import DEFAULT_MODE, SchedulingMode
from core.profile.serving_spec import EngineSpec, KnobsSpec, ServerSpec, SustainabilitySpec
from core.profile.strict import Strict
from core.profile.workload_spec import SLOSpec, SmoothGoodputSpec, WorkloadSpec


class Profile(Strict):
    name: str
    description: str = ""
    seed: Annotated[int, Field(ge=0)] = 0  # numpy's seed sequences take no negative number
    workload: WorkloadSpec
    slo: SLOSpec = Field(default_factory=lambda: SLOSpec(e2e_s=1.2))
    smooth_goodput: SmoothGoodputSpec = Field(default_factory=SmoothGoodputSpec)
    knobs: KnobsSpec = Field(default_factory=KnobsSpec)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    sustainability: SustainabilitySpec = Field(default_factory=SustainabilitySpec)
    server: ServerSpec = Field(default_factory=ServerSpec)
    tuner: TunerSpec = Field(default_factory=TunerSpec)
    # Scheduling mode (core/profile/scheduling_mode.py; fcfs = vLLM's default) and how many engine replicas
    # the simulator runs behind the controller (live: one per upstream server).
    mode: SchedulingMode = DEFAULT_MODE
    replicas: Annotated[int, Field(ge=1, le=64)] = 1
    adaserve: AdaServeSpec = Field(default_factory=AdaServeSpec)

    saber: SaberSpec = Field(default_factory=SaberSpec)
    slos_serve: SlosServeSpec = Field(default_factory=SlosServeSpec)
    # Extension sections owned by other capabilities (live server, tuner, energy) are added here.

    _source: Path | None = PrivateAttr(default=None)

    def with_mode(self, mode: SchedulingMode | None) -> Self:
        """This profile in `mode` (None: as it is): how a front end applies --mode or the Modes tab, once."""
        if mode is None or mode == self.mode:
            return self
        return self.model_copy(update={"mode": mode})
