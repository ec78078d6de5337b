"""Workloads: arrival processes, token lengths, task mixes and trace replay, turned into a `LoadPlan`.

`build_load_plan(profile)` is the entry point; the pieces are exported for tools and tests that need
them on their own (e.g. the tuner's simulator-guided search samples lengths to estimate load).
"""

from core.workload.arrivals import (
    ArrivalProcess,
    ConstantProcess,
    GammaProcess,
    OnOffProcess,
    PoissonProcess,
    make_arrival_process,
    mean_rate_rps,
)
from core.workload.lengths import LengthModelError, LengthSampler, make_length_sampler
from core.workload.plan import BLOCK_SIZE, ResolvedTask, build_load_plan, request_slo, resolve_tasks
from core.workload.trace import TraceTable, load_trace

__all__ = [
    "BLOCK_SIZE",
    "ArrivalProcess",
    "ConstantProcess",
    "GammaProcess",
    "LengthModelError",
    "LengthSampler",
    "OnOffProcess",
    "PoissonProcess",
    "ResolvedTask",
    "TraceTable",
    "build_load_plan",
    "load_trace",
    "make_arrival_process",
    "make_length_sampler",
    "mean_rate_rps",
    "request_slo",
    "resolve_tasks",
]
