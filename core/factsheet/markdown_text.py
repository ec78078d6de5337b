"""The factsheet page's Markdown text pieces: figures for people (significant digits, units, "unknown" for
what is not known), table rows and cells, verdict wording. Shared by the run's sections (render.py) and the
jobs' sections (job_sections.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.factsheet.model import (
    Figure,
    LatencyStats,
    SLOTargets,
    Spread,
    TuningPoint,
    Verdict,
)

UNKNOWN = "unknown"


def cell(text: Any) -> str:
    # A pipe or newline inside a cell would break the table.
    return str(text).replace("|", "\\|").replace("\n", " ")


def num(value: float | int | None, unit: str = "", digits: int = 4) -> str:
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


def knob(value: Any) -> str:
    return "not set" if value is None else str(value)


def scalar_text(value: Any) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return num(value)
    return UNKNOWN if value is None else str(value)


def pct(share: float | None) -> str:
    return UNKNOWN if share is None else f"{share * 100:.1f}%"


def table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return lines


def slo_text(slo: SLOTargets) -> str:
    parts = [
        f"{label} ≤ {num(value, 's')}"
        for label, value in (("e2e", slo.e2e_s), ("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s))
        if value is not None
    ]
    return "; ".join(parts) or "none"


def figure_value(figure: Figure) -> str:
    if figure.value is None:
        return f"unavailable: {figure.reason}"
    return num(figure.value, figure.unit)


def mapping_text(mapping: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in mapping.items() if value is not None)


def point_row(label: str, point: TuningPoint | None) -> list[str]:
    if point is None:
        return [label, UNKNOWN, UNKNOWN, UNKNOWN, UNKNOWN]
    return [
        label,
        mapping_text(point.knobs) or UNKNOWN,
        num(point.goodput_rps, "req/s"),
        num(point.p99_s, "s"),
        pct(point.slo_attainment),
    ]


def latency_row(label: str, stats: LatencyStats) -> list[str]:
    values = (stats.p50_s, stats.p90_s, stats.p95_s, stats.p99_s, stats.mean_s)
    return [label, *(num(value, "s") for value in values)]


def verdict_lines(verdict: Verdict) -> list[str]:
    lines = [f"**{verdict.headline}.**"]
    if verdict.per_task:
        lines += [
            "",
            *table(
                ["Task", "Verdict", "Checked"],
                [
                    [name, STATE_TEXT[task.state], "; ".join(check.text for check in task.checks)]
                    for name, task in verdict.per_task.items()
                ],
            ),
        ]
    return lines


STATE_TEXT = {"met": "met", "violated": "violated", "unmeasured": "unknown", "no_slo": "no SLO"}


def verdict_cell(verdict: Verdict) -> str:
    """ "violated by 9%", "met, 30% to spare", "unknown", "no SLO"."""
    margin = verdict.margin
    if margin is None or verdict.state not in ("met", "violated"):
        return STATE_TEXT[verdict.state]
    if verdict.state == "violated":
        return f"violated by {margin:.0%}"
    return f"met, {-margin:.0%} to spare"


def spread_text(spread: Spread, text: Callable[[float | None], str]) -> str:
    if spread.min == spread.max:
        return text(spread.min)
    return f"{text(spread.min)} to {text(spread.max)} (median {text(spread.median)})"
