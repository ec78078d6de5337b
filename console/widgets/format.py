"""Number formatting shared by tiles, tables and the status line. Unknown reads as an em dash, never 0."""

from __future__ import annotations

from typing import Any

from console.session import finite
from core.metrics.verdict import check_slo

UNKNOWN = "—"


def num(value: Any, digits: int = 2, scale: float = 1.0) -> str:
    number = finite(value)
    return UNKNOWN if number is None else f"{number * scale:.{digits}f}"


def pct(value: Any, digits: int = 1) -> str:
    number = finite(value)
    return UNKNOWN if number is None else f"{number * 100:.{digits}f}%"


def knobs_text(knobs: dict[str, Any] | None, *, short: bool = True) -> str:
    """The knobs an operator tunes, in the order the SLO-Tuner paper lists them."""
    if not knobs:
        return UNKNOWN
    spec = "off"
    if knobs.get("spec_on") and knobs.get("spec_width"):
        spec = f"w{knobs['spec_width']}"
    conc = knobs.get("concurrency")
    if short:
        # The tuner's points carry only the knobs it moves; show the batch limit only when it is known, and the
        # scheduling mode with its own knobs when an online tuner at a gateway moves them (core/tune/online_space.py).
        batch = knobs.get("max_num_batched_tokens")
        mode = knobs.get("mode")
        mode_knobs = " ".join(f"{name} {value:g}" for name, value in (knobs.get("mode_knobs") or {}).items())
        return (
            f"conc {conc if conc is not None else '∞'} · seqs {knobs.get('max_num_seqs', UNKNOWN)} · "
            + (f"batch {batch} · " if batch is not None else "")
            + f"spec {spec}"
            + (f" · {mode}" + (f" ({mode_knobs})" if mode_knobs else "") if mode else "")
        )
    return (
        f"concurrency {conc if conc is not None else 'unlimited'}, max_num_seqs {knobs.get('max_num_seqs')}, "
        f"max_num_batched_tokens {knobs.get('max_num_batched_tokens')}, speculation {spec}"
    )


def duration(seconds: float | None) -> str:
    if seconds is None:
        return UNKNOWN
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def slo_verdict_text(p99_s: float | None, slo_s: float | None) -> tuple[str, str] | None:
    """A finished run's p99 against its SLO in words, from the one verdict (core/metrics/verdict.py
    `check_slo`; the margin p99/SLO - 1 is the share of the SLO the p99 is under or over): ("met", "16% under"),
    ("violated", "12% over") or ("nothing measured", ""); None when the profile sets no latency SLO."""
    check = check_slo("p99", p99_s, slo_s)
    if check.state == "no_slo":
        return None
    if check.margin is None:  # no request completed in the measured window
        return "nothing measured", ""
    share = abs(check.margin) * 100
    amount = f"{share:.0f}%" if share >= 1 else f"{share:.1f}%"
    return ("met", f"{amount} under") if check.state == "met" else ("violated", f"{amount} over")
