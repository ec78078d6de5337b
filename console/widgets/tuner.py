"""The tuner tab: the SLO-Tuner's trajectory as it happens, baseline vs best so far, budget used and left.
Behind a gateway that tunes online (console/app_gateway.py) it shows that tuner's steps, marked as such."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Static

from console.session import Session, finite
from console.widgets.format import UNKNOWN, duration, knobs_text, num
from console.widgets.kpi import KpiTile, slo_colour
from console.widgets.plots import Line, Threshold, TimePlot

COLUMNS = (
    ("step", "step"),
    ("knobs", "knobs"),
    ("p50 s", "p50_s"),
    ("p95 s", "p95_s"),
    ("p99 s", "p99_s"),
    ("goodput req/s", "goodput_rps"),
    ("score", "score"),
    ("moved", "moved"),
    ("why", "why"),
)


TRAJECTORY_TITLE = "trajectory (one row per measured step; press t to start the tuner)"


def _point_text(point: dict[str, Any] | None) -> str:
    if point is None:
        return UNKNOWN
    return f"p99 {num(point.get('p99_s'), 3)} s · {num(point.get('goodput_rps'), 2)} req/s"


class TunerView(Vertical):
    """Tiles (baseline, best, budget, time left), the trajectory table, and score/p99 per step."""

    def compose(self) -> ComposeResult:
        with Horizontal(id="tuner-tiles"):
            yield KpiTile("state", id="tune-state")
            yield KpiTile("baseline", id="tune-baseline")
            yield KpiTile("best so far", id="tune-best")
            yield KpiTile("goodput gain", id="tune-gain")
            yield KpiTile("segments used", id="tune-segments")
            yield KpiTile("time left", id="tune-left")
        yield Static(id="tune-best-knobs")
        yield DataTable(id="trajectory", zebra_stripes=True, cursor_type="row")
        with Horizontal(id="tuner-plots"):
            with Vertical(classes="plot-box", id="box-tune-p99"):
                yield TimePlot(id="plot-tune-p99")
            with Vertical(classes="plot-box", id="box-tune-goodput"):
                yield TimePlot(id="plot-tune-goodput")

    def on_mount(self) -> None:
        table = self.query_one("#trajectory", DataTable)
        for label, key in COLUMNS:
            table.add_column(label, key=key)
        table.border_title = TRAJECTORY_TITLE
        self.query_one("#box-tune-p99").border_title = "p99 per step, s · red line: SLO"
        self.query_one("#box-tune-goodput").border_title = "goodput (green), req/s · score (blue) per step"
        self._rows = 0

    def refresh_from(self, session: Session) -> None:
        tune = session.tune
        slo = tune.slo_s if tune.slo_s is not None else session.slo_e2e_s
        table = self.query_one("#trajectory", DataTable)
        if len(tune.steps) < self._rows:  # a new tuning run started: begin a fresh table
            table.clear()
            self._rows = 0
        for step in tune.steps[self._rows :]:
            table.add_row(*self._cells(step, slo))
            self._rows += 1
        if tune.steps:
            table.move_cursor(row=self._rows - 1)

        state = "finished" if tune.finished else ("running" if tune.active else "not started")
        detail = session.backend_kind
        if tune.active and not tune.steps and tune.algorithm == "guided":
            detail = "sweeping the simulator first"  # core/tune/guided.py: no target segment before it ends
        if tune.source is not None:  # a gateway runs this tune; the console shows its steps
            state, detail = tune.source, self._online_detail(tune.online)
            table.border_title = f"{tune.source}: the gateway's steps as it tunes on its traffic; not this console's"
        else:
            table.border_title = TRAJECTORY_TITLE
        self.query_one("#tune-state", KpiTile).show(state, detail)
        baseline, best = tune.baseline, tune.best
        self.query_one("#tune-baseline", KpiTile).show(
            num(baseline.get("goodput_rps"), 2) if baseline else UNKNOWN,
            f"req/s · p99 {num(baseline.get('p99_s'), 2)} s" if baseline else "",
            slo_colour(finite(baseline.get("p99_s")), slo) if baseline else "neutral",
        )
        self.query_one("#tune-best", KpiTile).show(
            num(best.get("goodput_rps"), 2) if best else UNKNOWN,
            f"req/s · p99 {num(best.get('p99_s'), 2)} s" if best else "",
            slo_colour(finite(best.get("p99_s")), slo) if best else "neutral",
        )
        base_goodput = finite(baseline.get("goodput_rps")) if baseline else None
        best_goodput = finite(best.get("goodput_rps")) if best else None
        gain = best_goodput / base_goodput if base_goodput and best_goodput is not None else None
        self.query_one("#tune-gain", KpiTile).show(
            UNKNOWN if gain is None else f"×{gain:.2f}",
            "best / baseline",
            "neutral" if gain is None else ("good" if gain > 1.0 else "warn"),
        )
        budget = tune.budget_segments
        self.query_one("#tune-segments", KpiTile).show(
            f"{tune.segments_used}" + (f"/{budget}" if budget is not None else ""),
            "segments of budget" if budget is not None else "budget unknown",
        )
        self.query_one("#tune-left", KpiTile).show(duration(tune.time_left_s()), "wall time, estimated")
        self.query_one("#tune-best-knobs", Static).update(
            f"baseline knobs: {knobs_text(baseline.get('knobs')) if baseline else UNKNOWN}    "
            f"best knobs: {knobs_text(best.get('knobs')) if best else UNKNOWN}    "
            f"SLO: p99 ≤ {num(slo, 2)} s"
        )
        self._plots(session, slo)

    @staticmethod
    def _online_detail(online: dict[str, Any] | None) -> str:
        if not online:
            return "waiting for the gateway"
        swapping = " · swapping the server" if online.get("swapping") else ""
        return f"in force {knobs_text(online.get('knobs'))}{swapping}"

    @staticmethod
    def _cells(step: dict[str, Any], slo: float | None) -> list[Any]:
        p99 = finite(step.get("p99_s"))
        violating = p99 is not None and slo is not None and p99 > slo
        moved = step.get("moved")
        return [
            str(step.get("step", UNKNOWN)),
            knobs_text(step.get("knobs")),
            num(step.get("p50_s"), 3),
            num(step.get("p95_s"), 3),
            Text(num(p99, 3), style="bold red" if violating else "green"),
            num(step.get("goodput_rps"), 2),
            num(step.get("score"), 3),
            Text("✓ moved" if moved else "· stayed", style="bold green" if moved else "dim"),
            str(step.get("why") or ""),
        ]

    def _plots(self, session: Session, slo: float | None) -> None:
        steps = session.tune.steps
        xs = [float(step.get("step", i)) for i, step in enumerate(steps)]

        def column(name: str) -> tuple[list[float], list[float]]:
            pairs = [(x, finite(step.get(name))) for x, step in zip(xs, steps, strict=True)]
            kept = [(x, v) for x, v in pairs if v is not None]
            return [x for x, _ in kept], [v for _, v in kept]

        p99_x, p99_y = column("p99_s")
        self.query_one("#plot-tune-p99", TimePlot).draw(
            [Line(p99_x, p99_y, "p99", "yellow")],
            thresholds=[Threshold(slo)] if slo is not None else [],
            ylim=(0.0, max([*p99_y, slo or 0.0, 0.1]) * 1.15),
            xlabel="step",
        )
        g_x, g_y = column("goodput_rps")
        s_x, s_y = column("score")
        self.query_one("#plot-tune-goodput", TimePlot).draw(
            [Line(g_x, g_y, "goodput", "green"), Line(s_x, s_y, "score", "blue")],
            xlabel="step",
        )
