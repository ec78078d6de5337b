"""The factsheet page's sections for what a job adds to a run: the tuner's trajectory, compare's modes,
capacity's rates and the calibration's fit (render.py puts them right after the headline)."""

from __future__ import annotations

from collections.abc import Iterable

from core.factsheet.markdown_text import (
    UNKNOWN,
    num,
    pct,
    point_row,
    scalar_text,
    spread_text,
    table,
    verdict_cell,
)
from core.factsheet.model import (
    Factsheet,
)


def tuning_section(f: Factsheet) -> list[str]:
    tuning = f.tuning
    if tuning is None:
        return []
    lines = [
        "## Tuning",
        "",
        f"- Tuner: {tuning.tuner or UNKNOWN}; objective: {tuning.objective or UNKNOWN}",
        f"- Segments: {num(tuning.segments)}; wall time: {num(tuning.wall_time_s, 's')}",
    ]
    spread = tuning.spread
    if spread is not None:
        lines.append(
            f"- The tuned configuration over its {spread.measurements} measurement(s): "
            f"p99 {spread_text(spread.p99_s, lambda v: num(v, 's'))}; SLO attainment "
            f"{spread_text(spread.slo_attainment, pct)}; "
            f"goodput {spread_text(spread.goodput_rps, lambda v: num(v, 'req/s'))}"
        )
    lines += [
        "",
        *table(
            ["Point", "Knobs", "Goodput", "p99", "SLO attainment"],
            [point_row("baseline", tuning.baseline), point_row("tuned", tuning.tuned)],
        ),
    ]
    if tuning.trajectory:
        lines += [
            "",
            "Trajectory:",
            "",
            *table(
                ["Segment", "Knobs", "Goodput", "p99", "SLO attainment"],
                [point_row(str(i), point) for i, point in enumerate(tuning.trajectory, start=1)],
            ),
        ]
    return lines


def keys_in_order(mappings: Iterable[Iterable[str]]) -> list[str]:
    """Every key of the rows' mappings once, in the order they first appear (a table's extra columns)."""
    return list(dict.fromkeys(key for mapping in mappings for key in mapping))


def compare_section(f: Factsheet) -> list[str]:
    compare = f.compare
    if compare is None:
        return []
    tasks = keys_in_order(row.slo_attainment_per_task for row in compare.rows)
    lines = [
        "## Compare",
        "",
        f"Every scheduling mode on the same seeded arrivals (seed {compare.seed}, simulator)"
        + (", stopped early: the rows are the modes finished before the stop." if compare.interrupted else "."),
        "",
        *table(
            [
                "Mode",
                "max_num_seqs",
                "Speculation",
                "SLO",
                "SLO attainment",
                *[f"Attainment {task}" for task in tasks],
                "Goodput",
                "p99",
                "CV e2e/SLO",
                "Rejected",
                "Deferred",
            ],
            [
                [
                    row.mode,
                    num(row.max_num_seqs),
                    row.speculation or UNKNOWN,
                    verdict_cell(row.verdict),
                    pct(row.slo_attainment),
                    *[pct(row.slo_attainment_per_task.get(task)) for task in tasks],
                    num(row.goodput_rps, "req/s"),
                    num(row.p99_s, "s"),
                    num(row.cv_completion_over_slo),
                    num(row.rejected),
                    num(row.deferred),
                ]
                for row in compare.rows
            ],
        ),
    ]
    if compare.static_sweep:
        sweep = ", ".join(f"{cap}: {pct(share)}" for cap, share in compare.static_sweep.items())
        lines += ["", f"- fcfs SLO attainment by static max_num_seqs: {sweep}"]
    lines += [f"- {mode}: not run ({reason})" for mode, reason in compare.skipped.items()]
    return lines


# The capacity job's per-mode keys beyond the fixed columns (core/capacity.py), as a reader names them.
CAPACITY_LABELS = {
    "scale": "× the profile's rate",
    "base_rate_rps": "Profile's rate (req/s)",
    "arrival_source": "Arrivals",
}


def capacity_label(key: str) -> str:
    return CAPACITY_LABELS.get(key, key)


def capacity_section(f: Factsheet) -> list[str]:
    capacity = f.capacity
    if capacity is None:
        return []
    extra = keys_in_order(row.other for row in capacity.rows)
    baseline = capacity.rows[0].mode if capacity.rows else "the first"
    lines = [
        "## Capacity",
        "",
        f"Each mode's highest request rate with SLO attainment ≥ {pct(capacity.attainment_target)} "
        "(simulator; the rate bracketed, then bisected). "
        + (
            f"The profile offers {num(capacity.offered_rate_rps, 'req/s')}."
            if capacity.offered_rate_rps is not None
            else ""
        ),
        "",
        *table(
            ["Mode", "Capacity", "Per replica", "Replicas", f"× {baseline}", "Probes", *map(capacity_label, extra)],
            [
                [
                    row.mode,
                    num(row.capacity_rps, "req/s"),
                    num(row.capacity_per_replica_rps, "req/s"),
                    num(row.replicas),
                    num(row.ratio_to_first),
                    num(row.probes),
                    *[scalar_text(row.other.get(key)) for key in extra],
                ]
                for row in capacity.rows
            ],
        ),
    ]
    lines += [f"- {mode}: not run ({reason})" for mode, reason in capacity.skipped.items()]
    return lines


def calibration_section(f: Factsheet) -> list[str]:
    cal = f.calibration
    if cal is None:
        return []
    lines = [
        "## Calibration",
        "",
        f"- Written to: {cal.path or 'nothing (the sweep was interrupted)'}",
        f"- Sweep: {cal.points} points, {num(cal.observations)} step observations; wall time "
        f"{num(cal.wall_time_s, 's')}",
        f"- Fit: RMS relative error {pct(cal.rms_relative_error)}, max {pct(cal.max_relative_error)}",
        f"- Fitted decode step at the median observation: {num(cal.fitted_decode_step_s, 's')} "
        f"(median inter-token latency measured {num(cal.median_itl_s, 's')})",
        f"- Request overhead outside the engine steps: {num(cal.request_overhead_s, 's')}",
        f"- KV capacity: {num(cal.kv_capacity_tokens, 'tokens')}; step noise CV {num(cal.noise_cv)}; "
        f"speculation acceptance {num(cal.default_acceptance)}",
    ]
    if cal.terms:
        names = list(dict.fromkeys(key for term in cal.terms for key in term))
        lines += ["", *table(names, [[scalar_text(term.get(name)) for name in names] for term in cal.terms])]
    return lines
