"""Cores of their own for the vLLM CPU servers a `--launch` gateway runs side by side during a replica swap.

vLLM's CPU build binds each worker's OpenMP threads to cores (vllm/utils/ompmultiprocessing.py). Left at its
default (`VLLM_CPU_OMP_THREADS_BIND=auto`) it takes the cores the process may run on, one per physical core,
and keeps the last back for its scheduler process ("reserved_cpus"): on a 2-core machine every server binds
to core 0 ("core ids=[0], reserved_cpus=[1]" in each log). Two servers at once, the old one serving and the
new one starting, then share core 0 with their threads bound there, and the new one's start-up stalled behind
the serving one (ready after 225 s once, not within 400 s and 900 s in two CI runs; docs/gateway.md).

The rule: the cores this process may use (`os.sched_getaffinity`) are cut into two halves of equal size,
slot 0 the lower and slot 1 the upper (an odd core left over stays unbound, free for the gateway and the
clients); the first replica binds to slot 0 and each swap starts the new replica on the slot the old one does
not use. Equal halves so that a trial's window on the new replica and the incumbent's on the old one are
measured on the same compute (the online tuner compares them). On 2 cores: "0" and "1". The scheduler and API
processes are not pinned: they are mostly idle Python and float to whichever core is free. Below 2 cores no
binding is set (two servers cannot have cores of their own), and a profile's `server.env` that sets the
variable itself wins.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
SLOTS = 2  # an old and a new replica at once, during a swap


def replica_core_slots(allowed: Sequence[int] | None = None) -> tuple[str, str] | None:
    """The two disjoint core lists (vLLM's "0,1,2" form) the replicas alternate between, or None below 2 cores."""
    cores = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    half = len(cores) // SLOTS
    if half < 1:
        return None
    low, high = cores[:half], cores[half : 2 * half]
    return ",".join(map(str, low)), ",".join(map(str, high))


def other_slot(slot: int) -> int:
    """The slot a swap starts its new replica on: the one the old replica does not use."""
    return (slot + 1) % SLOTS
