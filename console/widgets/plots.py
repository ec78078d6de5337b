"""Time plots on textual-plotext: each widget owns its own plotext figure (no shared global state)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from textual_plotext import PlotextPlot


@dataclass(frozen=True)
class Line:
    """One series: x and y values, a legend label, a plotext colour, and which y axis it uses."""

    x: Sequence[float]
    y: Sequence[float]
    label: str
    color: str
    yside: str = "left"


@dataclass(frozen=True)
class Threshold:
    """A horizontal line: the SLO, or a target."""

    y: float
    color: str = "red"


class TimePlot(PlotextPlot):
    """A line plot that redraws only when its data changed (plotext's build is the costly part)."""

    DEFAULT_CSS = """
    TimePlot { height: 1fr; width: 1fr; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._key: object = None

    def draw(
        self,
        lines: Sequence[Line],
        *,
        thresholds: Sequence[Threshold] = (),
        ylim: tuple[float, float] | None = None,
        ylim_right: tuple[float, float] | None = None,
        xlabel: str = "",
    ) -> None:
        key = (
            tuple((len(line.x), line.x[-1] if line.x else None, line.y[-1] if line.y else None) for line in lines),
            tuple(thresholds),
            ylim,
            ylim_right,
            xlabel,
            tuple(line.color for line in lines),
        )
        if key == self._key:
            return
        self._key = key
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.xlabel(xlabel)
        drawn_x: list[float] = []
        for line in lines:
            if line.x:
                plt.plot(list(line.x), list(line.y), label=line.label, color=line.color, yside=line.yside)
                drawn_x.extend((line.x[0], line.x[-1]))
        for threshold in thresholds:
            plt.hline(threshold.y, threshold.color)
        if drawn_x:
            plt.xlim(min(drawn_x), max(max(drawn_x), min(drawn_x) + 1.0))
        if ylim is not None:
            plt.ylim(*ylim)
        if ylim_right is not None:
            plt.ylim(*ylim_right, yside="right")
        self.refresh()
