"""The process tab: what serves the requests (a managed vLLM or the embedded simulator), its state, its
command line and log tail, and a knob editor whose values the start/restart buttons use.

The editor holds no input field: on the main screen the number keys and Esc always navigate (console/app.py),
so a value is typed only in the knob's own dialog, opened with Enter or `e`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import ValidationError
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Log, Static

from core.profile import KnobsSpec

STATE_CLASSES = ("-ready", "-starting", "-crashed", "-stopped")
# Server states (core.serve.process.ServerState) and simulated-run states, mapped to a colour class.
STATE_COLOUR = {
    "ready": "-ready",
    "running": "-ready",
    "finished": "-ready",
    "starting": "-starting",
    "idle": "-stopped",
    "stopped": "-stopped",
    "crashed": "-crashed",
    "failed": "-crashed",
}


class KnobsInvalid(ValueError):
    """The knob editor holds a value the engine would refuse; the message names the knob and what is wrong."""


@dataclass(frozen=True, slots=True)
class KnobField:
    name: str  # the KnobsSpec field
    label: str
    kind: Literal["int", "bool"]
    empty: str | None = None  # what an empty value means, where one is allowed (None: a value is needed)


KNOB_FIELDS = (
    KnobField("concurrency", "concurrency", "int", empty="unlimited"),
    KnobField("max_num_seqs", "max_num_seqs", "int"),
    KnobField("max_num_batched_tokens", "max_num_batched_tokens", "int"),
    KnobField("spec_width", "speculative width (tokens)", "int"),
    KnobField("spec_on", "speculation", "bool"),
    KnobField("chunked_prefill", "chunked prefill", "bool"),
)


def _value_text(field: KnobField, value: Any) -> str:
    if field.kind == "bool":
        return "on" if value else "off"
    return (field.empty or "") if value is None else str(value)


class KnobEditor(DataTable[str]):
    """The knobs the next start or restart uses, one row each, never an input field: keys that navigate
    (the tab numbers, Esc) can never land in a value. Enter or `e` on a number knob opens a small dialog
    (`KnobDialog`) that takes the digits; Enter or space flips an on/off knob. An edit that is not applied
    yet reads `12 → 4`."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("e", "edit", "Edit knob"),
        Binding("space", "edit", "Edit knob", show=False),
    ]

    def __init__(self, knobs: KnobsSpec, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self._current = knobs.model_dump()  # what runs now
        self._pending = dict(self._current)  # what the next start or restart uses

    def on_mount(self) -> None:
        self.add_column("knob", key="knob")
        self.add_column("value", key="value", width=18)
        for field in KNOB_FIELDS:
            self.add_row(field.label, self._cell(field), key=field.name)

    def _cell(self, field: KnobField) -> str:
        now, next_ = self._current.get(field.name), self._pending.get(field.name)
        text = _value_text(field, next_)
        return text if now == next_ else f"{_value_text(field, now)} → {text}"

    def _show(self, field: KnobField) -> None:
        self.update_cell(field.name, "value", self._cell(field))

    @property
    def pending(self) -> dict[str, Any]:
        """The edited values, by knob name (all of them, edited or not)."""
        return {field.name: self._pending.get(field.name) for field in KNOB_FIELDS}

    def set_current(self, knobs: dict[str, Any]) -> None:
        """The knobs that now run; an edit not applied yet stays pending."""
        edits = {name: value for name, value in self._pending.items() if value != self._current.get(name)}
        self._current = dict(knobs)
        self._pending = {**self._current, **edits}
        for field in KNOB_FIELDS:
            self._show(field)

    def set_value(self, name: str, value: Any) -> None:
        field = next(f for f in KNOB_FIELDS if f.name == name)
        self._pending[name] = value
        self._show(field)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.action_edit()

    def action_edit(self) -> None:
        field = KNOB_FIELDS[self.cursor_row]
        if field.kind == "bool":
            self.set_value(field.name, not self._pending.get(field.name))
            return
        value = self._pending.get(field.name)
        text = "" if value is None else str(value)

        def done(result: str | None) -> None:
            if result is not None:
                self.set_value(field.name, parse_knob(field, result))

        self.app.push_screen(KnobDialog(field, text, lambda entered: self.problem(field, entered)), done)

    def problem(self, field: KnobField, text: str) -> str | None:
        """Why `text` cannot be `field`'s value (with the other edits as they are), or None when it can."""
        try:
            self._validated({**self._pending, field.name: parse_knob(field, text)}, self._current)
        except ValueError as exc:  # KnobsInvalid, or a value that is no number
            return str(exc)
        return None

    def knobs(self, base: KnobsSpec) -> KnobsSpec:
        """The edited knobs on top of `base` (fields the editor does not show keep their values)."""
        return self._validated(self._pending, base.model_dump())

    @staticmethod
    def _validated(values: dict[str, Any], base: dict[str, Any]) -> KnobsSpec:
        data = dict(base)
        data.update({field.name: values.get(field.name) for field in KNOB_FIELDS})
        try:
            return KnobsSpec.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = ".".join(str(p) for p in first["loc"])
            raise KnobsInvalid(f"knob {name}: {first['msg']}") from exc


def parse_knob(field: KnobField, text: str) -> int | None:
    """A number knob's value from what was typed: an int, or None for empty where empty means something."""
    text = text.strip()
    if not text:
        if field.empty is None:
            raise ValueError(f"{field.label} needs a value")
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{field.label}: {text!r} is not a whole number") from None


class KnobDialog(ModalScreen[str | None]):
    """One number knob's value: digits go here (and only here); Enter keeps it, Esc leaves it as it was."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, field: KnobField, value: str, problem: Callable[[str], str | None]) -> None:
        super().__init__()
        self.field = field
        self.value = value
        self.problem = problem

    def compose(self) -> ComposeResult:
        with Vertical(id="knob-dialog"):
            yield Input(self.value, type="integer", id="knob-value")
            empty = f" · empty: {self.field.empty}" if self.field.empty else ""
            yield Static(f"Enter: keep · Esc: cancel{empty}", id="knob-hint")
            yield Static(id="knob-problem")

    def on_mount(self) -> None:
        self.query_one("#knob-dialog").border_title = self.field.label

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        problem = self.problem(event.value)
        if problem is not None:
            self.query_one("#knob-problem", Static).update(problem)
            return
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ProcessView(Vertical):
    """State, command line and log tail of the serving process, with start/stop/restart."""

    def __init__(self, backend_kind: str, knobs: KnobsSpec, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.backend_kind = backend_kind
        self._knobs = knobs

    def compose(self) -> ComposeResult:
        simulated = self.backend_kind == "sim"
        with Horizontal(id="process-top"):
            with Vertical(id="process-facts"):
                yield Static(id="process-state", classes="-stopped")
                yield Static(id="process-command")
            with Vertical(id="process-knobs"):
                yield KnobEditor(self._knobs, id="knob-editor")
                with Horizontal(id="process-buttons"):
                    if simulated:
                        yield Button("Restart run with these knobs", id="restart", variant="primary", compact=True)
                        yield Button("Stop run", id="stop", variant="error", compact=True)
                    else:
                        yield Button("Start", id="start", variant="success", compact=True)
                        yield Button("Restart with these knobs", id="restart", variant="primary", compact=True)
                        yield Button("Stop", id="stop", variant="error", compact=True)
        yield Log(id="process-log", max_lines=200)

    def on_mount(self) -> None:
        self.query_one("#process-facts").border_title = (
            "embedded simulator" if self.backend_kind == "sim" else "vLLM process"
        )
        self.query_one("#process-knobs").border_title = "knobs · Enter: edit · then restart"
        self.query_one("#process-log").border_title = (
            "event feed (the JSON Lines --batch prints)" if self.backend_kind == "sim" else "vLLM log tail"
        )

    def show_state(self, state: str, detail: str = "") -> None:
        widget = self.query_one("#process-state", Static)
        widget.update(f"● {state}" + (f" — {detail}" if detail else ""))
        for name in STATE_CLASSES:
            widget.remove_class(name)
        widget.add_class(STATE_COLOUR.get(state, "-stopped"))

    def show_command(self, text: str) -> None:
        self.query_one("#process-command", Static).update(text)

    def show_knobs(self, knobs: dict[str, Any]) -> None:
        """The knobs that now run (an edit not applied yet stays pending in the editor)."""
        self.query_one(KnobEditor).set_current(knobs)

    def show_log(self, lines: list[str]) -> None:
        log = self.query_one("#process-log", Log)
        log.clear()
        log.write_lines(lines)
        # The newest line matters most: keep the view on the end once the new lines are laid out.
        self.call_after_refresh(log.scroll_end, animate=False)
