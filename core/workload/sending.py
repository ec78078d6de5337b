"""The sending rules of a load plan, written once for both worlds: the simulator's clients (core/sim/clients.py,
virtual time) and the live load run (core/backends/load_run.py, wall time) ask these functions, so the two
cannot drift apart again (they had: the duration boundary was `t <= duration_s` in one, `now < duration_s`
in the other).

- Duration window: half-open, [0, duration_s). A request whose send time is exactly `duration_s` is outside
  the run and is not sent; requests in flight at that instant finish. Why half-open: a run of D seconds is
  D seconds long, and consecutive windows tile without sharing an instant (a send at exactly D belongs to
  the window that starts at D). It is what the workload always generated (core/workload/plan.py drops
  open-loop arrivals at or after the window) and what the live client always did; only the simulator's
  clients let a send at exactly D in, and in no profile and no test workload did one land there (checked
  when the rules were unified: every profile's batch output and every fingerprint stayed the same). An
  open-loop request's send time is its scheduled arrival; a closed-loop client's is when its previous
  request ended, plus think time.
- Queued at the end: an open-loop request still waiting client-side for an in-flight slot (the
  `concurrency` cap) when it gets one at or after `duration_s` is never sent; the run records it as
  `not_sent` (planned, the client's account).
- Count: at most `max_requests` requests are taken from the plan (sent, or queued for a slot).
- Warm-up: a request is warm-up when the workload flagged it, when it is among the first `warmup_requests`
  taken, or when its scheduled time (closed loop: its send time) is before `warmup_s`. The scheduled time,
  not the time it finally left the client: a client running late (a busy machine, a full in-flight cap)
  must flag the same requests as an on-time one.
- Think time: a closed-loop client sends its next request `think_time_s` after its previous one ended
  (served, failed or refused).
"""

from __future__ import annotations

from core.backend_api import LoadPlan
from core.records import RequestSpec


def within_duration(t: float, duration_s: float | None) -> bool:
    """Whether a send at `t` (seconds on the run's clock) falls inside the run's window [0, duration_s)."""
    return duration_s is None or t < duration_s


def may_take(plan: LoadPlan, taken: int) -> bool:
    """Whether the client may take another request from the plan after `taken` of them."""
    return plan.max_requests is None or taken < plan.max_requests


def is_warmup(plan: LoadPlan, spec: RequestSpec, ordinal: int) -> bool:
    """Whether `spec`, the `ordinal`-th request taken (from 0), is warm-up. `spec.arrival_s` must hold its
    scheduled time (closed loop: its send time)."""
    return spec.warmup or ordinal < plan.warmup_requests or spec.arrival_s < plan.warmup_s


def next_send_s(plan: LoadPlan, ended_s: float) -> float:
    """When a closed-loop client whose request ended at `ended_s` sends its next one."""
    return ended_s + plan.think_time_s
