"""Whether a run met its latency SLO, and by how much: the one verdict the console's p99 tile (and, once
merged, the batch line and factsheet headline) states.

The SLO-Tuner's target is a p99 end-to-end latency bound (paper 000 sec. II-B; `slo.e2e_s` in a profile);
the verdict compares the measured p99 with that bound. The margin is relative to the SLO, so "met by 25%" and
"violated by 12%" read on the same scale whatever the SLO's size.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class SloVerdict(NamedTuple):
    """`met`: p99 within the SLO (a p99 equal to the SLO meets it). `margin`: (SLO - p99) / SLO, positive
    when met (the headroom, 0.25 = 25% under the SLO), negative when violated (-0.12 = 12% over); NaN when
    nothing was measured (then `met` is False: no measurement proves an SLO)."""

    met: bool
    margin: float


def slo_verdict(p99_s: float | None, slo_s: float) -> SloVerdict:
    """The verdict of a measured p99 latency `p99_s` (None or NaN: nothing measured) against `slo_s` (> 0)."""
    if not slo_s > 0 or math.isinf(slo_s):
        raise ValueError(f"an SLO must be a positive number of seconds, not {slo_s!r}")
    if p99_s is None or math.isnan(p99_s):
        return SloVerdict(False, math.nan)
    return SloVerdict(p99_s <= slo_s, (slo_s - p99_s) / slo_s)
