"""A request inside a simulated engine replica, and the callback that hears of its completion.

Its own module because both replicas build and hand these around, the fast one (replica.py) and the
planner's step-by-step one (stepwise.py), as do the engine (engine.py) and the modes' tests; neither replica
module is the other's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from core.pickling import reduce_by_fields
from core.records import RequestSpec


@dataclass(slots=True, eq=False)
class SimRequest:
    """A request inside a replica (one run of it: a preempted request comes back as a new SimRequest).

    Compared by identity (eq=False): the generated field-by-field __eq__ would compare whole requests
    wherever one is looked for among others (`prefilling.remove`)."""

    spec: RequestSpec
    latency_from_s: float  # RequestRecord.arrival_s
    prompt_left: int  # prompt tokens still to prefill (includes recomputed output after preemption)
    context: int = 0  # tokens held in KV for this request
    out_left: int = 0  # output tokens still to produce
    tokens_per_step: float = 1.0
    prefill_end_step: int = -1
    finish_step: int = -1
    admitted_order: int = 0
    generated: int = 0  # output tokens streamed so far (before the current run)
    preemptions: int = 0
    done_runs: list[tuple[np.ndarray, np.ndarray | None]] = field(default_factory=list)
    alive: bool = True  # False once preempted out of the decode heap (lazy heap deletion)
    sent_s: float = 0.0  # when it actually left the client
    dispatched_s: float = 0.0  # when the controller released it to this replica
    # The controller's handle (core/controller_api.ControlledRequest); None on the fcfs fast path.
    controlled: Any = None
    tier: str | None = None

    def __init__(
        self,
        spec: RequestSpec,
        latency_from_s: float,
        prompt_left: int,
        context: int = 0,
        out_left: int = 0,
        tokens_per_step: float = 1.0,
        prefill_end_step: int = -1,
        finish_step: int = -1,
        admitted_order: int = 0,
        generated: int = 0,
        preemptions: int = 0,
        done_runs: list[tuple[np.ndarray, np.ndarray | None]] | None = None,
        alive: bool = True,
        sent_s: float = 0.0,
        dispatched_s: float = 0.0,
        controlled: Any = None,
        tier: str | None = None,
    ) -> None:
        # The dataclass's own __init__ (a fresh list for done_runs when none is given), written out: compiled, mypyc
        # runs it natively where the generated one is interpreted (core/records.RequestRecord says more).
        self.spec = spec
        self.latency_from_s = latency_from_s
        self.prompt_left = prompt_left
        self.context = context
        self.out_left = out_left
        self.tokens_per_step = tokens_per_step
        self.prefill_end_step = prefill_end_step
        self.finish_step = finish_step
        self.admitted_order = admitted_order
        self.generated = generated
        self.preemptions = preemptions
        self.done_runs = [] if done_runs is None else done_runs
        self.alive = alive
        self.sent_s = sent_s
        self.dispatched_s = dispatched_s
        self.controlled = controlled
        self.tier = tier

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    @classmethod
    def arrived(
        cls,
        spec: RequestSpec,
        latency_from_s: float,
        sent_s: float,
        dispatched_s: float,
        controlled: Any,
        tier: str | None,
    ) -> SimRequest:
        """A request's first run, as it enters a replica: the whole prompt and output still to go.

        Built positionally, every field in order with the defaults written out: 0.9 us against 1.8 with
        keywords, once per request (tests/test_sim_requests.py holds it to the keyword form). The class by name,
        not `cls`: compiled, `cls(...)` is a generic call (the type's tp_new, then __init__'s wrapper parsing a
        tuple of 17 arguments: ~1.5k instructions), `SimRequest(...)` the native constructor."""
        return SimRequest(
            spec,
            latency_from_s,
            spec.prompt_tokens,
            0,
            spec.output_tokens,
            1.0,
            -1,
            -1,
            0,
            0,
            0,
            [],
            True,
            sent_s,
            dispatched_s,
            controlled,
            tier,
        )


# (request, end time, chunk times, chunk sizes or None for one token per chunk)
CompletionCallback = Callable[[SimRequest, float, np.ndarray, "np.ndarray | None"], None]
