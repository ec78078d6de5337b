"""`--job capacity`: each scheduling mode's capacity on the simulator, as paper 004 defines it (sec. 6): the
highest request rate whose SLO attainment stays at or above 90%.

For one mode: the profile's arrival process is rescaled to a candidate rate (same seed, so the same
request lengths and the same arrival pattern, only faster or slower), served on the simulator, and the
rate is bracketed (doubling or halving from the profile's own rate) and then bisected until the bracket is
within `rel_tol` of its upper end. Attainment is measured as everywhere (core/metrics): a request counts
as attained only if it completed within every SLO that applies; rejected and deferred requests count
against it. With several replicas (`Profile.replicas`) the table also gives the capacity per replica.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from core.events import EventSink, make_event, null_sink
from core.jobs import RunOptions, run_workload
from core.profile import Profile, ProfileError, parse_scheduling_mode

TARGET_ATTAINMENT = 0.9  # paper 004 sec. 6: capacity = the load served with under 10% SLO violations
MAX_BRACKET_STEPS = 10  # doublings / halvings before giving up on a bracket


@dataclass(frozen=True, slots=True)
class Probe:
    rate_rps: float
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

    @property
    def per_replica_rps(self) -> float:
        return self.capacity_rps / self.replicas

    def fields(self) -> dict[str, Any]:
        return {
            "capacity_rps": self.capacity_rps,
            "replicas": self.replicas,
            "capacity_per_replica_rps": self.per_replica_rps,
            "bracket_rps": list(self.bracket),
            "probes": [_probe_dict(p) for p in self.probes],
        }


def _probe_dict(p: Probe) -> dict[str, Any]:
    return {
        "rate_rps": p.rate_rps,
        "attainment": p.attainment,
        "goodput_rps": p.goodput_rps,
        "rejected": p.rejected,
        "deferred": p.deferred,
    }


def at_rate(profile: Profile, rate_rps: float) -> Profile:
    """The profile with its open-loop arrival process running at `rate_rps`."""
    arrival = profile.workload.arrival
    if arrival is None or not hasattr(arrival, "rate_rps"):
        raise ProfileError(
            f"{profile.name}: --job capacity rescales a synthetic open-loop arrival rate; set workload.arrival"
            " to poisson, gamma, constant or onoff (not a trace or closed-loop clients)"
        )
    workload = profile.workload.model_copy(update={"arrival": arrival.model_copy(update={"rate_rps": rate_rps})})
    return profile.model_copy(update={"workload": workload})


async def _probe(profile: Profile, mode: str, rate: float, options: RunOptions) -> Probe:
    from core.backends.factory import make_backend

    start = time.perf_counter()
    scaled = at_rate(profile, rate).model_copy(update={"mode": mode})
    backend = make_backend("sim", scaled, seed=options.seed, mode=mode)
    try:
        result = await run_workload(scaled, backend, null_sink, options)
    finally:
        await backend.close()
    s = result.summary
    attainment = s.slo_attainment if s.slo_attainment == s.slo_attainment else 0.0
    return Probe(
        rate,
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
) -> CapacityResult:
    """Bracket, then bisect, the highest rate with attainment >= target."""
    arrival = at_rate(profile, 1.0).workload.arrival  # validates the arrival kind
    assert arrival is not None
    options = RunOptions(seed=profile.seed if seed is None else seed, requests=requests, engine_events=False)
    result = CapacityResult(mode, profile.replicas, 0.0)

    async def probe(rate: float) -> bool:
        p = await _probe(profile, mode, rate, options)
        result.probes.append(p)
        sink(make_event("capacity_probe", mode=mode, **_probe_dict(p)))
        return p.attainment >= target

    rate = profile.workload.arrival.rate_rps  # type: ignore[union-attr]
    low, high = 0.0, 0.0
    if await probe(rate):
        low = rate
        for _ in range(MAX_BRACKET_STEPS):
            rate *= 2.0
            if not await probe(rate):
                high = rate
                break
            low = rate
        else:
            high = rate * 2.0  # never failed: report the highest rate tried
    else:
        high = rate
        for _ in range(MAX_BRACKET_STEPS):
            rate /= 2.0
            if await probe(rate):
                low = rate
                break
            high = rate
    if low > 0.0 and high > low:
        while (high - low) > rel_tol * high:
            middle = (low + high) / 2.0
            if await probe(middle):
                low = middle
            else:
                high = middle
    result.capacity_rps = low
    result.bracket = (low, high)
    return result


async def run_capacity(
    profile: Profile,
    *,
    modes: Sequence[str] | None = None,
    seed: int | None = None,
    requests: int | None = None,
    rel_tol: float = 0.03,
    sink: EventSink = null_sink,
) -> list[CapacityResult]:
    """Every mode's capacity (default: all of core/modes.py `MODES`), on the same seeded workload."""
    from core.modes import MODES

    names = [parse_scheduling_mode(name, "mode") for name in (MODES if modes is None else modes)]
    at_rate(profile, 1.0)
    sink(make_event("start", job="capacity", profile=profile.name, modes=names, replicas=profile.replicas))
    results = []
    for name in names:
        try:
            found = await find_capacity(profile, name, seed=seed, requests=requests, rel_tol=rel_tol, sink=sink)
        except ProfileError as exc:  # a mode this workload cannot run (as --job compare skips it)
            sink(make_event("capacity_row", mode=name, skipped=str(exc)))
            continue
        sink(make_event("capacity_row", mode=name, **found.fields()))
        results.append(found)
    return results


def format_table(profile: Profile, results: Sequence[CapacityResult]) -> str:
    """Aligned text: mode, capacity, capacity per replica, and the ratio to the first mode (the baseline)."""
    base = results[0].capacity_rps if results else 0.0
    header = [
        "mode",
        "replicas",
        "capacity r/s",
        "per replica r/s",
        f"x {results[0].mode}" if results else "x",
        "probes",
    ]
    rows = [header]
    for r in results:
        ratio = f"{r.capacity_rps / base:.2f}" if base > 0 else "-"
        rows.append(
            [r.mode, str(r.replicas), f"{r.capacity_rps:.3f}", f"{r.per_replica_rps:.3f}", ratio, str(len(r.probes))]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"capacity at >= {TARGET_ATTAINMENT:.0%} SLO attainment, {profile.name}:"]
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    return "\n".join(lines)
