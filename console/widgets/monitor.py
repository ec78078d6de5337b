"""The monitor tab: KPI tiles for the headline numbers, live plots over (virtual) time, run facts."""

from __future__ import annotations

from collections.abc import Iterable

from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical
from textual.widgets import Static

from console.session import Session, finite
from console.widgets.format import UNKNOWN, num, pct, slo_verdict_text
from console.widgets.kpi import KpiTile, slo_colour
from console.widgets.plots import Line, Threshold, TimePlot

# Attainment below this share reads red; the SLOs-Serve capacity definition uses the same 90%.
ATTAINMENT_TARGET = 0.9


def _upper(values: Iterable[float], *floor: float | None, headroom: float = 1.15) -> float:
    """A y-axis top that shows every value and the SLO line with a little room above."""
    top = max([*values, *(f for f in floor if f is not None)], default=1.0)
    return (top or 1.0) * headroom


class MonitorView(Vertical):
    """Tiles on top, six plots in a grid, and a side panel with what is being run."""

    def compose(self) -> ComposeResult:
        with Horizontal(id="tiles"):
            yield KpiTile("p99 e2e s", id="kpi-p99")
            yield KpiTile("goodput req/s", id="kpi-goodput")
            yield KpiTile("smooth tok/s", id="kpi-smooth")
            yield KpiTile("SLO attainment", id="kpi-attain")
            yield KpiTile("TTFT p99 s", id="kpi-ttft")
            yield KpiTile("TPOT p99 ms", id="kpi-tpot")
            yield KpiTile("run / wait req", id="kpi-queue")
            yield KpiTile("power W", id="kpi-power")
        with Horizontal(id="monitor-body"):
            with Grid(id="plots"):
                with Vertical(classes="plot-box", id="box-p99"):
                    yield TimePlot(id="plot-p99")
                with Vertical(classes="plot-box", id="box-goodput"):
                    yield TimePlot(id="plot-goodput")
                with Vertical(classes="plot-box", id="box-smooth"):
                    yield TimePlot(id="plot-smooth")
                with Vertical(classes="plot-box", id="box-attain"):
                    yield TimePlot(id="plot-attain")
                with Vertical(classes="plot-box", id="box-ttft"):
                    yield TimePlot(id="plot-ttft")
                with Vertical(classes="plot-box", id="box-engine"):
                    yield TimePlot(id="plot-engine")
            yield Static(id="run-facts")

    def on_mount(self) -> None:
        titles = {
            "box-p99": "p99 e2e latency, s (10 s window) · red line: SLO",
            "box-goodput": "goodput (green) and throughput (blue), req/s",
            "box-smooth": "smooth goodput, benefit tok/s",
            "box-attain": "SLO attainment, % · red line: 90% target",
            "box-ttft": "TTFT p99, s (left) · TPOT p99, ms (right)",
            "box-engine": "running (green), waiting (amber), req · KV use, % (right)",
        }
        for box_id, title in titles.items():
            self.query_one(f"#{box_id}").border_title = title
        self.query_one("#run-facts").border_title = "run"

    # ------------------------------------------------------------ redraw

    def refresh_from(self, session: Session) -> None:
        self._tiles(session)
        self._plots(session)
        self._facts(session)

    def _tiles(self, s: Session) -> None:
        h = s.headline()
        p99 = h["p99_s"]
        # Once a run ended the tile says whether its p99 met the SLO and by how much (core/metrics/verdict).
        verdict = slo_verdict_text(p99, s.slo_e2e_s) if s.summary is not None else None
        value, note = num(p99, 3), f"SLO {num(s.slo_e2e_s, 2)} s"
        if verdict is not None:
            word, amount = verdict
            value = f"{value} · {word}" if p99 is not None else word
            note = f"{amount} SLO" if amount else note
        self.query_one("#kpi-p99", KpiTile).show(value, note, slo_colour(p99, s.slo_e2e_s))
        goodput = h["goodput_rps"]
        throughput = h["throughput_rps"]
        share = None if goodput is None or not throughput else goodput / throughput
        self.query_one("#kpi-goodput", KpiTile).show(
            num(goodput, 2),
            f"of {num(throughput, 1)} done",
            "neutral" if share is None else slo_colour(share, ATTAINMENT_TARGET, higher_is_better=True),
        )
        self.query_one("#kpi-smooth", KpiTile).show(num(h["smooth_goodput"], 0), "whole run" if s.summary else "10 s")
        attainment = h["slo_attainment"]
        self.query_one("#kpi-attain", KpiTile).show(
            pct(attainment),
            f"target {ATTAINMENT_TARGET:.0%}",
            slo_colour(attainment, ATTAINMENT_TARGET, higher_is_better=True),
        )
        ttft = h["ttft_p99_s"]
        self.query_one("#kpi-ttft", KpiTile).show(
            num(ttft, 3),
            f"SLO {num(s.slo_ttft_s, 2)} s" if s.slo_ttft_s is not None else "no TTFT SLO",
            slo_colour(ttft, s.slo_ttft_s),
        )
        tpot = h["tpot_p99_s"]
        self.query_one("#kpi-tpot", KpiTile).show(
            num(tpot, 1, scale=1000.0),
            f"SLO {num(s.slo_tpot_s, 3, 1000.0)} ms" if s.slo_tpot_s is not None else "no TPOT SLO",
            slo_colour(tpot, s.slo_tpot_s),
        )
        engine = s.engine
        running, waiting = engine.get("running"), engine.get("waiting")
        self.query_one("#kpi-queue", KpiTile).show(
            UNKNOWN if running is None else f"{running} / {waiting}",
            f"KV {pct(engine.get('kv_usage'), 0)}",
            "warn" if (waiting or 0) > 0 else "neutral",
        )
        power = finite(engine.get("power_w"))
        energy = s.energy_wh
        power_tile = self.query_one("#kpi-power", KpiTile)
        # Say where the watts come from: the calibration's power model on the simulator, a meter live.
        power_tile.border_title = {"modelled": "power W model", "measured": "power W meter"}.get(
            s.energy_basis or "", "power W"
        )
        power_tile.show(num(power, 0), f"energy {num(energy, 1)} Wh" if energy is not None else "not measured")

    def _plots(self, s: Session) -> None:
        series = s.series
        p99, p50 = series["p99_s"], series["p50_s"]
        violating = p99.last is not None and s.slo_e2e_s is not None and p99.last > s.slo_e2e_s
        self.query_one("#plot-p99", TimePlot).draw(
            [
                Line(p50.t, p50.v, "p50", "gray"),
                Line(p99.t, p99.v, "p99", "red" if violating else "green"),
            ],
            thresholds=[Threshold(s.slo_e2e_s)] if s.slo_e2e_s is not None else [],
            ylim=(0.0, _upper(p99.v, s.slo_e2e_s)),
            xlabel="time, s",
        )
        goodput, throughput = series["goodput_rps"], series["throughput_rps"]
        self.query_one("#plot-goodput", TimePlot).draw(
            [
                Line(throughput.t, throughput.v, "throughput", "blue"),
                Line(goodput.t, goodput.v, "goodput", "green"),
            ],
            ylim=(0.0, _upper(throughput.v, *goodput.v)),
            xlabel="time, s",
        )
        smooth = series["smooth_goodput"]
        self.query_one("#plot-smooth", TimePlot).draw(
            [Line(smooth.t, smooth.v, "smooth goodput", "cyan")],
            ylim=(0.0, _upper(smooth.v)),
            xlabel="time, s",
        )
        attain = series["slo_attainment"]
        self.query_one("#plot-attain", TimePlot).draw(
            [Line(attain.t, [v * 100 for v in attain.v], "attainment", "magenta")],
            thresholds=[Threshold(ATTAINMENT_TARGET * 100)],
            ylim=(0.0, 105.0),
            xlabel="time, s",
        )
        ttft, tpot = series["ttft_p99_s"], series["tpot_p99_s"]
        self.query_one("#plot-ttft", TimePlot).draw(
            [
                Line(ttft.t, ttft.v, "TTFT p99", "orange"),
                Line(tpot.t, [v * 1000 for v in tpot.v], "TPOT p99 ms", "cyan", yside="right"),
            ],
            thresholds=[Threshold(s.slo_ttft_s)] if s.slo_ttft_s is not None else [],
            ylim=(0.0, _upper(ttft.v, s.slo_ttft_s)),
            ylim_right=(0.0, _upper([v * 1000 for v in tpot.v])),
            xlabel="time, s",
        )
        running, waiting, kv = series["running"], series["waiting"], series["kv_usage"]
        self.query_one("#plot-engine", TimePlot).draw(
            [
                Line(running.t, running.v, "running", "green"),
                Line(waiting.t, waiting.v, "waiting", "orange"),
                Line(kv.t, [v * 100 for v in kv.v], "KV %", "magenta", yside="right"),
            ],
            ylim=(0.0, _upper(running.v, *waiting.v)),
            ylim_right=(0.0, 100.0),
            xlabel="time, s",
        )

    def _facts(self, s: Session) -> None:
        facts = s.backend_facts
        if s.is_simulator:
            where = "embedded simulator"
            speed = "as fast as it goes" if s.speed is None else f"{s.speed:g}× wall time"
            extra = [f"pacing   {speed}", f"calib.   {facts.get('calibration', UNKNOWN)}"]
        else:
            where = {"vllm": "vLLM (managed)", "url": "live server"}.get(s.backend_kind, s.backend_kind)
            extra = [f"url      {facts.get('base_url', facts.get('url', UNKNOWN))}"]
        knobs = s.knobs
        spec = f"on, width {knobs.get('spec_width')}" if knobs.get("spec_on") else "off"
        conc = knobs.get("concurrency")
        lines = [
            f"profile  {s.profile_name}",
            f"seed     {s.seed if s.seed is not None else UNKNOWN}",
            f"backend  {where}",
            f"model    {facts.get('model', UNKNOWN)}",
            f"hardware {facts.get('hardware', UNKNOWN)}",
            *extra,
            "",
            f"mode     {s.mode}",
            "",
            "knobs",
            f" concurrency            {conc if conc is not None else 'unlimited'}",
            f" max_num_seqs           {knobs.get('max_num_seqs', UNKNOWN)}",
            f" max_num_batched_tokens {knobs.get('max_num_batched_tokens', UNKNOWN)}",
            f" speculation            {spec}",
            f" chunked prefill        {'on' if knobs.get('chunked_prefill', True) else 'off'}",
            "",
            f"time     {s.t_s:.1f} s {'simulated' if s.is_simulator else ''}",
            f"state    {s.run_state}",
            f"requests {s.finished}" + (f" of {s.max_requests}" if s.max_requests else "") + f", {s.failed} failed",
            "window   10 s sliding (tiles show the",
            "         whole run once it ends)",
        ]
        if s.energy_basis == "modelled":
            lines.append("power    modelled (calibration)")
        self.query_one("#run-facts", Static).update("\n".join(lines))
