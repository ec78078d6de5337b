"""`--job capacity`: each scheduling mode's capacity on the simulator, as paper 004 defines it (sec. 6): the
highest request rate whose SLO attainment stays at or above 90%.

For one mode: the profile's arrivals are rescaled to a candidate rate (same seed, so the same request
lengths and the same arrival pattern, only faster or slower), served on the simulator, and the rate is
bracketed (doubling or halving from the profile's own rate) and then bisected until the bracket is within
`rel_tol` of its upper end. Synthetic arrivals get the candidate `rate_rps`; a trace keeps its own arrival
times and burst shape, its inter-arrival times multiplied by 1/scale (`workload.trace.time_scale`), where
scale = candidate rate / the trace's own mean rate, so the table reports both the rate and the scale.
Attainment is measured as everywhere (core/metrics): a request counts as attained only if it completed
within every SLO that applies; rejected and deferred requests count against it. With several replicas
(`Profile.replicas`) the table also gives the capacity per replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from core.events import EventSink, make_event, null_sink
from core.executor import Executor
from core.jobs import RunOptions, run_workload
from core.profile import Profile, ProfileError, parse_scheduling_mode

if TYPE_CHECKING:
    from core.control.saber.speed_model import SpeedProfile

TARGET_ATTAINMENT = 0.9  # paper 004 sec. 6: capacity = the load served with under 10% SLO violations
MAX_BRACKET_STEPS = 10  # doublings / halvings before giving up on a bracket


@dataclass(frozen=True, slots=True)
class ArrivalScaling:
    """How the probes speed up or slow down the profile's arrivals: scale s runs them at s x `base_rate_rps`."""

    profile: Profile
    source: Literal["arrival", "trace"]
    base_rate_rps: float  # the profile's own rate: synthetic `rate_rps`, or the trace's mean rate as replayed

    @classmethod
    def of(cls, profile: Profile, requests: int | None = None) -> ArrivalScaling:
        """The profile's arrivals at scale 1; `requests` (as --requests) picks the trace rows its rate is over."""
        workload = profile.workload
        if workload.trace is not None:
            return cls(profile, "trace", _trace_rate(profile, requests))
        arrival = workload.arrival
        if arrival is None or not hasattr(arrival, "rate_rps"):
            raise ProfileError(
                f"{profile.name}: --job capacity rescales open-loop arrivals; set workload.arrival to poisson,"
                " gamma, constant or onoff, or replay a trace (not closed-loop clients)"
            )
        return cls(profile, "arrival", float(arrival.rate_rps))

    def scale(self, rate_rps: float) -> float:
        return rate_rps / self.base_rate_rps

    def at(self, rate_rps: float) -> Profile:
        """The profile with its open-loop arrivals running at `rate_rps`."""
        workload = self.profile.workload
        if workload.trace is not None:
            # Every inter-arrival time x 1/scale: the trace's bursts keep their shape, only faster or slower.
            time_scale = workload.trace.time_scale / self.scale(rate_rps)
            update: dict[str, Any] = {"trace": workload.trace.model_copy(update={"time_scale": time_scale})}
        else:
            assert workload.arrival is not None
            update = {"arrival": workload.arrival.model_copy(update={"rate_rps": rate_rps})}
        return self.profile.model_copy(update={"workload": workload.model_copy(update=update)})

    def describe(self) -> str:
        """What scale 1 is, for the table's title."""
        return _scale_note(self.profile, self.source, self.base_rate_rps)


def _scale_note(profile: Profile, source: str, base_rate_rps: float) -> str:
    workload = profile.workload
    if source == "trace" and workload.trace is not None:
        name = Path(workload.trace.path).name
        return f"trace {name} at its own {base_rate_rps:.3f} req/s (a trace's inter-arrival times x 1/scale)"
    kind = workload.arrival.kind if workload.arrival is not None else "arrival"
    return f"{kind} arrivals at the profile's {base_rate_rps:.3f} req/s"


def _trace_rate(profile: Profile, requests: int | None) -> float:
    """The mean arrival rate of the rows a run replays: 1 / mean inter-arrival time."""
    from core.workload import build_load_plan

    arrivals = [spec.arrival_s for spec in build_load_plan(profile, requests=requests).requests]
    span = arrivals[-1] - arrivals[0] if len(arrivals) > 1 else 0.0
    if span <= 0:
        raise ProfileError(
            f"{profile.name}: --job capacity rescales the trace's arrival times, and its replayed rows all arrive"
            " at the same instant; replay more rows (--requests) or give them distinct timestamps"
        )
    return (len(arrivals) - 1) / span


def at_rate(profile: Profile, rate_rps: float) -> Profile:
    """The profile with its open-loop arrivals (synthetic or a trace's) running at `rate_rps`."""
    return ArrivalScaling.of(profile).at(rate_rps)


@dataclass(frozen=True, slots=True)
class Probe:
    rate_rps: float
    scale: float
    attainment: float
    goodput_rps: float
    rejected: int
    deferred: int
    wall_s: float


@dataclass(slots=True)
class CapacityResult:
    mode: str
    replicas: int
    capacity_rps: float  # 0.0: even the lowest probed rate missed the target
    probes: list[Probe] = field(default_factory=list)
    bracket: tuple[float, float] = (0.0, 0.0)  # (passes, fails)
    base_rate_rps: float = 0.0  # the profile's own rate (scale 1)
    arrival_source: Literal["arrival", "trace"] = "arrival"

    @property
    def per_replica_rps(self) -> float:
        return self.capacity_rps / self.replicas

    @property
    def scale(self) -> float:
        """Capacity as a multiple of the profile's own rate (a trace: its arrival times x 1/scale)."""
        return self.capacity_rps / self.base_rate_rps if self.base_rate_rps > 0 else 0.0

    def fields(self) -> dict[str, Any]:
        return {
            "capacity_rps": self.capacity_rps,
            "scale": self.scale,
            "base_rate_rps": self.base_rate_rps,
            "arrival_source": self.arrival_source,
            "replicas": self.replicas,
            "capacity_per_replica_rps": self.per_replica_rps,
            "bracket_rps": list(self.bracket),
            "probes": [_probe_dict(p) for p in self.probes],
        }


def _probe_dict(p: Probe) -> dict[str, Any]:
    return {
        "rate_rps": p.rate_rps,
        "scale": p.scale,
        "attainment": p.attainment,
        "goodput_rps": p.goodput_rps,
        "rejected": p.rejected,
        "deferred": p.deferred,
    }


async def saber_offline_task(profile: Profile, seed: int) -> SpeedProfile:
    """SABER's offline phase for the probes (an executor task): it does not depend on the rate."""
    from core.modes import ModeContext, saber_offline_phase
    from core.profile import load_calibration

    return saber_offline_phase(ModeContext(profile, load_calibration(profile), profile.replicas, seed))


async def probe_task(
    scaling: ArrivalScaling, mode: str, rate: float, options: RunOptions, speeds: SpeedProfile | None = None
) -> Probe:
    """One probe: `mode` serving the profile's arrivals at `rate` (an executor task, core/executor.py).
    `speeds`: SABER's offline phase, run once for every probe (`saber_offline_task`)."""
    from core.backends.factory import make_backend

    start = time.perf_counter()
    scaled = scaling.at(rate).model_copy(update={"mode": mode})
    if speeds is not None:
        from core.modes import ModeContext, saber_offline_phase
        from core.profile import load_calibration

        assert options.seed is not None
        saber_offline_phase(ModeContext(scaled, load_calibration(scaled), scaled.replicas, options.seed), speeds)
    backend = make_backend("sim", scaled, seed=options.seed, mode=mode)
    try:
        result = await run_workload(scaled, backend, null_sink, options)
    finally:
        await backend.close()
    s = result.summary
    attainment = s.slo_attainment if s.slo_attainment == s.slo_attainment else 0.0
    return Probe(
        rate,
        scaling.scale(rate),
        attainment,
        s.goodput_rps,
        s.failed_by_status.get("rejected", 0),
        s.failed_by_status.get("deferred", 0),
        time.perf_counter() - start,
    )


async def find_capacity(
    profile: Profile,
    mode: str,
    *,
    seed: int | None = None,
    requests: int | None = None,
    target: float = TARGET_ATTAINMENT,
    rel_tol: float = 0.03,
    sink: EventSink = null_sink,
    executor: Executor | None = None,
    lookahead: bool = False,
) -> CapacityResult:
    """Bracket, then bisect, the highest rate with attainment >= target. Each probe is a task on `executor`
    (default: this process); the next rate depends on the last answer, so one mode's probes run in turn.
    `lookahead` (an executor with CPUs to spare): while the bisection probes a rate, it also starts both
    rates the next step may ask for, so that step's answer is ready sooner. Only the probes the bisection
    asks for are recorded; the other is dropped (same probes, same answer, half the work wasted)."""
    executor = executor or Executor()
    scaling = ArrivalScaling.of(profile, requests)
    options = RunOptions(seed=profile.seed if seed is None else seed, requests=requests, engine_events=False)
    result = CapacityResult(
        mode, profile.replicas, 0.0, base_rate_rps=scaling.base_rate_rps, arrival_source=scaling.source
    )

    ahead: dict[float, asyncio.Task[Probe]] = {}  # rates started before the bisection asked for them
    speeds: SpeedProfile | None = None
    if mode == "saber" and executor.parallel:
        # Each worker process would run SABER's offline phase for its first probe (a second on this machine's
        # two workers); it does not depend on the rate, so it runs once and goes to every probe.
        assert options.seed is not None
        speeds = await executor.run("saber offline phase", saber_offline_task, profile, options.seed)

    def start(rate: float, then: int) -> asyncio.Task[Probe]:
        """The probe at `rate`, started if it is not yet; `then`: about how many the bisection asks for after it."""
        if rate not in ahead:
            label = f"{mode} at {rate:.4g} req/s"
            # A bisection is a chain of probes and the job ends with the last chain: when probes wait for a worker,
            # the chain with the most work left goes first (its last probe's time x the probes left, this one
            # included). A chain that has measured nothing yet goes first of all: its cost is unknown.
            urgency = result.probes[-1].wall_s * (1 + then) if result.probes else math.inf
            task = executor.run(label, probe_task, scaling, mode, rate, options, speeds, urgency=urgency)
            ahead[rate] = asyncio.ensure_future(task)
        return ahead[rate]

    # After a bracketing probe: maybe one more, then the halvings of a bracket of a factor of 2.
    bracketing_then = 1 + _halvings(0.5, rel_tol)

    async def probe(rate: float, then: int) -> bool:
        p = await start(rate, then)
        result.probes.append(p)
        sink(make_event("capacity_probe", mode=mode, **_probe_dict(p)))
        return p.attainment >= target

    rate = scaling.base_rate_rps
    low, high = 0.0, 0.0
    if await probe(rate, bracketing_then):
        low = rate
        for _ in range(MAX_BRACKET_STEPS):
            rate *= 2.0
            if not await probe(rate, bracketing_then):
                high = rate
                break
            low = rate
        else:
            high = rate * 2.0  # never failed: report the highest rate tried
    else:
        high = rate
        for _ in range(MAX_BRACKET_STEPS):
            rate /= 2.0
            if await probe(rate, bracketing_then):
                low = rate
                break
            high = rate
    try:
        if low > 0.0 and high > low:
            while (high - low) > rel_tol * high:
                middle = (low + high) / 2.0
                then = _halvings((high - low) / 2.0 / high, rel_tol)
                if lookahead:  # the next step's middle, whichever way this one goes (the same float expression)
                    start(middle, then)
                    start((low + middle) / 2.0, then - 1)
                    start((middle + high) / 2.0, then - 1)
                if await probe(middle, then):
                    low = middle
                else:
                    high = middle
    finally:
        for task in ahead.values():
            task.cancel()  # done ones ignore it; a probe the bisection never asked for is dropped
    result.capacity_rps = low
    result.bracket = (low, high)
    return result


def _halvings(width: float, rel_tol: float) -> int:
    """How many halvings bring a bracket `width` wide (a fraction of its upper end) within `rel_tol`."""
    halvings = 0
    while width > rel_tol:
        width /= 2.0
        halvings += 1
    return halvings


async def run_capacity(
    profile: Profile,
    *,
    modes: Sequence[str] | None = None,
    seed: int | None = None,
    requests: int | None = None,
    rel_tol: float = 0.03,
    sink: EventSink = null_sink,
    executor: Executor | None = None,
) -> list[CapacityResult]:
    """Every mode's capacity (default: all of core/modes.py `MODES`), on the same seeded workload."""
    from core.modes import MODES

    executor = executor or Executor()
    names = [parse_scheduling_mode(name, "mode") for name in (MODES if modes is None else modes)]
    scaling = ArrivalScaling.of(profile, requests)  # refuses closed loops before any mode runs
    sink(
        make_event(
            "start",
            job="capacity",
            profile=profile.name,
            modes=names,
            replicas=profile.replicas,
            arrival_source=scaling.source,
            base_rate_rps=scaling.base_rate_rps,
        )
    )

    async def one(name: str) -> CapacityResult | str:
        try:
            return await find_capacity(
                profile,
                name,
                seed=seed,
                requests=requests,
                rel_tol=rel_tol,
                sink=sink,
                executor=executor,
                lookahead=lookahead,
            )
        except ProfileError as exc:  # a mode this workload cannot run (as --job compare skips it)
            return str(exc)

    # A bisection is sequential, so the modes are what runs side by side on a parallel executor: every mode's
    # probes are in flight together, and the rows come out in the modes' order. With CPUs for three probes per
    # mode, each bisection also looks a step ahead.
    lookahead = executor.parallel and executor.slots() >= 3 * len(names)
    results = []
    async with contextlib.aclosing(executor.in_order([partial(one, name) for name in names])) as found_all:
        index = 0
        async for found in found_all:
            name, index = names[index], index + 1
            if isinstance(found, str):
                sink(make_event("capacity_row", mode=name, skipped=found))
                continue
            sink(make_event("capacity_row", mode=name, **found.fields()))
            results.append(found)
    return results


def format_table(profile: Profile, results: Sequence[CapacityResult]) -> str:
    """Aligned text: mode, capacity, capacity per replica, the scale of the profile's own arrivals it is, and
    the ratio to the first mode (the baseline)."""
    base = results[0].capacity_rps if results else 0.0
    header = [
        "mode",
        "replicas",
        "capacity r/s",
        "per replica r/s",
        "scale",
        f"x {results[0].mode}" if results else "x",
        "probes",
    ]
    rows = [header]
    for r in results:
        ratio = f"{r.capacity_rps / base:.2f}" if base > 0 else "-"
        rows.append(
            [
                r.mode,
                str(r.replicas),
                f"{r.capacity_rps:.3f}",
                f"{r.per_replica_rps:.3f}",
                f"{r.scale:.3f}",
                ratio,
                str(len(r.probes)),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    title = f"capacity at >= {TARGET_ATTAINMENT:.0%} SLO attainment, {profile.name}"
    if results:
        title += f"; scale 1 = {_scale_note(profile, results[0].arrival_source, results[0].base_rate_rps)}"
    lines = [title + ":"]
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    return "\n".join(lines)
