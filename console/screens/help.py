"""The help screen: key bindings, what each panel shows, and the metric definitions behind the numbers."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# slo-console: operator console

| key | does |
|---|---|
| `r` | run the workload (restarts a running one) |
| `s` | stop the run (keeps what it measured) |
| `t` | start the SLO-Tuner on this profile and backend |
| `f` | export a factsheet (JSON and Markdown) of the last run |
| `c` | compare every scheduling mode on the same seeded arrivals (simulator; Modes tab) |
| `1`-`4` | monitor, tuner, process, modes (whatever has focus: these keys never type into a field) |
| `esc` | release the focus (in a dialog: close it, changing nothing) |
| `enter` | Process: edit the knob under the cursor (or `e`; Enter keeps, Esc cancels). Modes: switch to that mode |
| `ctrl+p` | command palette: every action by name |
| `?` / `f1` | this help |
| `q` | quit (stops any vLLM the console started) |

**Monitor.** Tiles show the last 10 s window while a run goes, and the whole run's summary once it ends
(the same numbers `slo-console --batch` prints for that profile and seed); then the p99 tile says whether the
SLO was met or violated and by how much. Green: within the SLO; amber: within 10% of it; red: violating.
Plots run over the run's clock (simulated seconds on the simulator).

**Tuner.** One row per measured step: knobs, p50/p95/p99 (s), goodput (req/s), score, whether the climb
moved and why. Baseline is the first point, best is the highest score so far.

**Process.** vLLM's state (starting, ready, crashed, stopped), its command line and log tail; edit knobs
(an edit not applied yet reads `12 → 4`) and restart with them. On the simulator the "process" is the embedded
simulator: a knob edit restarts the simulated run.

**Modes.** The scheduling mode in use and one row per mode. Enter on a row switches the mode: the simulator
reruns the workload in it; on a live server the admission gateway in front of vLLM swaps its policy and vLLM
keeps running. `c` runs the compare job (every mode on the same seeded arrivals, on the simulator); the table
has the columns `--batch --job compare` prints (max_num_seqs and speculation first, so a mode that drafts
tokens does not pass for a pure scheduling win), then where each row's figures come from.

## Metrics
- **e2e latency** = last token time − send time; **TTFT** = first token − send; **TPOT** = (e2e − TTFT) / (tokens − 1).
- **goodput** (req/s) = requests per second whose e2e latency met the SLO (SLO-Tuner eq. 1).
- **SLO attainment** = share of all requests in the window, failures included, that met every SLO.
- **smooth goodput** (benefit tok/s): tokens delivered minus α × the reader's idle latency, per second.
- **power / energy** on the simulator are *modelled* from the calibration's power model, not measured.

Press `escape` to close.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "dismiss", "Close"),
        Binding("question_mark", "dismiss", "Close", show=False),
        Binding("f1", "dismiss", "Close", show=False),
        Binding("q", "dismiss", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Markdown(HELP)
