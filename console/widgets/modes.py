"""The Modes tab: which scheduling mode runs, switching it, and the compare table (one row per mode).

Enter (or a click) on a row switches to that mode: on the simulator the workload reruns in it; on a live
server the admission gateway in front of vLLM swaps its policy and vLLM keeps running. `c` runs the
compare job (every mode on identical seeded arrivals, on the simulator) and fills the table; a mode's row
also shows this console's last finished run in it until a compare replaces it.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.coordinate import Coordinate
from textual.message import Message
from textual.widgets import DataTable, Static

from console.session import Session
from console.widgets.format import UNKNOWN
from core.compare import BEST_STATIC, table_cells, table_header, table_tasks
from core.modes import MODE_GUIDE, MODES

BEST_STATIC_NOTE = "fcfs at the best static max_num_seqs (swept; not a mode to switch to)"


class ModeChosen(Message):
    """The operator picked a scheduling mode in the table."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode


class ModesView(Vertical):
    """Current mode on top; the comparison table below, one row per mode, with the batch table's columns
    (core/compare.py `table_header`); what each mode does is listed under the table."""

    def compose(self) -> ComposeResult:
        yield Static(id="mode-current")
        yield DataTable(id="modes-table", cursor_type="row", zebra_stripes=False)
        yield Static(id="modes-note")

    def on_mount(self) -> None:
        table = self.query_one("#modes-table", DataTable)
        table.border_title = "scheduling modes · Enter: switch · c: compare all"
        self._columns: list[str] = []
        self._rows: list[str] = []
        self._shown: dict[str, tuple[str, ...]] = {}

    def _row_names(self, session: Session) -> list[str]:
        names = list(MODES)
        names += [name for name in session.mode_rows if name not in names and name != BEST_STATIC]
        if BEST_STATIC in session.mode_rows:
            names.append(BEST_STATIC)
        return names

    def _cells(self, name: str, session: Session, tasks: list[str]) -> tuple[str, ...]:
        row = session.mode_rows.get(name, {})
        # The batch table's cells; the mode's cell also marks the mode in use (▶), a row that holds this
        # console's last run in that mode rather than the compare's (*), and a mode the workload cannot run.
        label = f"{'▶' if name == session.scheduling_mode else ' '} {name}"
        if "skipped" in row:
            label += " (skipped)"
        elif row.get("source") == "run":
            label += " *"
        return (label, *table_cells(name, row, tasks, unknown=UNKNOWN)[1:])

    def refresh_from(self, session: Session) -> None:
        self.query_one("#mode-current", Static).update(f"Scheduling mode in use: [b]{session.mode}[/b]")
        self._note(session)
        table = self.query_one("#modes-table", DataTable)
        # The batch table's columns (`--job compare`), with the tasks the rows report.
        tasks = table_tasks(list(session.mode_rows.values()))
        columns = table_header(tasks)
        names = self._row_names(session)
        if columns != self._columns:
            table.clear(columns=True)
            table.add_columns(*columns)
            self._columns, self._rows = columns, []
        if names != self._rows:
            table.clear()
            self._shown = {}
            for name in names:
                cells = self._cells(name, session, tasks)
                table.add_row(*cells, key=name)
                self._shown[name] = cells
            self._rows = names
            return
        for name in names:
            cells = self._cells(name, session, tasks)
            if self._shown.get(name) == cells:
                continue
            for index, value in enumerate(cells):
                # Widen the column when a figure arrives: a column sized for its placeholder would cut
                # 0.312 to "0." (update_cell keeps the width by default).
                table.update_cell_at(Coordinate(names.index(name), index), value, update_width=True)
            self._shown[name] = cells

    def _note(self, session: Session) -> None:
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
        lines = [f"{switch} {compare}", "▶ the mode in use · * this console's last run in that mode", ""]
        names = self._row_names(session)
        width = max(len(name) for name in names)
        for name in names:
            row = session.mode_rows.get(name, {})
            guide = MODE_GUIDE.get(name)  # type: ignore[call-overload]
            if "skipped" in row:
                lines.append(f"{name.ljust(width)}  skipped: {row['skipped']}")
            elif guide is None:
                lines.append(f"{name.ljust(width)}  {BEST_STATIC_NOTE if name == BEST_STATIC else ''}")
            else:
                # When to use it and when not, from the measurements (core/modes.py MODE_GUIDE, docs/modes.md).
                lines.append(f"{name.ljust(width)}  {guide.what}")
                lines.append(f"{''.ljust(width)}  [green]use[/]: {guide.use_when}")
                lines.append(f"{''.ljust(width)}  [red]not[/]: {guide.avoid_when}")
        self.query_one("#modes-note", Static).update("\n".join(lines))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        name = event.row_key.value
        if name is not None and name in MODES:
            self.post_message(ModeChosen(name))
