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

from core.controller_api import Policy
from core.profile import SCHEDULING_MODES, Calibration, Profile, SchedulingMode, parse_scheduling_mode
from core.sim.engine import simulate


@dataclass(frozen=True, slots=True)
class ModeContext:
    profile: Profile
    calibration: Calibration
    replicas: int = 1
    seed: int = 0


PolicyFactory = Callable[[ModeContext], Policy]


def _fcfs(ctx: ModeContext) -> Policy:
    return Policy()


def _saber(ctx: ModeContext) -> Policy:
    from core.control.saber.policy import SaberPolicy
    from core.control.saber.speed_model import offline_phase

    spec = ctx.profile.saber
    # Offline phase (paper 001 sec. IV-B): profile the engine, fit f(L); cached per engine and mix.
    speeds = offline_phase(ctx.profile, ctx.calibration, simulate, loads=spec.profile_loads, seed=ctx.seed)
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


assert tuple(MODES) == SCHEDULING_MODES, "core/profile/scheduling_mode.py and MODES list the same modes"


def make_policy(name: SchedulingMode, ctx: ModeContext) -> Policy:
    """A fresh policy of mode `name`; a name that is not a mode (an untyped caller) raises ProfileError."""
    return MODES[parse_scheduling_mode(name, "mode")](ctx)
