"""The modes tab: the scheduling mode in use, and the place where SABER, AdaServe and SLOs-Serve will be
switched and compared once the scheduling-modes capability lands."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from console.session import Session
from console.widgets.format import UNKNOWN, num

PLANNED_MODES = (
    ("fcfs (vLLM default)", "first come, first served: vLLM's own scheduler", "in use"),
    ("SABER", "SLA-aware admission and stable ordering", "planned: scheduling-modes capability"),
    ("AdaServe", "per-request speculative decoding for fine-grained SLOs", "planned: scheduling-modes capability"),
    ("SLOs-Serve", "multi-stage SLO planning with admission control", "planned: scheduling-modes capability"),
)


class ModesView(Vertical):
    """Current mode on top; a comparison table whose rows fill in when the modes capability ships."""

    def compose(self) -> ComposeResult:
        yield Static(id="mode-current")
        yield DataTable(id="modes-table", cursor_type="none")
        yield Static(
            "Switching among SABER, AdaServe and SLOs-Serve, and comparing them on the same arrivals, comes "
            "with the scheduling-modes capability (filed later). This tab is where that comparison will appear: "
            "one row per mode with p99 s, goodput req/s and SLO attainment %, run on the same workload and seed.",
            id="modes-note",
        )

    def on_mount(self) -> None:
        table = self.query_one("#modes-table", DataTable)
        table.border_title = "scheduling modes"
        self._columns = table.add_columns("mode", "what it does", "status", "p99 s", "goodput req/s", "attainment %")
        for name, what, status in PLANNED_MODES:
            table.add_row(name, what, status, UNKNOWN, UNKNOWN, UNKNOWN, key=name)

    def refresh_from(self, session: Session) -> None:
        self.query_one("#mode-current", Static).update(f"Scheduling mode in use: [b]{session.mode}[/b]")
        # The mode in use gets the current run's numbers; the others wait for their capability.
        headline = session.headline()
        table = self.query_one("#modes-table", DataTable)
        row = PLANNED_MODES[0][0]
        _, _, _, p99_col, goodput_col, attain_col = self._columns
        table.update_cell(row, p99_col, num(headline["p99_s"], 3))
        table.update_cell(row, goodput_col, num(headline["goodput_rps"], 2))
        table.update_cell(row, attain_col, num(headline["slo_attainment"], 1, scale=100.0))
