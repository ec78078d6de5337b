"""Request specifications and per-request records: the data every layer shares.

A `RequestSpec` is what a workload asks for; a `RequestRecord` is what happened to it, whichever world
served it (the simulator in virtual time, or a live server in wall time). Metrics only ever read records.

Token timestamps are kept per *chunk* (one streamed delta, or one engine step in the simulator): a chunk
that carries k tokens gives all k tokens its arrival time, as `vllm bench serve` does. Arrays are numpy
views where possible so the simulator can hand out 100k records without copying token timelines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from core.pickling import reduce_by_fields


class Status(StrEnum):
    """How a request ended. Only `ok` requests enter latency percentiles."""

    OK = "ok"
    ERROR = "error"  # HTTP error, broken stream, server crash
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    REJECTED = "rejected"  # refused by admission control (a policy decision, not a fault)
    # Held in a scheduling mode's best-effort tier and never served before the run ended (a policy decision).
    DEFERRED = "deferred"
    # Still queued client-side when the run's duration ended: planned but never sent (the client's account).
    NOT_SENT = "not_sent"


@dataclass(frozen=True, slots=True)
class RequestSLO:
    """Latency objectives for one request; None means the objective does not apply."""

    e2e_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(slots=True)
class RequestSpec:
    """One request as the workload defines it.

    `arrival_s` is the scheduled send time relative to the start of the run (open loop). For closed-loop
    clients it is filled in when the client actually sends.
    """

    request_id: int
    prompt_tokens: int
    output_tokens: int  # max_tokens; with ignore_eos the exact count generated
    arrival_s: float = 0.0
    task: str = "default"
    slo: RequestSLO = field(default_factory=RequestSLO)
    # Speculative-decoding acceptance rate this request's text would see (simulator only).
    acceptance: float | None = None
    warmup: bool = False
    # Client that sends it (closed loop); None for open-loop arrivals.
    client_id: int | None = None

    def __init__(
        self,
        request_id: int,
        prompt_tokens: int,
        output_tokens: int,
        arrival_s: float = 0.0,
        task: str = "default",
        slo: RequestSLO | None = None,
        acceptance: float | None = None,
        warmup: bool = False,
        client_id: int | None = None,
    ) -> None:
        # The dataclass's own __init__ (a fresh RequestSLO when none is given), written out as RequestRecord's is
        # below: one spec per request, ~3k instructions each through the generated one when compiled.
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.arrival_s = arrival_s
        self.task = task
        self.slo = RequestSLO() if slo is None else slo
        self.acceptance = acceptance
        self.warmup = warmup
        self.client_id = client_id

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)


@dataclass(slots=True, repr=False)
class RequestRecord:
    """What happened to one request. Times are seconds on the run's clock (virtual or wall)."""

    request_id: int
    task: str
    slo: RequestSLO
    prompt_tokens: int
    max_tokens: int
    scheduled_s: float  # when the workload wanted it sent
    # Latencies are measured from here: when the client was ready to send it. That is the send time (as in
    # vllm bench), except that waiting for a slot under an open-loop in-flight cap counts: a cap that only
    # moves the queue into the client must not look like a latency win (the tuner would exploit it).
    arrival_s: float
    status: Status = Status.OK
    end_s: float | None = None
    output_tokens: int = 0
    # Arrival time of each streamed chunk; chunk_times[0] is the first token.
    chunk_times: np.ndarray | None = None
    # Tokens in each chunk; None means one token per chunk.
    chunk_tokens: np.ndarray | None = None
    error: str | None = None
    warmup: bool = False
    preemptions: int = 0
    client_id: int | None = None
    sent_s: float | None = None  # when it actually left the client (after any in-flight cap)
    # Scheduling mode's account (core/control): the tier it was served from ("high", "low", "best-effort"),
    # the replica that served it, and when the controller released it to an engine (None: never released).
    tier: str | None = None
    replica: int | None = None
    dispatched_s: float | None = None

    def __init__(
        self,
        request_id: int,
        task: str,
        slo: RequestSLO,
        prompt_tokens: int,
        max_tokens: int,
        scheduled_s: float,
        arrival_s: float,
        status: Status = Status.OK,
        end_s: float | None = None,
        output_tokens: int = 0,
        chunk_times: np.ndarray | None = None,
        chunk_tokens: np.ndarray | None = None,
        error: str | None = None,
        warmup: bool = False,
        preemptions: int = 0,
        client_id: int | None = None,
        sent_s: float | None = None,
        tier: str | None = None,
        replica: int | None = None,
        dispatched_s: float | None = None,
    ) -> None:
        # The dataclass's own __init__, written out: compiled, mypyc runs a class's own __init__ natively, where the
        # generated one is interpreted code that sets each field through its descriptor (~20k instructions a
        # record against a few thousand; one record per request).
        self.request_id = request_id
        self.task = task
        self.slo = slo
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.scheduled_s = scheduled_s
        self.arrival_s = arrival_s
        self.status = status
        self.end_s = end_s
        self.output_tokens = output_tokens
        self.chunk_times = chunk_times
        self.chunk_tokens = chunk_tokens
        self.error = error
        self.warmup = warmup
        self.preemptions = preemptions
        self.client_id = client_id
        self.sent_s = sent_s
        self.tier = tier
        self.replica = replica
        self.dispatched_s = dispatched_s

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduce_by_fields(self)

    @classmethod
    def from_spec(
        cls,
        spec: RequestSpec,
        *,
        arrival_s: float | None = None,
        warmup: bool | None = None,
        status: Status = Status.OK,
        end_s: float | None = None,
        output_tokens: int = 0,
        chunk_times: np.ndarray | None = None,
        chunk_tokens: np.ndarray | None = None,
        error: str | None = None,
        preemptions: int = 0,
        sent_s: float | None = None,
        tier: str | None = None,
        replica: int | None = None,
        dispatched_s: float | None = None,
    ) -> RequestRecord:
        """The record of `spec`, for the simulator and the live client alike. `arrival_s` (latency counts from
        it) defaults to the spec's scheduled time, `warmup` to the spec's flag; the other arguments are the
        outcome's fields, with the record's defaults (tests/test_records.py holds every field to its argument)."""
        return RequestRecord._of_spec(
            spec,
            spec.arrival_s if arrival_s is None else arrival_s,
            spec.warmup if warmup is None else warmup,
            status,
            end_s,
            output_tokens,
            chunk_times,
            chunk_tokens,
            error,
            preemptions,
            sent_s,
            tier,
            replica,
            dispatched_s,
        )

    @classmethod
    def served(
        cls,
        spec: RequestSpec,
        arrival_s: float,
        sent_s: float,
        end_s: float,
        chunk_times: np.ndarray | None,
        chunk_tokens: np.ndarray | None,
        preemptions: int,
        tier: str | None,
        replica: int | None,
        dispatched_s: float | None,
    ) -> RequestRecord:
        """`from_spec` of a request an engine served in full (status ok, every output token streamed), its
        arguments positional: the simulator's completion path (100k records a run), where from_spec's eleven
        keywords cost 1.8 us a record against 1.2 (tests/test_records.py holds the two equal)."""
        return RequestRecord._of_spec(
            spec,
            arrival_s,
            spec.warmup,
            Status.OK,
            end_s,
            spec.output_tokens,
            chunk_times,
            chunk_tokens,
            None,
            preemptions,
            sent_s,
            tier,
            replica,
            dispatched_s,
        )

    @classmethod
    def _of_spec(
        cls,
        spec: RequestSpec,
        arrival_s: float,
        warmup: bool,
        status: Status,
        end_s: float | None,
        output_tokens: int,
        chunk_times: np.ndarray | None,
        chunk_tokens: np.ndarray | None,
        error: str | None,
        preemptions: int,
        sent_s: float | None,
        tier: str | None,
        replica: int | None,
        dispatched_s: float | None,
    ) -> RequestRecord:
        """The one place a spec's fields become a record's. Built positionally, in the fields' order: the
        simulator makes 100k records per run, and keyword arguments gathered into a dict and spread again
        cost 3-4 us a record against about 1. The class by name, not `cls` (here and in the two constructors
        above): compiled, `cls(...)` is a generic call through the type (its __init__'s wrapper parsing a tuple of
        20 arguments, ~1.5k instructions), `RequestRecord(...)` the native constructor."""
        return RequestRecord(
            spec.request_id,
            spec.task,
            spec.slo,
            spec.prompt_tokens,
            spec.output_tokens,
            spec.arrival_s,
            arrival_s,
            status,
            end_s,
            output_tokens,
            chunk_times,
            chunk_tokens,
            error,
            warmup,
            preemptions,
            spec.client_id,
            sent_s,
            tier,
            replica,
            dispatched_s,
        )

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def first_token_s(self) -> float | None:
        if self.chunk_times is None or len(self.chunk_times) == 0:
            return None
        return float(self.chunk_times[0])

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        first = self.first_token_s
        return None if first is None else first - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """(e2e - TTFT) / (n - 1), defined for n > 1 (vllm bench serve's definition)."""
        first = self.first_token_s
        if first is None or self.end_s is None or self.output_tokens <= 1:
            return None
        return (self.end_s - first) / (self.output_tokens - 1)

    def __repr__(self) -> str:
        # Short on purpose: the default repr prints every chunk time, and asyncio reprs task results.
        return (
            f"RequestRecord(id={self.request_id}, task={self.task!r}, status={self.status.value}, "
            f"e2e_s={self.e2e_s}, ttft_s={self.ttft_s}, output_tokens={self.output_tokens})"
        )

    def token_times(self) -> np.ndarray:
        """Per-token arrival times (a chunk of k tokens repeats its time k times)."""
        if self.chunk_times is None:
            return np.empty(0)
        if self.chunk_tokens is None:
            return np.asarray(self.chunk_times, dtype=float)
        return np.repeat(np.asarray(self.chunk_times, dtype=float), self.chunk_tokens)
