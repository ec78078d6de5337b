"""Render a factsheet: JSON (canonical, stable bytes) and Markdown (a page for people), and write both."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.durable_files import replace_atomically
from core.factsheet.model import (
    Factsheet,
    Figure,
    LatencyStats,
    SLOTargets,
    Spread,
    TuningPoint,
    Verdict,
    WorkloadSection,
)

JSON_NAME = "factsheet.json"
MARKDOWN_NAME = "factsheet.md"
# Significant digits kept in JSON: enough for any figure here, and the same bytes on every platform.
JSON_SIGNIFICANT_DIGITS = 6
UNKNOWN = "unknown"


# ---------------------------------------------------------------- JSON


def _round(value: Any) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.{JSON_SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {key: _round(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_round(item) for item in value]
    return value


def factsheet_data(factsheet: Factsheet) -> dict[str, Any]:
    """The JSON-ready dict: schema field order (maps were sorted when built), floats rounded."""
    return _round(factsheet.model_dump(mode="json", by_alias=True))


def render_json(factsheet: Factsheet) -> str:
    return json.dumps(factsheet_data(factsheet), indent=2, ensure_ascii=False) + "\n"


# ---------------------------------------------------------------- Markdown helpers


def _cell(text: Any) -> str:
    # A pipe or newline inside a cell would break the table.
    return str(text).replace("|", "\\|").replace("\n", " ")


def _num(value: float | int | None, unit: str = "", digits: int = 4) -> str:
    """A figure for people: `digits` significant digits, thousands separated, never exponent notation
    for the magnitudes a factsheet holds."""
    if value is None:
        return UNKNOWN
    if abs(value) >= 10**digits:
        text = f"{value:,.0f}"
    elif isinstance(value, int):
        text = str(value)
    else:
        text = f"{value:.{digits}g}"
    return f"{text} {unit}".rstrip()


def _knob(value: Any) -> str:
    return "not set" if value is None else str(value)


def _scalar_text(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _num(value)
    return UNKNOWN if value is None else str(value)


def _pct(share: float | None) -> str:
    return UNKNOWN if share is None else f"{share * 100:.1f}%"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return lines


def _slo_text(slo: SLOTargets) -> str:
    parts = [
        f"{label} ≤ {_num(value, 's')}"
        for label, value in (("e2e", slo.e2e_s), ("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s))
        if value is not None
    ]
    return "; ".join(parts) or "none"


def _figure_value(figure: Figure) -> str:
    if figure.value is None:
        return f"unavailable: {figure.reason}"
    return _num(figure.value, figure.unit)


def _mapping_text(mapping: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in mapping.items() if value is not None)


def _point_row(label: str, point: TuningPoint | None) -> list[str]:
    if point is None:
        return [label, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN]
    return [
        label,
        _mapping_text(point.knobs) or UNKNOWN,
        _num(point.goodput_rps, "req/s"),
        _num(point.p99_s, "s"),
        _pct(point.slo_attainment),
    ]


def _latency_row(label: str, stats: LatencyStats) -> list[str]:
    values = (stats.p50_s, stats.p90_s, stats.p95_s, stats.p99_s, stats.mean_s)
    return [label, *(_num(value, "s") for value in values)]


# ---------------------------------------------------------------- Markdown sections


def _verdict_lines(verdict: Verdict) -> list[str]:
    lines = [f"**{verdict.headline}.**"]
    if verdict.per_task:
        lines += [
            "",
            *_table(
                ["Task", "Verdict", "Checked"],
                [
                    [name, _STATE_TEXT[task.state], "; ".join(check.text for check in task.checks)]
                    for name, task in verdict.per_task.items()
                ],
            ),
        ]
    return lines


_STATE_TEXT = {"met": "met", "violated": "violated", "unmeasured": "unknown", "no_slo": "no SLO"}


def _headline(f: Factsheet) -> list[str]:
    perf = f.performance
    sus = f.sustainability
    lines = ["## Headline", "", *_verdict_lines(f.verdict)]
    if perf is None or sus is None:
        return lines
    return [
        *lines,
        "",
        *_table(
            ["Figure", "Value", "Basis"],
            [
                ["SLO", _slo_text(f.workload.slo), "profile"],
                ["p99 end-to-end latency", _num(perf.e2e.p99_s, "s"), perf.basis],
                ["Goodput", _num(perf.goodput_rps, "req/s"), perf.basis],
                ["SLO attainment", _pct(perf.slo_attainment), perf.basis],
                [
                    "Energy per 1k output tokens",
                    _figure_value(sus.wh_per_1k_output_tokens),
                    sus.wh_per_1k_output_tokens.basis,
                ],
                [
                    "gCO2e per 1k output tokens",
                    _figure_value(sus.gco2e_per_1k_output_tokens),
                    sus.gco2e_per_1k_output_tokens.basis,
                ],
            ],
        ),
    ]


def _system(f: Factsheet) -> list[str]:
    system = f.system
    host = system.host
    if system.engine == "simulator":
        modelling = system.modelled_hardware or UNKNOWN
        engine = f"simulator (calibration {system.calibration or UNKNOWN}, modelling {modelling})"
    else:
        engine = f"{system.engine} {system.engine_version or '(version unknown)'}"
    if host.gpus:
        gpus = ", ".join(f"GPU {gpu.index}: {gpu.name}, {_num(gpu.memory_total_mib, 'MiB')}" for gpu in host.gpus)
        gpus += f" (driver {host.gpu_driver_version or UNKNOWN}; from {host.gpu_source})"
    else:
        gpus = f"none reported ({host.gpu_source})"
    return [
        "## System",
        "",
        f"- Model: {system.model or UNKNOWN}",
        f"- Engine: {engine}",
        f"- Backend: {system.backend}",
        f"- GPUs on the host: {gpus}",
        f"- CPU: {host.cpu_model or UNKNOWN}, {_num(host.cpu_logical_cores)} logical cores; "
        f"memory {_num(host.memory_total_gib, 'GiB')}",
        f"- Operating system: {host.operating_system or UNKNOWN}",
        f"- Software: {', '.join(f'{name} {version}' for name, version in host.software.items())}",
    ]


def _configuration(f: Factsheet) -> list[str]:
    config = f.configuration
    return [
        "## Configuration",
        "",
        f"- Backend: {config.backend}",
        f"- Scheduling mode: {config.scheduling_mode}",
        "",
        *_table(["Knob", "Value"], [[name, _knob(value)] for name, value in config.knobs.items()]),
    ]


def _request_limit_text(workload: WorkloadSection) -> str:
    if workload.requests is not None:
        return str(workload.requests)
    return "no count limit (the whole trace)" if workload.source == "trace" else "no count limit"


def _workload(f: Factsheet) -> list[str]:
    workload = f.workload
    if workload is None:
        return ["## Workload", "", "This job ran none of the profile's workload (see its own section)."]
    if workload.arrival is not None:
        arrival = dict(workload.arrival)
        arrival_text = f"{arrival.pop('kind', UNKNOWN)} ({_mapping_text(arrival)})"
    else:
        arrival_text = f"trace replay ({_mapping_text(workload.trace or {})})"
    lines = [
        "## Workload",
        "",
        f"- Profile: {workload.profile}" + (f": {workload.description}" if workload.description else ""),
        f"- Arrivals: {arrival_text}",
        f"- Requests: {_request_limit_text(workload)}; duration limit: "
        f"{'none' if workload.duration_s is None else _num(workload.duration_s, 's')}; "
        f"warm-up excluded: {workload.warmup_requests} requests, {_num(workload.warmup_s, 's')}",
        f"- Default SLO: {_slo_text(workload.slo)}",
    ]
    if workload.tasks:
        lines += [
            "",
            *_table(
                ["Task", "Share", "Prompt tokens", "Output tokens", "SLO"],
                [
                    [
                        task.name,
                        _pct(task.share),
                        _mapping_text(task.prompt_tokens),
                        _mapping_text(task.output_tokens),
                        _slo_text(task.slo),
                    ]
                    for task in workload.tasks
                ],
            ),
        ]
    lines += ["", "Definitions:", ""]
    lines += [f"- `{name}`: {text}" for name, text in workload.slo_definitions.items()]
    return lines


def _performance(f: Factsheet) -> list[str]:
    perf = f.performance
    if perf is None:
        return ["## Performance", "", "This job measures no single run; its own section holds what it measured."]
    if perf.requests == 0 or perf.completed == 0:
        nothing = (
            "Nothing was measured: no request was sent in the measurement window."
            if perf.requests == 0
            else f"Nothing was measured: none of the {perf.requests} requests completed "
            f"(failed by cause: {_mapping_text(perf.failed_by_status) or 'none reported'})."
        )
        return ["## Performance", "", nothing]
    basis = (
        "simulated by the discrete-event simulator (virtual time)"
        if perf.basis == "simulated"
        else "measured on the live server (wall clock)"
    )
    failures = ", ".join(f"{status} {count}" for status, count in perf.failed_by_status.items()) or "none"
    smooth = perf.smooth_goodput
    if perf.capacity_rps is None:
        capacity = "not measured in this run"
    else:
        capacity = f"{_num(perf.capacity_rps, 'req/s')} at attainment ≥ {_pct(perf.capacity_attainment_target)}"
    lines = [
        "## Performance",
        "",
        f"Basis: {basis}.",
        "",
        f"- Measurement window: {_num(perf.window_s, 's')}",
        f"- Requests: {_num(perf.requests)} submitted, {_num(perf.completed)} completed, "
        f"{_num(perf.failed)} failed (by cause: {failures})",
        "",
        *_table(
            ["Latency", "p50", "p90", "p95", "p99", "mean"],
            [
                _latency_row("End-to-end", perf.e2e),
                _latency_row("TTFT", perf.ttft),
                _latency_row("TPOT", perf.tpot),
                _latency_row("ITL", perf.itl),
            ],
        ),
        "",
        f"- Goodput: {_num(perf.goodput_rps, 'req/s')}",
        f"- SLO attainment: {_pct(perf.slo_attainment)}",
        f"- Token goodput: {_num(perf.token_goodput_tps, 'tok/s')}",
        f"- Throughput: {_num(perf.throughput_rps, 'req/s')} completed",
        f"- Output throughput: {_num(perf.output_tps, 'tok/s')} ({_num(perf.output_tokens)} output tokens)",
        f"- Smooth goodput: {_num(smooth.value, 'benefit tok/s')} (α = {_num(smooth.alpha)}, "
        f"V = {_num(smooth.reading_speed_tps, 'tok/s')}, "
        + (
            "token i due at i/V (paper 003 eq. 4), "
            if smooth.ttft_allow_s is None
            else f"first token allowed {_num(smooth.ttft_allow_s, 's')}, "
        )
        + f"f = {smooth.penalty or UNKNOWN})",
        f"- Capacity under the SLO: {capacity}",
    ]
    if perf.per_task:
        lines += [
            "",
            *_table(
                ["Task", "Requests", "Completed", "p50", "p99", "SLO attainment", "Goodput", "Token goodput"],
                [
                    [
                        name,
                        _num(t.requests),
                        _num(t.completed),
                        _num(t.p50_s, "s"),
                        _num(t.p99_s, "s"),
                        _pct(t.slo_attainment),
                        _num(t.goodput_rps, "req/s"),
                        _num(t.token_goodput_tps, "tok/s"),
                    ]
                    for name, t in perf.per_task.items()
                ],
            ),
        ]
    if perf.other_metrics:
        lines += [
            "",
            *_table(["Other metric", "Value"], [[k, _scalar_text(v)] for k, v in perf.other_metrics.items()]),
        ]
    return lines


def _spread(spread: Spread, text: Callable[[float | None], str]) -> str:
    if spread.min == spread.max:
        return text(spread.min)
    return f"{text(spread.min)} to {text(spread.max)} (median {text(spread.median)})"


def _tuning(f: Factsheet) -> list[str]:
    tuning = f.tuning
    if tuning is None:
        return []
    lines = [
        "## Tuning",
        "",
        f"- Tuner: {tuning.tuner or UNKNOWN}; objective: {tuning.objective or UNKNOWN}",
        f"- Segments: {_num(tuning.segments)}; wall time: {_num(tuning.wall_time_s, 's')}",
    ]
    spread = tuning.spread
    if spread is not None:
        lines.append(
            f"- The tuned configuration over its {spread.measurements} measurement(s): "
            f"p99 {_spread(spread.p99_s, lambda v: _num(v, 's'))}; SLO attainment "
            f"{_spread(spread.slo_attainment, _pct)}; goodput {_spread(spread.goodput_rps, lambda v: _num(v, 'req/s'))}"
        )
    lines += [
        "",
        *_table(
            ["Point", "Knobs", "Goodput", "p99", "SLO attainment"],
            [_point_row("baseline", tuning.baseline), _point_row("tuned", tuning.tuned)],
        ),
    ]
    if tuning.trajectory:
        lines += [
            "",
            "Trajectory:",
            "",
            *_table(
                ["Segment", "Knobs", "Goodput", "p99", "SLO attainment"],
                [_point_row(str(i), point) for i, point in enumerate(tuning.trajectory, start=1)],
            ),
        ]
    return lines


def _compare(f: Factsheet) -> list[str]:
    compare = f.compare
    if compare is None:
        return []
    tasks: list[str] = []
    for row in compare.rows:
        tasks.extend(task for task in row.slo_attainment_per_task if task not in tasks)
    lines = [
        "## Compare",
        "",
        f"Every scheduling mode on the same seeded arrivals (seed {compare.seed}, simulator)"
        + (", stopped early: the rows are the modes finished before the stop." if compare.interrupted else "."),
        "",
        *_table(
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
                    _num(row.max_num_seqs),
                    row.speculation or UNKNOWN,
                    _verdict_cell(row.verdict),
                    _pct(row.slo_attainment),
                    *[_pct(row.slo_attainment_per_task.get(task)) for task in tasks],
                    _num(row.goodput_rps, "req/s"),
                    _num(row.p99_s, "s"),
                    _num(row.cv_completion_over_slo),
                    _num(row.rejected),
                    _num(row.deferred),
                ]
                for row in compare.rows
            ],
        ),
    ]
    if compare.static_sweep:
        sweep = ", ".join(f"{cap}: {_pct(share)}" for cap, share in compare.static_sweep.items())
        lines += ["", f"- fcfs SLO attainment by static max_num_seqs: {sweep}"]
    lines += [f"- {mode}: not run ({reason})" for mode, reason in compare.skipped.items()]
    return lines


def _verdict_cell(verdict: Verdict) -> str:
    """ "violated by 9%", "met, 30% to spare", "unknown", "no SLO"."""
    margin = verdict.margin
    if margin is None or verdict.state not in ("met", "violated"):
        return _STATE_TEXT[verdict.state]
    if verdict.state == "violated":
        return f"violated by {margin:.0%}"
    return f"met, {-margin:.0%} to spare"


# The capacity job's per-mode keys beyond the fixed columns (core/capacity.py), as a reader names them.
CAPACITY_LABELS = {
    "scale": "× the profile's rate",
    "base_rate_rps": "Profile's rate (req/s)",
    "arrival_source": "Arrivals",
}


def _capacity_label(key: str) -> str:
    return CAPACITY_LABELS.get(key, key)


def _capacity(f: Factsheet) -> list[str]:
    capacity = f.capacity
    if capacity is None:
        return []
    extra: list[str] = []
    for row in capacity.rows:
        extra.extend(key for key in row.other if key not in extra)
    baseline = capacity.rows[0].mode if capacity.rows else "the first"
    lines = [
        "## Capacity",
        "",
        f"Each mode's highest request rate with SLO attainment ≥ {_pct(capacity.attainment_target)} "
        "(simulator; the rate bracketed, then bisected). "
        + (
            f"The profile offers {_num(capacity.offered_rate_rps, 'req/s')}."
            if capacity.offered_rate_rps is not None
            else ""
        ),
        "",
        *_table(
            ["Mode", "Capacity", "Per replica", "Replicas", f"× {baseline}", "Probes", *map(_capacity_label, extra)],
            [
                [
                    row.mode,
                    _num(row.capacity_rps, "req/s"),
                    _num(row.capacity_per_replica_rps, "req/s"),
                    _num(row.replicas),
                    _num(row.ratio_to_first),
                    _num(row.probes),
                    *[_scalar_text(row.other.get(key)) for key in extra],
                ]
                for row in capacity.rows
            ],
        ),
    ]
    lines += [f"- {mode}: not run ({reason})" for mode, reason in capacity.skipped.items()]
    return lines


def _calibration(f: Factsheet) -> list[str]:
    cal = f.calibration
    if cal is None:
        return []
    lines = [
        "## Calibration",
        "",
        f"- Written to: {cal.path or 'nothing (the sweep was interrupted)'}",
        f"- Sweep: {cal.points} points, {_num(cal.observations)} step observations; wall time "
        f"{_num(cal.wall_time_s, 's')}",
        f"- Fit: RMS relative error {_pct(cal.rms_relative_error)}, max {_pct(cal.max_relative_error)}",
        f"- Fitted decode step at the median observation: {_num(cal.fitted_decode_step_s, 's')} "
        f"(median inter-token latency measured {_num(cal.median_itl_s, 's')})",
        f"- Request overhead outside the engine steps: {_num(cal.request_overhead_s, 's')}",
        f"- KV capacity: {_num(cal.kv_capacity_tokens, 'tokens')}; step noise CV {_num(cal.noise_cv)}; "
        f"speculation acceptance {_num(cal.default_acceptance)}",
    ]
    if cal.terms:
        names = list(dict.fromkeys(key for term in cal.terms for key in term))
        lines += ["", *_table(names, [[_scalar_text(term.get(name)) for name in names] for term in cal.terms])]
    return lines


def _sustainability(f: Factsheet) -> list[str]:
    sus = f.sustainability
    if sus is None:
        return ["## Sustainability", "", "This job measures no single run, so no energy or carbon figure is given."]
    meter = sus.meter
    if meter is None:
        meter_lines = ["- Energy meter: none ran"]
    else:
        meter_lines = [
            f"- Energy basis: {meter.basis}" + (f" (reason: {meter.reason})" if meter.reason else ""),
            f"- Method: {meter.method}",
            f"- Device: {meter.device or UNKNOWN}",
            f"- Energy window: {_num(meter.window_s, 's')}",
        ]
        if meter.note:
            meter_lines.append(f"- Note: {meter.note}")
    figures = [
        ("Energy over the window", sus.energy_j),
        ("Average power", sus.avg_power_w),
        ("Energy per 1k output tokens", sus.wh_per_1k_output_tokens),
        ("Energy per completed request", sus.j_per_request),
        ("gCO2e per 1k output tokens", sus.gco2e_per_1k_output_tokens),
    ]
    carbon = sus.carbon_inputs
    return [
        "## Sustainability",
        "",
        *meter_lines,
        "",
        *_table(
            ["Figure", "Value", "Basis", "Source"],
            [[name, _figure_value(fig), fig.basis, fig.source] for name, fig in figures],
        ),
        "",
        f"- Grid carbon intensity: {_num(carbon.grid_intensity_gco2e_per_kwh, 'gCO2e/kWh')} "
        f"({carbon.grid_region}, {carbon.accounting}; {carbon.grid_intensity_source}; "
        f"year {carbon.grid_intensity_year})",
        f"- PUE: {_num(carbon.pue)} ({carbon.pue_source}; year {carbon.pue_year})",
    ]


def _provenance(f: Factsheet) -> list[str]:
    prov = f.provenance
    return [
        "## Provenance",
        "",
        f"- Generated: {prov.generated_at.isoformat()}",
        f"- Run started: {prov.run_started_at.isoformat()}",
        f"- slo-console {prov.slo_console_version}, git revision {prov.git_revision}",
        f"- Command line: `{' '.join(prov.command_line) or UNKNOWN}`",
        f"- Seed: {prov.seed}",
        f"- Profile: {prov.profile_name} (hash {prov.profile_hash}"
        + (f", file {prov.profile_path})" if prov.profile_path else ")"),
    ]


def _caveats(f: Factsheet) -> list[str]:
    return ["## Caveats", "", *(f"- {caveat}" for caveat in f.caveats)]


def render_markdown(factsheet: Factsheet) -> str:
    header = [
        f"# Factsheet: {factsheet.title}",
        "",
        f"Job: {factsheet.job}. Schema {factsheet.schema_name} {factsheet.schema_version}. The JSON beside this "
        "page is canonical; figures marked simulated or modelled are not measurements, and unknown means not "
        "known (not zero).",
    ]
    sections = [
        header,
        _headline(factsheet),
        # The job's own section comes right after the headline it explains.
        _tuning(factsheet),
        _compare(factsheet),
        _capacity(factsheet),
        _calibration(factsheet),
        _system(factsheet),
        _configuration(factsheet),
        _workload(factsheet),
        _performance(factsheet),
        _sustainability(factsheet),
        _provenance(factsheet),
        _caveats(factsheet),
    ]
    return "\n\n".join("\n".join(section) for section in sections if section) + "\n"


def write_factsheet(factsheet: Factsheet, out_dir: Path) -> tuple[Path, Path]:
    """Write factsheet.json and factsheet.md into out_dir (created if needed); return both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / JSON_NAME
    markdown_path = out_dir / MARKDOWN_NAME
    # Each file whole or absent (a run killed while writing them): core/durable_files.py.
    replace_atomically(json_path, render_json(factsheet))
    replace_atomically(markdown_path, render_markdown(factsheet))
    return json_path, markdown_path
