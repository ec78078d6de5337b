"""Request records -> latency, goodput, SLO attainment and smooth goodput (definitions: docs/metrics.md)."""

from core.metrics.outcomes import RequestOutcomes, benefit, compute_outcomes, idle_latency_s
from core.metrics.smooth_goodput import PENALTIES, penalty
from core.metrics.summary import PERCENTILES, Summary, TaskSummary, percentiles, summarize
from core.metrics.window import WindowedAggregator, WindowSnapshot, WindowTotals

__all__ = [
    "PENALTIES",
    "PERCENTILES",
    "RequestOutcomes",
    "Summary",
    "TaskSummary",
    "WindowSnapshot",
    "WindowTotals",
    "WindowedAggregator",
    "benefit",
    "compute_outcomes",
    "idle_latency_s",
    "penalty",
    "percentiles",
    "summarize",
]
