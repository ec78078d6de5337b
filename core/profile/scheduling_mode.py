"""The scheduling mode: which controller runs in front of the engine. One type, validated once.

`Profile.mode` carries it (a profile's `mode:`, or `--mode` / the console's Modes tab applied to the profile
once by the front end); everything downstream (the backend factory, the jobs, the factsheet) reads the
profile's mode. Each name has a policy factory in core/modes.py (`MODES`, same names, same order;
a test keeps the two in step).
"""

from __future__ import annotations

import difflib
from typing import Literal, get_args

from core.profile.errors import ProfileError

# fcfs: vLLM's own first come, first served (no controller); the others cite their papers in
# core/modes.py. Order: the baseline first (the order of `--job compare`'s table).
SchedulingMode = Literal["fcfs", "saber", "slos-serve", "adaserve"]
SCHEDULING_MODES: tuple[SchedulingMode, ...] = get_args(SchedulingMode)
DEFAULT_MODE: SchedulingMode = "fcfs"


def parse_scheduling_mode(name: str, where: str = "--mode") -> SchedulingMode:
    """`name` as a `SchedulingMode`, or ProfileError (exit 2) naming `where` it came from, the nearest mode and
    every mode there is."""
    for mode in SCHEDULING_MODES:
        if name == mode:
            return mode
    near = difflib.get_close_matches(name, SCHEDULING_MODES, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    raise ProfileError(f"{where} {name!r} is not a scheduling mode; {hint}choose one of: {', '.join(SCHEDULING_MODES)}")
