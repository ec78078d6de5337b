"""Render a factsheet: JSON (canonical, stable bytes) and Markdown (a page for people), and write both."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from core.durable_files import replace_atomically
from core.factsheet.job_sections import calibration_section, capacity_section, compare_section, tuning_section
from core.factsheet.markdown_text import (
    UNKNOWN,
    figure_value,
    knob,
    latency_row,
    mapping_text,
    num,
    pct,
    scalar_text,
    slo_text,
    table,
    verdict_lines,
)
from core.factsheet.model import (
    Factsheet,
    WorkloadSection,
)

JSON_NAME = "factsheet.json"
MARKDOWN_NAME = "factsheet.md"
# Significant digits kept in JSON: enough for any figure here, and the same bytes on every platform.
JSON_SIGNIFICANT_DIGITS = 6


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


# ---------------------------------------------------------------- Markdown sections


def _headline(f: Factsheet) -> list[str]:
    perf = f.performance
    sus = f.sustainability
    lines = ["## Headline", "", *verdict_lines(f.verdict)]
    if perf is None or sus is None:
        return lines
    return [
        *lines,
        "",
        *table(
            ["Figure", "Value", "Basis"],
            [
                ["SLO", slo_text(f.workload.slo), "profile"],
                ["p99 end-to-end latency", num(perf.e2e.p99_s, "s"), perf.basis],
                ["Goodput", num(perf.goodput_rps, "req/s"), perf.basis],
                ["SLO attainment", pct(perf.slo_attainment), perf.basis],
                [
                    "Energy per 1k output tokens",
                    figure_value(sus.wh_per_1k_output_tokens),
                    sus.wh_per_1k_output_tokens.basis,
                ],
                [
                    "gCO2e per 1k output tokens",
                    figure_value(sus.gco2e_per_1k_output_tokens),
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
        gpus = ", ".join(f"GPU {gpu.index}: {gpu.name}, {num(gpu.memory_total_mib, 'MiB')}" for gpu in host.gpus)
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
        f"- CPU: {host.cpu_model or UNKNOWN}, {num(host.cpu_logical_cores)} logical cores; "
        f"memory {num(host.memory_total_gib, 'GiB')}",
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
        *table(["Knob", "Value"], [[name, knob(value)] for name, value in config.knobs.items()]),
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
        arrival_text = f"{arrival.pop('kind', UNKNOWN)} ({mapping_text(arrival)})"
    else:
        arrival_text = f"trace replay ({mapping_text(workload.trace or {})})"
    lines = [
        "## Workload",
        "",
        f"- Profile: {workload.profile}" + (f": {workload.description}" if workload.description else ""),
        f"- Arrivals: {arrival_text}",
        f"- Requests: {_request_limit_text(workload)}; duration limit: "
        f"{'none' if workload.duration_s is None else num(workload.duration_s, 's')}; "
        f"warm-up excluded: {workload.warmup_requests} requests, {num(workload.warmup_s, 's')}",
        f"- Default SLO: {slo_text(workload.slo)}",
    ]
    if workload.tasks:
        lines += [
            "",
            *table(
                ["Task", "Share", "Prompt tokens", "Output tokens", "SLO"],
                [
                    [
                        task.name,
                        pct(task.share),
                        mapping_text(task.prompt_tokens),
                        mapping_text(task.output_tokens),
                        slo_text(task.slo),
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
            f"(failed by cause: {mapping_text(perf.failed_by_status) or 'none reported'})."
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
        capacity = f"{num(perf.capacity_rps, 'req/s')} at attainment ≥ {pct(perf.capacity_attainment_target)}"
    lines = [
        "## Performance",
        "",
        f"Basis: {basis}.",
        "",
        f"- Measurement window: {num(perf.window_s, 's')}",
        f"- Requests: {num(perf.requests)} submitted, {num(perf.completed)} completed, "
        f"{num(perf.failed)} failed (by cause: {failures})",
        "",
        *table(
            ["Latency", "p50", "p90", "p95", "p99", "mean"],
            [
                latency_row("End-to-end", perf.e2e),
                latency_row("TTFT", perf.ttft),
                latency_row("TPOT", perf.tpot),
                latency_row("ITL", perf.itl),
            ],
        ),
        "",
        f"- Goodput: {num(perf.goodput_rps, 'req/s')}",
        f"- SLO attainment: {pct(perf.slo_attainment)}",
        f"- Token goodput: {num(perf.token_goodput_tps, 'tok/s')}",
        f"- Throughput: {num(perf.throughput_rps, 'req/s')} completed",
        f"- Output throughput: {num(perf.output_tps, 'tok/s')} ({num(perf.output_tokens)} output tokens)",
        f"- Smooth goodput: {num(smooth.value, 'benefit tok/s')} (α = {num(smooth.alpha)}, "
        f"V = {num(smooth.reading_speed_tps, 'tok/s')}, "
        + (
            "token i due at i/V (paper 003 eq. 4), "
            if smooth.ttft_allow_s is None
            else f"first token allowed {num(smooth.ttft_allow_s, 's')}, "
        )
        + f"f = {smooth.penalty or UNKNOWN})",
        f"- Capacity under the SLO: {capacity}",
    ]
    if perf.per_task:
        lines += [
            "",
            *table(
                ["Task", "Requests", "Completed", "p50", "p99", "SLO attainment", "Goodput", "Token goodput"],
                [
                    [
                        name,
                        num(t.requests),
                        num(t.completed),
                        num(t.p50_s, "s"),
                        num(t.p99_s, "s"),
                        pct(t.slo_attainment),
                        num(t.goodput_rps, "req/s"),
                        num(t.token_goodput_tps, "tok/s"),
                    ]
                    for name, t in perf.per_task.items()
                ],
            ),
        ]
    if perf.other_metrics:
        lines += [
            "",
            *table(["Other metric", "Value"], [[k, scalar_text(v)] for k, v in perf.other_metrics.items()]),
        ]
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
            f"- Energy window: {num(meter.window_s, 's')}",
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
        *table(
            ["Figure", "Value", "Basis", "Source"],
            [[name, figure_value(fig), fig.basis, fig.source] for name, fig in figures],
        ),
        "",
        f"- Grid carbon intensity: {num(carbon.grid_intensity_gco2e_per_kwh, 'gCO2e/kWh')} "
        f"({carbon.grid_region}, {carbon.accounting}; {carbon.grid_intensity_source}; "
        f"year {carbon.grid_intensity_year})",
        f"- PUE: {num(carbon.pue)} ({carbon.pue_source}; year {carbon.pue_year})",
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
        tuning_section(factsheet),
        compare_section(factsheet),
        capacity_section(factsheet),
        calibration_section(factsheet),
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
