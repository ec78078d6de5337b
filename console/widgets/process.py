"""The process tab: what serves the requests (a managed vLLM or the embedded simulator), its state, its
command line and log tail, and a knob editor whose values the start/restart buttons use."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, Log, Static, Switch

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
    """The knob editor holds a value the engine would refuse; the message names the field and the fix."""


class KnobEditor(Vertical):
    """Inputs for the logical knobs. `knobs()` validates them with the profile schema."""

    INT_FIELDS = (
        ("concurrency", "concurrency (empty: unlimited)"),
        ("max_num_seqs", "max_num_seqs"),
        ("max_num_batched_tokens", "max_num_batched_tokens"),
        ("spec_width", "speculative width (tokens)"),
    )
    BOOL_FIELDS = (("spec_on", "speculation on"), ("chunked_prefill", "chunked prefill"))

    def __init__(self, knobs: KnobsSpec, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._initial = knobs

    def compose(self) -> ComposeResult:
        values = self._initial.model_dump()
        for name, label in self.INT_FIELDS:
            with Horizontal(classes="knob-row"):
                yield Label(label, classes="knob-label")
                value = values.get(name)
                yield Input("" if value is None else str(value), type="integer", id=f"knob-{name}", compact=True)
        for name, label in self.BOOL_FIELDS:
            with Horizontal(classes="knob-row"):
                yield Label(label, classes="knob-label")
                yield Switch(bool(values.get(name)), id=f"knob-{name}")

    def set_knobs(self, knobs: dict[str, Any]) -> None:
        for name, _ in self.INT_FIELDS:
            value = knobs.get(name)
            self.query_one(f"#knob-{name}", Input).value = "" if value is None else str(value)
        for name, _ in self.BOOL_FIELDS:
            self.query_one(f"#knob-{name}", Switch).value = bool(knobs.get(name))

    def knobs(self, base: KnobsSpec) -> KnobsSpec:
        """The edited knobs on top of `base` (fields the editor does not show keep their values)."""
        data = base.model_dump()
        for name, _ in self.INT_FIELDS:
            text = self.query_one(f"#knob-{name}", Input).value.strip()
            data[name] = int(text) if text else (None if name == "concurrency" else data[name])
        for name, _ in self.BOOL_FIELDS:
            data[name] = self.query_one(f"#knob-{name}", Switch).value
        try:
            return KnobsSpec.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            raise KnobsInvalid(f"knob {field}: {first['msg']}; fix the value in the process tab") from exc


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
        self.query_one("#process-knobs").border_title = "knobs (edit, then restart)"
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

    def show_log(self, lines: list[str]) -> None:
        log = self.query_one("#process-log", Log)
        log.clear()
        log.write_lines(lines)
        # The newest line matters most: keep the view on the end once the new lines are laid out.
        self.call_after_refresh(log.scroll_end, animate=False)
