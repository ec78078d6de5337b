"""The Modes tab: which scheduling mode runs, switching it, and the compare table (one row per mode).

Enter (or a click) on a row switches to that mode: on the simulator the workload reruns in it; on a live
server the admission gateway in front of vLLM swaps its policy and vLLM keeps running. `c` runs the
compare job (every mode on identical seeded arrivals, on the simulator) and fills the table; a mode's row
also shows this console's last finished run in it until a compare replaces it.
"""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, Static

from console.session import Session
from console.widgets.format import UNKNOWN, num
from core.modes import MODES

# What each mode does, in a line (the registry holds only factories).
MODE_NOTES = {
    "fcfs": "vLLM's own first come, first served",
    "saber": "SLA-aware admission, two-tier queue (paper 001)",
    "adaserve": "SLO-customized speculative decoding (paper 002)",
    "slos-serve": "multi-SLO admission and batch planning (paper 004)",
    "fcfs-best-static": "fcfs at the best static max_num_seqs (swept)",
}
BEST_STATIC = "fcfs-best-static"  # the compare job's baseline row (not a mode one can switch to)


class ModeChosen(Message):
    """The operator picked a scheduling mode in the table."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode


class ModesView(Vertical):
    """Current mode on top; the comparison table below, one row per mode."""

    def compose(self) -> ComposeResult:
        yield Static(id="mode-current")
        yield DataTable(id="modes-table", cursor_type="row", zebra_stripes=False)
        yield Static(id="modes-note")

    def on_mount(self) -> None:
        table = self.query_one("#modes-table", DataTable)
        table.border_title = "scheduling modes · Enter: switch · c: compare all"
        self._columns = table.add_columns(
            "mode", "what it does", "status", "attainment %", "goodput req/s", "p99 s", "CV", "rejected", "deferred"
        )
        self._rows: list[str] = []
        self._shown: dict[str, tuple[Any, ...]] = {}

    def _row_names(self, session: Session) -> list[str]:
        names = list(MODES)
        names += [name for name in session.mode_rows if name not in names and name != BEST_STATIC]
        if BEST_STATIC in session.mode_rows:
            names.append(BEST_STATIC)
        return names

    def _cells(self, name: str, session: Session) -> tuple[Any, ...]:
        row = session.mode_rows.get(name, {})
        if name == session.scheduling_mode:
            status = "in use"
        elif name == BEST_STATIC:
            status = f"baseline (max_num_seqs {row.get('max_num_seqs', '?')})"
        else:
            status = "available"
        if "skipped" in row:
            status = "cannot run this workload"
        elif row.get("source") == "run":
            status += " · last run"
        elif row.get("source") == "compare":
            status += " · compare"
        return (
            name,
            MODE_NOTES.get(name, ""),
            status,
            num(row.get("slo_attainment"), 1, scale=100.0),
            num(row.get("goodput_rps"), 2),
            num(row.get("p99_s"), 3),
            num(row.get("cv_completion_over_slo"), 3),
            UNKNOWN if row.get("rejected") is None else str(row["rejected"]),
            UNKNOWN if row.get("deferred") is None else str(row["deferred"]),
        )

    def refresh_from(self, session: Session) -> None:
        self.query_one("#mode-current", Static).update(f"Scheduling mode in use: [b]{session.mode}[/b]")
        live = not session.is_simulator
        switch = (
            "Enter on a row switches the mode: the admission gateway in front of the server swaps its policy, "
            "the server keeps running."
            if live
            else "Enter on a row switches the mode and reruns the workload in it."
        )
        compare = {
            "running": "The compare job is running (every mode on the same seeded arrivals, simulator)...",
            "finished": "Compare: every mode on the same seeded arrivals (simulator).",
            "stopped": "Compare stopped early: rows show the modes finished before the stop.",
            "failed": "The compare job failed; see the notification.",
        }.get(session.compare_state, "Press c to compare every mode on the same seeded arrivals (simulator).")
        self.query_one("#modes-note", Static).update(f"{switch} {compare}")
        table = self.query_one("#modes-table", DataTable)
        names = self._row_names(session)
        if names != self._rows:
            table.clear()
            self._shown = {}
            for name in names:
                cells = self._cells(name, session)
                table.add_row(*cells, key=name)
                self._shown[name] = cells
            self._rows = names
            return
        for name in names:
            cells = self._cells(name, session)
            if self._shown.get(name) == cells:
                continue
            for column, value in zip(self._columns, cells, strict=True):
                table.update_cell(name, column, value)
            self._shown[name] = cells

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        name = event.row_key.value
        if name is not None and name in MODES:
            self.post_message(ModeChosen(name))
