"""Was the SLO met, and by how much: one definition for the factsheet's headline, the batch runner's last
stderr line and the console's p99 tile.

A check compares one summary figure with its target: the p99 of a latency against the SLO the profile sets
for it (SLO-Tuner's constraint, paper 000 sec. II-B: p99 <= SLO). The margin is relative to the target:
p99 1.31 s against an SLO of 1.2 s is violated by 9%; p99 0.84 s is met with 30% to spare. A check whose
figure is unknown (nothing completed) is "unmeasured", never met.

    check_slo("p99", 1.31, 1.2).text()      -> "p99 1.31 s vs SLO 1.2 s: violated by 9%"
    slo_verdict(summary_dict, profile).headline()
        -> "SLO violated by 9% (p99 1.31 s vs SLO 1.2 s)"
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from core.metrics.summary_fields import finite_number
from core.profile import Profile, SLOSpec

VerdictState = Literal["met", "violated", "unmeasured", "no_slo"]

# (summary key, how a person names it, SLO field): the figures an SLO can be checked on, in headline order.
SLO_FIGURES = (
    ("p99_s", "p99", "e2e_s"),
    ("ttft_p99_s", "TTFT p99", "ttft_s"),
    ("tpot_p99_s", "TPOT p99", "tpot_s"),
)


def _figure(value: float, unit: str, digits: str = "#.3g") -> str:
    """Three significant digits for a measured figure (1.00 s, 0.842 s, 13.4 req/s); targets as written
    (digits ".4g": 1.2 s as written)."""
    text = f"{value:{digits}}".rstrip(".")
    return f"{text} {unit}".rstrip()


def _share(margin: float) -> str:
    """A relative margin as a person reads it: whole percent, one decimal below 1%."""
    share = abs(margin)
    return f"{share:.1%}" if share < 0.01 else f"{share:.0%}"


@dataclass(frozen=True, slots=True)
class SloCheck:
    """One figure against its target. `value` at or under `target` meets it."""

    metric: str  # as a person reads it: "p99", "TTFT p99", "rate"
    value: float | None
    target: float | None
    unit: str = "s"
    target_label: str = "SLO"
    share_word: str = "missed"  # for a share ("%"): what the share's requests did, "missed" or "failed"

    @property
    def state(self) -> VerdictState:
        if self.target is None:
            return "no_slo"
        if self.value is None:
            return "unmeasured"
        return "met" if self.value <= self.target else "violated"

    @property
    def margin(self) -> float | None:
        """value / target - 1: above 0 by how much the target is missed, below 0 how much is to spare."""
        if self.state not in ("met", "violated"):
            return None
        assert self.value is not None and self.target is not None
        return self.value / self.target - 1.0

    def short(self) -> str:
        """The verdict alone: "violated by 9%", "met with 30% to spare", "unknown" (no value), "no SLO"."""
        margin = self.margin
        if self.unit == "%" and self.state in ("met", "violated"):  # a share against a share: say both
            return f"{self.state}, {self.value:.1f}% {self.share_word} (p99 allows {self.target:g}%)"
        if self.state == "violated":
            assert margin is not None
            return f"violated by {_share(margin)}"
        if self.state == "met":
            assert margin is not None
            return f"met with {_share(margin)} to spare" if margin < 0 else "met, at the limit"
        return "unknown" if self.state == "unmeasured" else f"no {self.target_label}"

    def comparison(self) -> str:
        """ "p99 1.31 s vs SLO 1.2 s" (the figures alone)."""
        value = "unknown" if self.value is None else _figure(self.value, self.unit)
        if self.target is None:
            return f"{self.metric} {value}"
        return f"{self.metric} {value} vs {self.target_label} {_figure(self.target, self.unit, '.4g')}"

    def text(self) -> str:
        """ "p99 1.31 s vs SLO 1.2 s: violated by 9%"."""
        return f"{self.comparison()}: {self.short()}"


def check_slo(
    metric: str,
    value: Any,
    target: float | None,
    *,
    unit: str = "s",
    target_label: str = "SLO",
    share_word: str = "missed",
) -> SloCheck:
    """A check of `value` (None, NaN or inf: not measured) against `target` (None: no SLO set)."""
    return SloCheck(metric, finite_number(value), target, unit, target_label, share_word)


def _state_of(checks: tuple[SloCheck, ...]) -> VerdictState:
    states = {check.state for check in checks} - {"no_slo"}
    if not states:
        return "no_slo"
    if "violated" in states:
        return "violated"
    return "unmeasured" if "unmeasured" in states else "met"


@dataclass(frozen=True, slots=True)
class SloVerdict:
    """Every SLO the profile sets, checked on the p99 of its figure. When tasks set their own SLOs each task
    is checked against its own (or the profile's default) and `checks` is empty: a p99 over every task would
    mix requests held to different targets."""

    checks: tuple[SloCheck, ...]
    per_task: dict[str, SloVerdict] = field(default_factory=dict)
    requests: int | None = None  # submitted in the measurement window
    completed: int | None = None

    def all_checks(self) -> list[tuple[str | None, SloCheck]]:
        """(task or None, check) for every check, the run's own first."""
        own: list[tuple[str | None, SloCheck]] = [(None, c) for c in self.checks]
        return own + [(name, c) for name, v in self.per_task.items() for c in v.checks]

    @property
    def state(self) -> VerdictState:
        if self.completed == 0:
            return "unmeasured"
        return _state_of(tuple(c for _, c in self.all_checks()))

    @property
    def worst(self) -> tuple[str | None, SloCheck] | None:
        """The check that decides the verdict, with its task: the largest margin (most violated, or least
        to spare)."""
        judged = [(task, c) for task, c in self.all_checks() if c.margin is not None]
        return max(judged, key=lambda item: item[1].margin or 0.0) if judged else None

    @property
    def margin(self) -> float | None:
        worst = self.worst
        return None if worst is None else worst[1].margin

    def _nothing_measured(self) -> str:
        if self.requests == 0:
            return "nothing measured: no request was sent in the measurement window, so there is no SLO verdict"
        submitted = "" if self.requests is None else f" of {self.requests} submitted"
        return f"nothing measured: no request completed{submitted}, so there is no latency and no SLO verdict"

    def short(self) -> str:
        """The verdict alone: "violated by 9%", "met with 30% to spare", "unknown", "no SLO"."""
        state = self.state
        worst = self.worst
        if state == "no_slo":
            return "no SLO"
        if state == "unmeasured" or worst is None:
            return "unknown"
        return worst[1].short()

    def headline(self) -> str:
        """One line: "SLO violated by 9% (p99 1.31 s vs SLO 1.2 s)"; with tasks' own SLOs the worst task
        decides and each task follows: "SLO violated by 9% (worst: code, p99 ...); per task: chat met with 20%
        to spare, code violated by 9%"."""
        state = self.state
        if self.completed == 0:
            return self._nothing_measured()
        if state == "no_slo":
            return "no SLO set, so there is no SLO verdict"
        worst = self.worst
        if worst is None:
            return "SLO unknown (" + "; ".join(c.comparison() for _, c in self.all_checks()) + ")"
        task, check = worst
        others = [
            f"{c.comparison()}, {c.short()}"
            for t, c in self.all_checks()
            if t == task and c is not check and c.state != "unmeasured"
        ]
        detail = "; ".join([check.comparison(), *others])
        # With tasks, the deciding task: the worst violation, or the least to spare.
        where = "" if task is None else f"{'worst' if check.state == 'violated' else 'closest'}: {task}, "
        text = f"SLO {check.short()} ({where}{detail})"
        if state == "unmeasured":  # some figures unknown: the verdict covers the rest only
            unknown = [f"{t} {c.metric}" if t else c.metric for t, c in self.all_checks() if c.state == "unmeasured"]
            text = f"SLO verdict incomplete, {', '.join(unknown)} unknown; the rest {text.removeprefix('SLO ')}"
        if self.per_task:
            text += "; per task: " + ", ".join(f"{name} {v.short()}" for name, v in self.per_task.items())
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "margin": self.margin,
            "headline": self.headline(),
            "checks": [_check_dict(c) for c in self.checks],
            "per_task": {name: v.to_dict() for name, v in self.per_task.items()},
        }


def _check_dict(check: SloCheck) -> dict[str, Any]:
    return {
        "metric": check.metric,
        "value": check.value,
        "target": check.target,
        "unit": check.unit,
        "state": check.state,
        "margin": check.margin,
        "text": check.text(),
    }


# A trace's rows may each carry their own SLO (slo_e2e_s, slo_ttft_s, ...; the profile's is the default), so
# no single target fits a p99 over every request. The p99 constraint (paper 000 sec. II-B: p99 <= SLO) says
# the same thing request by request: at most 1% of requests miss the SLO. On a trace the verdict checks the
# share of requests that missed their own SLO (1 - slo_attainment, the measured figure) against that 1%.
OWN_SLO_MISS_ALLOWED_PERCENT = 1.0


def _own_slo_check(stats: Mapping[str, Any]) -> SloCheck:
    attainment = finite_number(stats.get("slo_attainment"))
    missed = None if attainment is None else 100.0 * (1.0 - attainment)
    return check_slo(
        "requests over their own SLO", missed, OWN_SLO_MISS_ALLOWED_PERCENT, unit="%", target_label="p99 allows"
    )


def _per_request_verdict(summary: Mapping[str, Any], counts: dict[str, int | None]) -> SloVerdict:
    """A trace's verdict: each request against its own SLO, overall and per task (the trace's task names)."""
    per_task: dict[str, SloVerdict] = {}
    for name, stats in (summary.get("per_task") or {}).items():
        if isinstance(stats, Mapping) and len(summary.get("per_task") or {}) > 1:
            per_task[name] = SloVerdict(
                (_own_slo_check(stats),), requests=stats.get("requests"), completed=stats.get("completed")
            )
    return SloVerdict((_own_slo_check(summary),), per_task, **counts)


# Faults, not policy: a request that errored, timed out or was cancelled. Rejected and deferred requests are a
# scheduling mode's decision, judged by its attainment and goodput; not-sent ones are the client's account.
FAULT_STATUSES = ("error", "timeout", "cancelled")


def _fault_checks(summary: Mapping[str, Any]) -> tuple[SloCheck, ...]:
    """The share of requests that failed, against the 1% the p99 constraint allows, where any failed.

    Percentiles are over completed requests (DESIGN: failures are counted separately), so a run where most
    requests failed (prompts longer than the model's context, a crashing server) can show a p99 well under
    its SLO. Under p99 <= SLO at most 1% of requests may miss it, and a failed request missed it, so more
    than 1% failed is a violation whatever the completed requests' p99 says."""
    requests = summary.get("requests")
    by_status = summary.get("failed_by_status") or {}
    faults = sum(int(by_status.get(status, 0) or 0) for status in FAULT_STATUSES)
    if not faults or not isinstance(requests, int) or requests <= 0:
        return ()
    share = 100.0 * faults / requests
    return (
        check_slo(
            "requests failed",
            share,
            OWN_SLO_MISS_ALLOWED_PERCENT,
            unit="%",
            target_label="p99 allows",
            share_word="failed",
        ),
    )


def _checks(summary: Mapping[str, Any], slo: SLOSpec | None, figures: tuple[tuple[str, str, str], ...]) -> tuple:
    if slo is None:
        return ()
    return tuple(
        check_slo(label, summary.get(key), getattr(slo, target))
        for key, label, target in figures
        if getattr(slo, target) is not None
    )


def slo_verdict(summary: Mapping[str, Any], profile: Profile) -> SloVerdict:
    """The verdict of a run summary (core.metrics.Summary.to_dict(), or a summary event) against the
    profile's SLOs; per task (each against its own SLO, else the profile's) when any task sets its own."""
    requests, completed = summary.get("requests"), summary.get("completed")
    counts = {
        "requests": requests if isinstance(requests, int) else None,
        "completed": completed if isinstance(completed, int) else None,
    }
    if profile.workload.trace is not None:
        return _per_request_verdict(summary, counts)
    tasks = profile.workload.tasks
    faults = _fault_checks(summary)
    if not any(task.slo is not None for task in tasks):
        checks = _checks(summary, profile.slo, SLO_FIGURES)
        return SloVerdict(checks + faults if checks else (), **counts)
    per_task_figures = summary.get("per_task") or {}
    per_task: dict[str, SloVerdict] = {}
    for task in tasks:
        stats = per_task_figures.get(task.name)
        if not isinstance(stats, Mapping):
            continue  # no request of this task in the window
        checks = _checks(stats, task.slo or profile.slo, SLO_FIGURES)
        if checks:
            per_task[task.name] = SloVerdict(checks, requests=stats.get("requests"), completed=stats.get("completed"))
    return SloVerdict(faults if per_task else (), per_task, **counts)
