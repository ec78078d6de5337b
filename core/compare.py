"""`--job compare`: every scheduling mode on identical seeded arrivals, one row per mode.

Each mode in core/modes.py `MODES` serves the profile's workload on the simulator with the same seed
(so the same requests arrive at the same times), under the profile's knobs. One more row is the baseline
SABER's paper measures itself against (paper 001 sec. III-B, V): `fcfs-best-static`, plain FCFS at the
static `max_num_seqs` that a sweep over `saber.static_caps` found best for this workload and rate (best =
highest SLO attainment, the paper's goodput; ties: more goodput per second, then lower p99).

The rows are data (`CompareResult.rows`); the batch runner prints them as a text table on stderr and as
`compare_row` events, and the last line, a `summary` event, holds them as `modes: {name: {...}}`. The
console's Modes tab renders the same rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from core.backend_api import BackendUnavailable
from core.events import EventSink, make_event, null_sink
from core.executor import Executor
from core.jobs import RunOptions, RunResult, run_workload
from core.metrics import Summary
from core.profile import KnobsSpec, Profile, ProfileError, parse_scheduling_mode
from core.records import Status

BEST_STATIC = "fcfs-best-static"


@dataclass(slots=True)
class ModeRow:
    """One mode's run: what the table shows, and the whole summary behind it."""

    mode: str
    max_num_seqs: int
    speculation: str | None  # how the mode drafts tokens (core/controller_api.Policy.speculation)
    summary: Summary
    wall_s: float
    policy: dict[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[str, Any]:
        """The headline figures of this mode (the values of the summary's `modes` map)."""
        s = self.summary
        return {
            "max_num_seqs": self.max_num_seqs,
            "speculation": self.speculation,
            "requests": s.requests,
            "completed": s.completed,
            "slo_attainment": s.slo_attainment,
            "slo_attainment_per_task": {task: t.slo_attainment for task, t in s.per_task.items()},
            "goodput_rps": s.goodput_rps,
            "token_goodput_tps": s.token_goodput_tps,
            "smooth_goodput": s.smooth_goodput,
            "p99_s": s.p99_s,
            "cv_completion_over_slo": s.cv_completion_over_slo,
            "rejected": s.failed_by_status.get(Status.REJECTED.value, 0),
            "deferred": s.failed_by_status.get(Status.DEFERRED.value, 0),
            "failed": s.failed,
            "window_s": s.window_s,
            "wall_s": self.wall_s,
            "policy": self.policy,
        }


@dataclass(slots=True)
class CompareResult:
    profile: Profile
    seed: int
    rows: list[ModeRow]
    static_sweep: dict[int, float]  # max_num_seqs -> SLO attainment of fcfs at that cap
    wall_s: float
    interrupted: bool = False
    skipped: dict[str, str] = field(default_factory=dict)  # mode -> why it could not run on this profile
    runs: dict[str, RunResult] = field(default_factory=dict)  # mode -> its whole run (the factsheet's)
    # A trace workload: {"used": rows each mode was sent, "total": rows in the file} (the same for every mode).
    trace_rows: dict[str, int] | None = None

    def row(self, mode: str) -> ModeRow:
        return next(r for r in self.rows if r.mode == mode)


def with_cap(profile: Profile, cap: int) -> Profile:
    return profile.model_copy(update={"knobs": profile.knobs.model_copy(update={"max_num_seqs": cap})})


async def run_mode(profile: Profile, mode: str, seed: int, options: RunOptions) -> tuple[RunResult, dict[str, Any]]:
    """One simulator run of `profile` in `mode`; the result and the policy's own description."""
    from core.backends.factory import make_backend

    backend = make_backend("sim", profile, seed=seed, mode=mode)
    try:
        result = await run_workload(profile, backend, null_sink, options)
    finally:
        await backend.close()
    ran = result.outcome.notes.get("mode")
    if not isinstance(ran, dict) or ran.get("mode") != mode:
        # A simulator without the controller seam would serve every mode as fcfs: refuse to report that.
        raise BackendUnavailable(f"the simulator did not run mode {mode!r} (it reports {ran!r}); update slo-console")
    return result, {**ran, "speculation": speculation_of(backend, profile.knobs)}


def speculation_of(backend: object, knobs: KnobsSpec) -> str | None:
    """How `backend`'s last run drafted tokens (the table's speculation column): the simulated policy's own
    account (AdaServe drafts token trees where the knobs turn speculation off); on a managed vLLM started
    with AdaServe's batch-size schedule, that schedule; on another managed vLLM, the knobs' static chain.
    None for a server given by URL: it speculates as it was started, which this process does not know."""
    engine = getattr(backend, "last_engine", None)
    if engine is not None:
        return engine.policy.speculation(knobs)
    server = getattr(getattr(backend, "inner", backend), "server", None)
    if server is None:
        return None
    if getattr(server, "speculation_extra", None):
        return f"by batch size, up to {knobs.effective_spec_width}"
    from core.controller_api import Policy

    return Policy().speculation(knobs)


def _best_key(summary: Summary) -> tuple[float, float, float]:
    def num(value: float) -> float:
        return value if value == value else float("-inf")  # NaN ranks last

    return (num(summary.slo_attainment), num(summary.goodput_rps), -num(summary.p99_s))


@dataclass(slots=True)
class ModeRun:
    """What one compare task hands back (it may have run in another process): the run and the policy's own
    description, or why this workload cannot run the mode."""

    result: RunResult | None
    policy: dict[str, Any]
    wall_s: float
    skipped: str | None = None


async def mode_task(profile: Profile, mode: str, seed: int, options: RunOptions, keep_records: bool) -> ModeRun:
    """One mode (or one static cap) of a compare, as an executor task (core/executor.py). Without
    `keep_records` the run's request records stay where it ran: the static sweep needs only the summary."""
    start = time.perf_counter()
    try:
        result, policy = await run_mode(profile, mode, seed, options)
    except ProfileError as exc:  # a mode this workload cannot run
        return ModeRun(None, {}, time.perf_counter() - start, skipped=str(exc))
    if not keep_records:
        result.outcome = replace(result.outcome, records=[], samples=[])
    return ModeRun(result, policy, time.perf_counter() - start)


async def run_compare(
    profile: Profile,
    *,
    seed: int | None = None,
    requests: int | None = None,
    duration_s: float | None = None,
    modes: Sequence[str] | None = None,
    sink: EventSink = null_sink,
    executor: Executor | None = None,
) -> CompareResult:
    """Run every mode (default: all of `MODES`) and the best static cap on the same seeded arrivals. Each
    mode and each static cap is one task on `executor` (default: one after another in this process); rows,
    events and the table keep the order of `modes`, then the best static cap, whatever finished first."""
    from core.modes import MODES

    executor = executor or Executor()
    asked = MODES if modes is None else modes
    names = [name if name == BEST_STATIC else parse_scheduling_mode(name, "mode") for name in asked]
    names = [name for name in names if name != BEST_STATIC]
    if profile.workload.arrival is not None and profile.workload.arrival.kind == "closed":
        raise ProfileError(
            f"{profile.name}: --job compare needs open-loop arrivals (a closed loop would let a policy slow the"
            " offered load); set workload.arrival to poisson, gamma, constant or onoff"
        )
    seed = profile.seed if seed is None else seed
    options = RunOptions(seed=seed, requests=requests, duration_s=duration_s, engine_events=False)
    start = time.perf_counter()
    sink(make_event("start", job="compare", profile=profile.name, seed=seed, modes=[*names, BEST_STATIC]))
    caps = list(profile.saber.static_caps)

    def task(label: str, run_profile: Profile, mode: str, keep: bool) -> Callable[[], Awaitable[ModeRun]]:
        return lambda: executor.run(label, mode_task, run_profile, mode, seed, options, keep)

    starts = [task(name, profile.with_mode(name), name, True) for name in names]
    starts += [
        task(f"fcfs max_num_seqs={cap}", with_cap(profile, cap).model_copy(update={"mode": "fcfs"}), "fcfs", False)
        for cap in caps
    ]
    rows: list[ModeRow] = []
    runs: dict[str, RunResult] = {}
    skipped: dict[str, str] = {}
    trace_rows: dict[str, int] | None = None
    interrupted = False
    sweep: dict[int, float] = {}
    best: tuple[int, RunResult, str | None] | None = None
    sweep_wall_s = 0.0
    try:
        async with contextlib.aclosing(executor.in_order(starts)) as finished:
            index = -1
            async for run in finished:
                index += 1
                if index < len(names):
                    name = names[index]
                    if run.skipped is not None:
                        skipped[name] = run.skipped
                        sink(make_event("compare_row", mode=name, skipped=run.skipped))
                        continue
                    assert run.result is not None
                    result = run.result
                    trace_rows = result.extra.get("trace_rows", trace_rows)
                    runs[name] = result
                    speculation = run.policy.pop("speculation")
                    rows.append(
                        ModeRow(name, profile.knobs.max_num_seqs, speculation, result.summary, run.wall_s, run.policy)
                    )
                    sink(make_event("compare_row", mode=name, **rows[-1].fields()))
                else:
                    cap = caps[index - len(names)]
                    if run.skipped is not None:
                        raise ProfileError(run.skipped)
                    assert run.result is not None
                    result = run.result
                    sweep[cap] = result.summary.slo_attainment
                    sweep_wall_s += run.wall_s
                    if best is None or _best_key(result.summary) > _best_key(best[1].summary):
                        best = (cap, result, run.policy["speculation"])
                if result.interrupted:
                    interrupted = True
                    break
    except asyncio.CancelledError:  # Ctrl-C on a parallel executor: its tasks are cancelled; keep the rows so far
        interrupted = True
    if best is not None:
        cap, result, speculation = best
        policy = {"mode": "fcfs", "static_sweep": {str(k): v for k, v in sweep.items()}}
        rows.append(ModeRow(BEST_STATIC, cap, speculation, result.summary, sweep_wall_s, policy))
        sink(make_event("compare_row", mode=BEST_STATIC, **rows[-1].fields()))
    return CompareResult(
        profile, seed, rows, sweep, time.perf_counter() - start, interrupted, skipped, runs, trace_rows
    )


def compare_summary_event(result: CompareResult) -> dict[str, Any]:
    """The final line of `--job compare`: every mode's headline figures under `modes`."""
    return make_event(
        "summary",
        job="compare",
        profile=result.profile.name,
        backend="sim",
        seed=result.seed,
        interrupted=result.interrupted,
        modes={row.mode: row.fields() for row in result.rows},
        static_sweep={str(cap): value for cap, value in result.static_sweep.items()},
        skipped=result.skipped,
        **({"trace_rows": result.trace_rows} if result.trace_rows is not None else {}),
        compare_wall_s=result.wall_s,
    )


# The table's columns after the mode's name: (header, field of `ModeRow.fields()`, digits; None: as is). One
# definition for the batch table below and the console's Modes tab (console/widgets/modes.py); the per-task
# SLO attainment columns follow `slo_attainment`.
TABLE_COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("max_seqs", "max_num_seqs", None),
    ("speculation", "speculation", None),
    ("SLO att.", "slo_attainment", 3),
    ("goodput r/s", "goodput_rps", 2),
    ("tok goodput t/s", "token_goodput_tps", 1),
    ("smooth gp", "smooth_goodput", 1),
    ("p99 s", "p99_s", 2),
    ("CV e2e/SLA", "cv_completion_over_slo", 3),
    ("rejected", "rejected", None),
    ("deferred", "deferred", None),
)


def _cell(value: Any, digits: int | None, unknown: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return unknown
    if isinstance(value, float) and digits is not None:
        return f"{value:.{digits}f}"
    return str(value)


def table_header(tasks: Sequence[str] = ()) -> list[str]:
    """The table's column headers, with one SLO attainment column per task in `tasks`."""
    header = ["mode"]
    for title, name, _ in TABLE_COLUMNS:
        header.append(title)
        if name == "slo_attainment":
            header.extend(f"att. {task}" for task in tasks)
    return header


def table_cells(mode: str, fields: Mapping[str, Any], tasks: Sequence[str] = (), unknown: str = "-") -> list[str]:
    """One mode's row under `table_header(tasks)`; a figure not known (yet) reads `unknown`."""
    cells = [mode]
    per_task = fields.get("slo_attainment_per_task") or {}
    for _, name, digits in TABLE_COLUMNS:
        cells.append(_cell(fields.get(name), digits, unknown))
        if name == "slo_attainment":
            cells.extend(_cell(per_task.get(task), 3, unknown) for task in tasks)
    return cells


def table_tasks(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The tasks with their own SLO attainment column: every task any row reports, in first-seen order."""
    tasks: list[str] = []
    for fields in rows:
        tasks.extend(t for t in fields.get("slo_attainment_per_task") or {} if t not in tasks)
    return tasks


def format_table(result: CompareResult) -> str:
    """The compare table as aligned text (one row per mode; per-task SLO attainment in its own columns)."""
    fields = [row.fields() for row in result.rows]
    tasks = table_tasks(fields)
    lines = [
        table_header(tasks),
        *(table_cells(row.mode, f, tasks) for row, f in zip(result.rows, fields, strict=True)),
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    rendered = []
    for line in lines:
        cells = [cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))]
        rendered.append("  ".join(cells))
    return "\n".join(rendered)
