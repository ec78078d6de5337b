"""Scheduling modes by name: `--mode NAME`, `mode:` in a profile, `--job compare` (every mode in `MODES`).

The names are `core.profile.SchedulingMode` (validated once where they come in); this module maps each to
its policy factory, in the same order.

Each mode module registers a factory here (one line); the factory builds a fresh `Policy` for one run
from what a user knows before the run: the profile, the engine calibration and the replica count.

This registry sits above core/sim and core/control (which never import each other): SABER's offline phase
(paper 001 sec. IV-B) profiles the engine by running it, and here it is handed the simulator to run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.controller_api import Policy
from core.profile import SCHEDULING_MODES, Calibration, Profile, SchedulingMode, parse_scheduling_mode
from core.sim.engine import simulate

if TYPE_CHECKING:
    from core.control.saber.speed_model import SpeedProfile


@dataclass(frozen=True, slots=True)
class ModeContext:
    profile: Profile
    calibration: Calibration
    replicas: int = 1
    seed: int = 0


PolicyFactory = Callable[[ModeContext], Policy]


def _fcfs(ctx: ModeContext) -> Policy:
    return Policy()


def saber_offline_phase(ctx: ModeContext, adopt: SpeedProfile | None = None) -> SpeedProfile:
    """SABER's offline phase for this context (paper 001 sec. IV-B): profile the engine, fit f(L); cached per
    engine and mix in this process. `adopt`: the same phase run in another process (a job's workers), taken
    instead of profiling again."""
    from core.control.saber.speed_model import adopt_offline_phase, offline_phase

    loads = ctx.profile.saber.profile_loads
    if adopt is not None:
        adopt_offline_phase(ctx.profile, ctx.calibration, adopt, loads=loads, seed=ctx.seed)
    return offline_phase(ctx.profile, ctx.calibration, simulate, loads=loads, seed=ctx.seed)


def _saber(ctx: ModeContext) -> Policy:
    from core.control.saber.policy import SaberPolicy

    spec = ctx.profile.saber
    speeds = saber_offline_phase(ctx)
    return SaberPolicy(
        speeds.models[spec.speed_model],
        window_size=spec.window_size,
        best_effort_max_load=spec.best_effort_max_load,
        track_progress=spec.track_progress,
        feasibility=spec.feasibility,
        drift_correction=spec.drift_correction,
        drift_quantile=spec.drift_quantile,
        protect_running=spec.protect_running,
        send_priority=ctx.profile.knobs.scheduling_policy == "priority",
        max_load=max(spec.profile_loads),
        fit_r2={kind: model.r2 for kind, model in speeds.models.items()},
        seed=ctx.seed,
    )


def _slos_serve(ctx: ModeContext) -> Policy:
    # Imported here, as SABER's: a run of one mode does not pay for importing the others (start-up time).
    from core.control.slos_serve.policy import SlosServePolicy

    return SlosServePolicy(ctx.calibration, ctx.profile.knobs, ctx.profile.slos_serve, replicas=ctx.replicas)


def _adaserve(ctx: ModeContext) -> Policy:
    from core.control.adaserve.policy import AdaServePolicy

    return AdaServePolicy(
        ctx.profile.adaserve,
        ctx.calibration,
        seed=ctx.seed,
        send_priority=ctx.profile.knobs.scheduling_policy == "priority",
    )


# Insertion order is the order of `--job compare`'s table: the baseline first.
MODES: dict[SchedulingMode, PolicyFactory] = {
    "fcfs": _fcfs,
    "saber": _saber,
    "slos-serve": _slos_serve,
    "adaserve": _adaserve,
}


@dataclass(frozen=True, slots=True)
class ModeGuide:
    """What a mode does, and when to use it or not, in a sentence each: from the measurements in docs/
    (saber.md, slos-serve.md, adaserve.md; issue 21), shown under the console's Modes table and quoted by
    docs/modes.md "When to use which" (tests/test_modes_guide.py keeps the two the same)."""

    what: str
    use_when: str
    avoid_when: str


MODE_GUIDE: dict[SchedulingMode, ModeGuide] = {
    "fcfs": ModeGuide(
        what="vLLM's own first come, first served",
        use_when="the load stays well under capacity, and as the baseline: nothing rejected, nothing to tune",
        avoid_when="bursts or mixed SLOs push p99 past the SLO: it serves everyone late rather than most on time",
    ),
    "saber": ModeGuide(
        what="SLA-aware admission, two-tier queue (paper 001)",
        use_when="long generations with end-to-end SLAs on an engine whose speed falls steeply with concurrency "
        "(the paper's regime: it wins the heavy mix W1)",
        avoid_when="engines that batch well, as the shipped ones do, and mixed workloads (W2, W3): "
        "it loses to the best static max_num_seqs",
    ),
    "slos-serve": ModeGuide(
        what="multi-SLO admission and batch planning (paper 004)",
        use_when="bursty traffic with per-request TTFT/TPOT SLOs, where deferring or rejecting some requests "
        "beats missing many: 1.64x fcfs's capacity (geomean of six scenarios)",
        avoid_when="every request must be served (it rejects and defers), or SLOs as tight as one engine step "
        "(reasoning: 0.92x fcfs)",
    ),
    "adaserve": ModeGuide(
        what="SLO-customized speculative decoding (paper 002)",
        use_when="the server has a draft model and requests carry different TPOT SLOs: 10x fewer violations "
        "than the best static width at moderate load; as fcfs on long prompts",
        avoid_when="no draft model to speculate with; past saturation its lead shrinks (1.3x)",
    ),
}


assert tuple(MODES) == SCHEDULING_MODES, "core/profile/scheduling_mode.py and MODES list the same modes"
assert tuple(MODE_GUIDE) == SCHEDULING_MODES, "every mode has its guide"


def make_policy(name: SchedulingMode, ctx: ModeContext) -> Policy:
    """A fresh policy of mode `name`; a name that is not a mode (an untyped caller) raises ProfileError."""
    return MODES[parse_scheduling_mode(name, "mode")](ctx)
