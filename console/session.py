"""The console's state: the event stream folded into plain Python that widgets read when they redraw.

Events arrive far faster than a terminal can redraw (a paced simulator at speed 100 emits hundreds a second).
Folding each one into this model is cheap; widgets then read the model at most a few times a second. The
model never imports Textual, so its arithmetic is tested without an app, and one fold serves every screen.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from core.events import Event, to_json_line

HISTORY_POINTS = 1500  # points kept per time series (a long run scrolls; plots stay cheap)
RECENT_EVENTS = 60  # event lines kept for the process tab's feed (the batch runner's JSON Lines)

SEGMENTS_PER_TUNE_STEP = 8  # the hill-climb's accounting: the current point and up to 7 neighbours
# What the operator reads as the scheduling mode (core/modes.py). fcfs is vLLM's own scheduler.
MODE_LABELS = {"fcfs": "fcfs (vLLM default)", "priority": "priority (vLLM)"}
# The figures the Modes tab compares, per mode (the fields of a `compare_row` event, or a run's summary).
MODE_ROW_FIELDS = (
    "max_num_seqs",
    "speculation",
    "slo_attainment",
    "slo_attainment_per_task",
    "goodput_rps",
    "token_goodput_tps",
    "smooth_goodput",
    "p99_s",
    "cv_completion_over_slo",
    "rejected",
    "deferred",
)


def mode_label(policy: str | None) -> str:
    return MODE_LABELS.get(policy or "fcfs", policy or "fcfs")


def finite(value: Any) -> float | None:
    """A float for plotting/printing, or None when unknown (None, NaN, inf, non-numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


class Series:
    """A bounded (time, value) series; unknown values are skipped so plots never draw a fake zero."""

    def __init__(self, maxlen: int = HISTORY_POINTS) -> None:
        self.t: deque[float] = deque(maxlen=maxlen)
        self.v: deque[float] = deque(maxlen=maxlen)

    def add(self, t_s: float, value: Any) -> None:
        number = finite(value)
        if number is not None:
            self.t.append(t_s)
            self.v.append(number)

    def __len__(self) -> int:
        return len(self.v)

    @property
    def last(self) -> float | None:
        return self.v[-1] if self.v else None

    def clear(self) -> None:
        self.t.clear()
        self.v.clear()


@dataclass
class TuneState:
    """The tuner's trajectory as it arrives: "start" (job=tune), "tune_segment", "tune_step", "tune_summary"
    (core/tune/job.py). A missing field reads as unknown, never as zero."""

    active: bool = False
    finished: bool = False
    steps: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    budget_segments: int | None = None
    segments_used: int = 0
    started_wall_s: float | None = None
    last_wall_s: float | None = None
    slo_s: float | None = None
    algorithm: str | None = None
    # Who runs the tune: None, this console; "online (gateway)", a gateway tuning online on its traffic,
    # whose steps the console only shows (console/app_gateway.py), with its latest state in `online`.
    source: str | None = None
    online: dict[str, Any] | None = None

    def reset(self) -> None:
        self.__init__()  # type: ignore[misc]

    @property
    def baseline(self) -> dict[str, Any] | None:
        if self.summary and isinstance(self.summary.get("baseline"), dict) and self.summary["baseline"].get("knobs"):
            return self.summary["baseline"]
        return self.steps[0] if self.steps else None

    @property
    def best(self) -> dict[str, Any] | None:
        if self.summary and isinstance(self.summary.get("tuned"), dict) and self.summary["tuned"].get("knobs"):
            return self.summary["tuned"]
        scored = [s for s in self.steps if finite(s.get("score")) is not None]
        return max(scored, key=lambda s: s["score"]) if scored else None

    def time_left_s(self) -> float | None:
        """Wall seconds left, estimated: the mean segment time so far times the segments left in the budget.

        An upper bound for the hill-climb, which may stop early when no neighbour gains."""
        if self.finished or self.started_wall_s is None or self.last_wall_s is None:
            return 0.0 if self.finished else None
        elapsed = self.last_wall_s - self.started_wall_s
        if self.budget_segments is None or self.segments_used == 0:
            return None
        per_segment = elapsed / self.segments_used
        return max(0, self.budget_segments - self.segments_used) * per_segment


# Sliding-window metrics plotted over time (from progress events) and engine gauges (from engine events).
WINDOW_SERIES = (
    "p50_s",
    "p95_s",
    "p99_s",
    "ttft_p99_s",
    "tpot_p99_s",
    "goodput_rps",
    "throughput_rps",
    "smooth_goodput",
    "slo_attainment",
)
ENGINE_SERIES = ("running", "waiting", "kv_usage", "power_w")


@dataclass
class Session:
    """Everything the panels show, folded from the event stream of the current run and tuner."""

    profile_name: str
    backend_kind: str
    slo_e2e_s: float | None
    slo_ttft_s: float | None
    slo_tpot_s: float | None
    knobs: dict[str, Any]
    speed: float | None
    run_state: str = "idle"  # idle, running, finished, stopped, failed
    seed: int | None = None
    max_requests: int | None = None
    backend_facts: dict[str, Any] = field(default_factory=dict)
    finished: int = 0
    failed: int = 0
    t_s: float = 0.0
    window: dict[str, Any] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    energy_j: float = 0.0
    energy_basis: str | None = None  # "modelled" on the simulator, "measured" where a meter reports power
    _last_power: tuple[float, float] | None = None
    version: int = 0  # bumped on every fold, so a redraw can skip when nothing changed
    tune: TuneState = field(default_factory=TuneState)
    series: dict[str, Series] = field(default_factory=dict)
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=RECENT_EVENTS))
    scheduling_mode: str = "fcfs"  # the controller's mode (core/modes.py) the next run uses
    # The Modes tab's table: mode -> figures, with "source" saying where they came from ("compare": the
    # compare job on identical seeded arrivals; "run": this console's last finished run in that mode).
    mode_rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    compare_state: str = "idle"  # idle, running, finished, failed
    # How the last run drafted tokens (core/compare.speculation_of), for its row in the Modes tab: the
    # summary event does not say, and AdaServe drafts where the knobs turn speculation off.
    speculation: str | None = None
    gateway: str | None = None  # what fronts the server at --url, when it is an admission gateway

    SERIES = (*WINDOW_SERIES, *ENGINE_SERIES)

    def __post_init__(self) -> None:
        self.series = {name: Series() for name in self.SERIES}

    @property
    def mode(self) -> str:
        label = mode_label(self.scheduling_mode)
        if self.knobs.get("scheduling_policy") == "priority":
            label += " · vLLM priority scheduling"
        return label

    def reset_run(self) -> None:
        """Forget the previous run's numbers (a restart with new knobs starts a fresh picture)."""
        self.run_state = "idle"
        self.finished = self.failed = 0
        self.t_s = 0.0
        self.window = {}
        self.engine = {}
        self.summary = None
        self.energy_j = 0.0
        self.energy_basis = None
        self._last_power = None
        for series in self.series.values():
            series.clear()
        self.version += 1

    # ------------------------------------------------------------ folding

    def apply(self, event: Event, wall_s: float | None = None) -> None:
        """Fold one event. `wall_s` (a monotonic clock) lets the tuner view estimate the time left."""
        name = event.get("event")
        self.recent.append(to_json_line(event))
        handler = getattr(self, f"_on_{name}", None)
        if handler is not None:
            handler(event, wall_s)
            self.version += 1

    def _on_start(self, event: Event, wall_s: float | None) -> None:
        if event.get("job") == "compare":
            self.compare_state = "running"
            return
        if event.get("job") == "tune":
            self._on_tune_start(event, wall_s)
            return
        self.run_state = "running"
        if event.get("scheduling_mode"):
            self.scheduling_mode = str(event["scheduling_mode"])  # the mode the backend reports it runs
        self.seed = event.get("seed")
        self.max_requests = event.get("max_requests")
        if isinstance(event.get("backend"), dict):
            self.backend_facts = dict(event["backend"])
        if isinstance(event.get("knobs"), dict):
            self.knobs = dict(event["knobs"])

    def _on_progress(self, event: Event, wall_s: float | None) -> None:
        t_s = float(event.get("t_s") or 0.0)
        self.t_s = max(self.t_s, t_s)
        self.finished = int(event.get("finished") or 0)
        self.failed = int(event.get("failed") or 0)
        window = event.get("window") or {}
        self.window = dict(window)
        for name in WINDOW_SERIES:
            self.series[name].add(t_s, window.get(name))

    def _on_engine(self, event: Event, wall_s: float | None) -> None:
        t_s = float(event.get("t_s") or 0.0)
        self.t_s = max(self.t_s, t_s)
        self.engine = dict(event)
        for name in ("running", "waiting", "kv_usage", "power_w"):
            self.series[name].add(t_s, event.get(name))
        power = finite(event.get("power_w"))
        if power is not None:
            # Each sample's power holds until the next one: the same rule the modelled-energy meter uses.
            if self._last_power is not None:
                last_t, last_w = self._last_power
                self.energy_j += last_w * max(0.0, t_s - last_t)
            self._last_power = (t_s, power)
            self.energy_basis = "modelled" if self.is_simulator else "measured"

    def _on_summary(self, event: Event, wall_s: float | None) -> None:
        if event.get("job") == "compare":
            for name, fields in (event.get("modes") or {}).items():
                self._set_mode_row(name, fields, "compare")
            self.compare_state = "stopped" if event.get("interrupted") else "finished"
            return
        self.summary = dict(event)
        self.run_state = "stopped" if event.get("interrupted") else "finished"
        if not event.get("interrupted"):
            counts = event.get("failed_by_status") or {}
            fields = {**event, "rejected": counts.get("rejected", 0), "deferred": counts.get("deferred", 0)}
            fields["max_num_seqs"] = self.knobs.get("max_num_seqs")
            fields["speculation"] = self.speculation
            fields["slo_attainment_per_task"] = {
                task: (figures or {}).get("slo_attainment") for task, figures in (event.get("per_task") or {}).items()
            }
            # The row of the mode that actually ran (the summary says which), not of a later switch.
            self._set_mode_row(str(event.get("scheduling_mode") or self.scheduling_mode), fields, "run")

    def _on_compare_row(self, event: Event, wall_s: float | None) -> None:
        if "skipped" in event:
            self.mode_rows[str(event.get("mode"))] = {"source": "compare", "skipped": event["skipped"]}
        else:
            self._set_mode_row(str(event.get("mode")), event, "compare")

    def _set_mode_row(self, mode: str, fields: dict[str, Any], source: str) -> None:
        row = {name: fields.get(name) for name in MODE_ROW_FIELDS}
        row["source"] = source
        self.mode_rows[mode] = row

    def _on_tune_start(self, event: Event, wall_s: float | None) -> None:
        self.tune.reset()
        self.tune.active = True
        self.tune.started_wall_s = self.tune.last_wall_s = wall_s
        self.tune.algorithm = event.get("algorithm")
        budget = event.get("segment_budget")
        steps = event.get("steps")
        if isinstance(budget, int):
            self.tune.budget_segments = budget
        elif isinstance(steps, int):
            # The hill-climb's budget is its steps: each measures the current point and up to 7
            # neighbours, and the best is measured once more at the end (core/tune/job.py).
            self.tune.budget_segments = steps * SEGMENTS_PER_TUNE_STEP + 1
        slo = finite(event.get("slo_p99_s"))
        if slo is not None:
            self.tune.slo_s = slo

    def _on_tune_segment(self, event: Event, wall_s: float | None) -> None:
        used = event.get("segments_used")
        if isinstance(used, int):
            self.tune.segments_used = used
        self.tune.last_wall_s = wall_s

    def _on_tune_step(self, event: Event, wall_s: float | None) -> None:
        tune = self.tune
        if not tune.active and not tune.finished:
            tune.active = True
            tune.started_wall_s = wall_s
        step = dict(event)
        step.setdefault("why", step.get("reason"))
        tune.steps.append(step)
        tune.last_wall_s = wall_s

    def _on_tune_summary(self, event: Event, wall_s: float | None) -> None:
        tune = self.tune
        tune.summary = dict(event)
        tune.finished = True
        tune.active = False
        tune.last_wall_s = wall_s
        used = event.get("segments_used")
        if isinstance(used, int):
            tune.segments_used = used
        slo = finite(event.get("slo_p99_s"))
        if slo is not None:
            tune.slo_s = slo

    # ------------------------------------------------------------ reading

    @property
    def is_simulator(self) -> bool:
        return self.backend_kind == "sim"

    def headline(self) -> dict[str, Any]:
        """The numbers the KPI tiles show: the whole run's summary once it ended, the live window before.

        Once a run ends the tiles show exactly the batch runner's summary for the same profile and seed.
        """
        source = self.summary if self.summary is not None else self.window
        return {
            "scope": "run summary" if self.summary is not None else "last 10 s window",
            "p99_s": finite(source.get("p99_s")),
            "p50_s": finite(source.get("p50_s")),
            "goodput_rps": finite(source.get("goodput_rps")),
            "throughput_rps": finite(source.get("throughput_rps")),
            "smooth_goodput": finite(source.get("smooth_goodput")),
            "slo_attainment": finite(source.get("slo_attainment")),
            "ttft_p99_s": finite(source.get("ttft_p99_s")),
            "tpot_p99_s": finite(source.get("tpot_p99_s")),
            "requests": source.get("requests"),
            "failed": source.get("failed"),
        }

    @property
    def energy_wh(self) -> float | None:
        return self.energy_j / 3600.0 if self.energy_basis is not None else None
