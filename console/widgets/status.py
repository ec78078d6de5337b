"""The top line: profile, backend, scheduling mode, knobs and run state, always visible."""

from __future__ import annotations

from textual.widgets import Static

from console.session import Session
from console.widgets.format import knobs_text

RUN_STATE_STYLE = {
    "running": "green",
    "finished": "cyan",
    "stopped": "yellow",
    "failed": "red",
    "idle": "dim",
}


class StatusBar(Static):
    def refresh_from(self, session: Session) -> None:
        backend = {"sim": "embedded simulator", "vllm": "vLLM (managed)", "url": "live server"}.get(
            session.backend_kind, session.backend_kind
        )
        pace = ""
        if session.is_simulator:
            pace = " · unpaced" if session.speed is None else f" · {session.speed:g}× speed"
        if session.gateway is not None:
            backend += " behind a gateway"
        style = RUN_STATE_STYLE.get(session.run_state, "white")
        self.update(
            f"[b]{session.profile_name}[/b] · {backend}{pace} · mode [b]{session.mode}[/b] · "
            f"{knobs_text(session.knobs)} · [{style}]● {session.run_state}[/{style}] · t {session.t_s:.1f} s"
        )
