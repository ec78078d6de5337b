"""A compact KPI tile: label and unit on the border, the number large in the middle, a note below.

The tile's class says what the number means against the SLO: `-good` (green, within), `-bad` (red,
violating), `-warn` (amber, close), `-neutral` (no SLO applies or not known yet).
"""

from __future__ import annotations

from typing import Literal

from textual.widgets import Static

Verdict = Literal["good", "bad", "warn", "neutral"]
VERDICTS: tuple[Verdict, ...] = ("good", "bad", "warn", "neutral")


class KpiTile(Static):
    """One headline number. `show(value, note, verdict)` updates it in place."""

    def __init__(self, label: str, *, id: str | None = None) -> None:
        super().__init__("—", id=id, classes="kpi -neutral")
        self.border_title = label
        self.value_text = "—"
        self.verdict: Verdict = "neutral"

    def show(self, value: str, note: str = "", verdict: Verdict = "neutral") -> None:
        if value != self.value_text:
            self.value_text = value
            self.update(value)
        self.border_subtitle = note
        if verdict != self.verdict:
            for name in VERDICTS:
                self.set_class(name == verdict, f"-{name}")
            self.verdict = verdict


def slo_colour(value: float | None, limit: float | None, *, higher_is_better: bool = False) -> Verdict:
    """The tile's colour: green within the limit, red beyond it, amber within 10% of it (2% for a share that
    must stay above its target); neutral when either is unknown."""
    if value is None or limit is None:
        return "neutral"
    if higher_is_better:
        if value < limit:
            return "bad"
        return "warn" if value < limit * 1.02 else "good"
    if value > limit:
        return "bad"
    return "warn" if value > 0.9 * limit else "good"
