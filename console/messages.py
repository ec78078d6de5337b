"""Messages between the workers that run jobs and the widgets that show them. Small, one per purpose.

`SessionChanged` is the high-rate one: every event of a run posts it, and a queued one is replaced by the
next (`can_replace`, as toolong does), so however fast the stream, the UI redraws once per turn of its
message loop and never falls behind.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message


class SessionChanged(Message):
    """The session model moved on; redraw whatever shows it. Coalesces: only the newest one matters."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SessionChanged)


@dataclass
class ServerStateChanged(Message):
    """The managed vLLM process changed state (posted from the process watcher's thread)."""

    state: str
    detail: str


@dataclass
class FactsheetWritten(Message):
    """The factsheet export finished; `paths` are the files written."""

    paths: list[str]
