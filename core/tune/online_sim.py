"""The online tuner on the simulator: a gateway's admission over simulated replicas, on one virtual clock.

The simulator's controller plays the gateway (core/sim/engine.py runs the same `Policy` seam): the tuner's
`OnlinePolicy` (core/tune/online_space.py; fcfs behind a cap, or another mode of `modes` with its knobs) decides
admission, and the `OnlineTuner` (core/tune/online.py) sees every ended request's record and changes the cap,
the mode or its knobs between windows, exactly as it does in front of live servers (core/tune/online_gateway.py).
`run_static` runs the same load at one fixed cap: the yardstick the online tuner is held to (the best static
cap of a grid, measured separately).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.control.concurrency_cap import ConcurrencyCapPolicy
from core.events import EventSink
from core.metrics import Summary, summarize
from core.profile import Calibration, Profile
from core.records import RequestRecord
from core.sim.engine import SimEngine
from core.tune.knobspace import Point
from core.tune.online import OnlineSettings, OnlineTuner
from core.tune.online_space import FCFS, OnlinePolicy, online_space
from core.workload import build_load_plan

POLL_INTERVAL_S = 1.0  # how often (virtual seconds) the tuner is asked, as the gateway's timer asks it


@dataclass(slots=True)
class OnlineSimRun:
    tuner: OnlineTuner
    records: list[RequestRecord]
    end_s: float
    caps: list[tuple[float, int]]  # (virtual time, cap) at every change, the start included
    policy: OnlinePolicy


def _plan(profile: Profile, seed: int, duration_s: float):  # type: ignore[no-untyped-def]
    return build_load_plan(profile, seed=seed, requests=10**9, duration_s=duration_s)


def run_online(
    profile: Profile,
    calibration: Calibration,
    start_cap: int,
    *,
    duration_s: float,
    seed: int = 0,
    max_queue: int | None = None,
    settings: OnlineSettings | None = None,
    sink: EventSink | None = None,
    start_mode: str = FCFS,
    modes: tuple[str, ...] | None = None,
) -> OnlineSimRun:
    """Serve `duration_s` of the profile's load behind the admission the online tuner moves, starting at
    `start_cap` in `start_mode` (with the profile's knobs for it); `modes` (default: the start's alone) are the
    modes it may switch among."""
    space = online_space(profile, modes=modes or (start_mode,))
    knobs = profile.knobs
    start = space.point(Point(start_cap, knobs.max_num_seqs, knobs.spec_width, knobs.spec_on), start_mode)
    tuner = OnlineTuner(space, start, profile, settings or OnlineSettings(), sink=sink, world="sim")
    policy = OnlinePolicy(start, profile, lambda: calibration, max_queue=max_queue)
    plan = _plan(profile, seed, duration_s)
    engine = SimEngine(calibration, knobs, plan, seed=seed, policy=policy.switch, on_record=tuner.observe)
    caps = [(0.0, start_cap)]
    # The load starts on an empty server: the first window starts once a window's length has passed, as a
    # gateway's would on a server already serving.
    t = tuner.settings.window_s
    tuner.begin(t)
    while not engine.advance_until(t):
        change = tuner.poll(engine.clock)
        if change is not None:
            policy.apply(change, engine.clock)
            caps.append((engine.clock, change.concurrency))
        t += POLL_INTERVAL_S
    return OnlineSimRun(tuner, engine.records, engine.clock, caps, policy)


def run_static(
    profile: Profile,
    calibration: Calibration,
    cap: int,
    *,
    duration_s: float,
    seed: int = 0,
    max_queue: int | None = None,
) -> list[RequestRecord]:
    """The same load at one fixed cap."""
    policy = ConcurrencyCapPolicy(cap, max_queue)
    engine = SimEngine(calibration, profile.knobs, _plan(profile, seed, duration_s), seed=seed, policy=policy)
    return engine.run()


def goodput_between(profile: Profile, records: list[RequestRecord], start_s: float, end_s: float) -> Summary:
    """Requests that ended in [start_s, end_s), summarised over that span (goodput per second of it)."""
    inside = [r for r in records if r.end_s is not None and start_s <= r.end_s < end_s]
    span = end_s - start_s
    if not span > 0 or not math.isfinite(span):
        raise ValueError(f"an empty span [{start_s}, {end_s})")
    return summarize(inside, slo=profile.slo, smooth=profile.smooth_goodput, window_s=span)
