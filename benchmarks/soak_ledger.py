"""The soak's ledger (benchmarks/soak.py): what the client, the gateway and the upstream each record per
request, and the join after the run that judges every request.

Each side writes into arrays sized up front for the whole run, so no side's memory grows with the count of
requests (the gateway's RSS and live blocks stay the gateway's own); texts are kept once per fault and for
the first KEPT requests that need one in a message. The client and the upstream may run in processes of
their own (benchmarks/soak_load.py): their records are pickled back to the gateway's process, which joins
them after its own memory and cleanup were counted. Each side knows the seeded schedule (`draw_faults`),
so each can record by request index.
"""

from __future__ import annotations

import logging
import os
import resource
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.soak_faults import FAULTS, UNTOUCHED, Sent
from core.events import Event

OUTCOMES = ("completed", "rejected", "deferred", "failed")  # the gateway's outcomes, by their code here
KEPT = 100  # per-request texts each side keeps for the messages about what went wrong
LOGGERS = ("aiohttp.server", "aiohttp.web", "asyncio", "aiohttp.client")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def cpu_s() -> float:
    """This process's CPU time, user and system, in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def expected_outcome(fault: str, faulty: bool) -> str:
    return FAULTS[fault][1] if faulty else "completed"


class ErrorLogs(logging.Handler):
    """Collects what aiohttp and asyncio log at ERROR in one process (each of the soak's processes has one)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        cause = ""
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            # The deepest frame of this repository's code: whose handler it was (the gateway's or the upstream's).
            frames = [f for f in traceback.extract_tb(exc.__traceback__) if "site-packages" not in f.filename]
            where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
            cause = f" ({type(exc).__name__}: {exc}{where})"
        self.lines.append(f"{record.name}: {record.getMessage()}{cause}")

    def attach(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).addHandler(self)

    def detach(self) -> None:
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(self)


class ClientRecord:
    """What the client saw of each request it sent (indices past the schedule are warm-up, not recorded)."""

    def __init__(self, count: int) -> None:
        self.sent = 0  # requests sent (arrivals stop early at the time limit)
        self.done = np.zeros(count, dtype=bool)  # the client's request ended (not cancelled at the end)
        self.status = np.zeros(count, dtype=np.int16)  # HTTP status; 0: none (hung up, could not connect)
        self.e2e_s = np.full(count, np.nan)
        self.errored = np.zeros(count, dtype=bool)
        self.errors: dict[int, str] = {}  # the first KEPT requests' errors
        self.error_by_fault: dict[str, str] = {}
        self.error_logs: list[str] = []
        self.cpu_s = 0.0  # the client's CPU time from the first arrival to the end (its own process)
        # Its own process's asyncio tasks and open descriptors before its session opened and after it closed
        # (in its own process only; on the gateway's loop the soak's own count covers it).
        self.tasks: tuple[int, int] = (0, 0)
        self.fds: tuple[int, int] = (0, 0)

    def on_sent(self, index: int, sent: Sent) -> None:
        if index >= len(self.done):
            return
        self.done[index] = True
        self.status[index] = sent.status or 0
        if sent.e2e_s is not None:
            self.e2e_s[index] = sent.e2e_s
        if sent.error is not None:
            self.errored[index] = True
            self.error_by_fault.setdefault(sent.fault, sent.error)
            if len(self.errors) < KEPT:
                self.errors[index] = sent.error

    def error_of(self, index: int, fault: str) -> str | None:
        if not self.errored[index]:
            return None
        return self.errors.get(index, self.error_by_fault.get(fault))


class UpstreamRecord:
    """The upstream's own time per request (receipt to last byte written), for the added-latency figure."""

    def __init__(self, count: int) -> None:
        self.served_s = np.full(count, np.nan)
        self.error_logs: list[str] = []
        self.cpu_s = 0.0  # the upstream's CPU time once it served (its own process)
        self.tasks: tuple[int, int] = (0, 0)  # as the client's: before it started listening, after it stopped
        self.fds: tuple[int, int] = (0, 0)

    def on_served(self, index: int, seconds: float) -> None:
        if 0 <= index < len(self.served_s):
            self.served_s[index] = seconds  # a retried request: its last attempt's time


class GatewayRecord:
    """The gateway's `gateway_request` event per request: outcome and whether a cause came with it. Kept in
    the gateway's process; `every` calls `on_every` each that many events (the soak samples RSS there)."""

    def __init__(self, faults: list[str], faulty: bool, every: int, on_every: Callable[[], None] | None = None) -> None:
        self.faults = faults
        self.faulty = faulty
        self.outcome = np.full(len(faults), -1, dtype=np.int8)
        self.has_reason = np.zeros(len(faults), dtype=bool)
        self.reason_by_fault: dict[str, str] = {}
        self.unexpected: dict[int, str] = {}  # the cause of the first KEPT requests not ending as scheduled
        self.twice: list[int] = []  # requests the gateway reported more than once
        self.events = 0
        self.every = every
        self.on_every = on_every

    def on_event(self, event: Event) -> None:
        if event["event"] != "gateway_request":
            return
        self.events += 1
        if self.events % self.every == 0 and self.on_every is not None:
            self.on_every()
        index = int(event["id"])
        if index >= len(self.faults):
            return  # a warm-up request
        if self.outcome[index] >= 0:
            self.twice.append(index)
            return
        outcome, reason = event["outcome"], event["reason"]
        self.outcome[index] = OUTCOMES.index(outcome)
        self.has_reason[index] = bool(reason)
        fault = self.faults[index]
        self.reason_by_fault.setdefault(fault, str(reason))
        off_schedule = outcome != expected_outcome(fault, self.faulty) or (outcome != "completed" and not reason)
        if off_schedule and len(self.unexpected) < KEPT:
            self.unexpected[index] = str(reason)


@dataclass
class Joined:
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (fault, gateway outcome) -> count
    reasons: dict[str, str] = field(default_factory=dict)  # fault -> the cause recorded for one request of it
    wrong: list[str] = field(default_factory=list)  # requests not ending as their fault must
    added_s: list[float] = field(default_factory=list)  # added latency of untouched requests, in index order


def join(gateway: GatewayRecord, client: ClientRecord, upstream: UpstreamRecord) -> Joined:
    """Judge every request from the three records: its gateway outcome is the one its fault must give, with a
    cause; an untouched request completed for the client too and has the upstream's time (its added latency is
    the client's end to end minus the upstream's own time, each measured on one process's monotonic clock). A
    request the client gave up on before the gateway read it is the client's own (`unreceived`); any other
    request with a record on one side only is one the gateway lost or invented."""
    joined = Joined(reasons=dict(gateway.reason_by_fault))
    joined.wrong += [f"request {i}: the gateway reported it more than once" for i in gateway.twice]
    for index, fault in enumerate(gateway.faults):
        code, ended = int(gateway.outcome[index]), bool(client.done[index])
        if code < 0:
            if ended and client.status[index] == 0 and client.errored[index]:
                joined.outcomes[(fault, "unreceived")] += 1
                joined.reasons.setdefault(fault, str(client.error_of(index, fault)))
            elif ended:
                joined.wrong.append(f"request {index} ({fault}): no outcome from the gateway")
            continue
        if not ended:
            joined.wrong.append(f"request {index}: an outcome from the gateway, none from the client")
            continue
        outcome, expected = OUTCOMES[code], expected_outcome(fault, gateway.faulty)
        joined.outcomes[(fault, outcome)] += 1
        if outcome != expected or (outcome != "completed" and not gateway.has_reason[index]):
            cause = gateway.unexpected.get(index, "cause not kept")
            joined.wrong.append(f"request {index} ({fault}): {outcome} ({cause}), expected {expected}")
        elif fault == UNTOUCHED:
            e2e_s, served_s = float(client.e2e_s[index]), float(upstream.served_s[index])
            if client.status[index] != 200 or np.isnan(e2e_s):
                seen = f"{client.status[index] or None} {client.error_of(index, fault)}"
                joined.wrong.append(f"request {index}: completed at the gateway, client saw {seen}")
            elif np.isnan(served_s):
                joined.wrong.append(f"request {index} ({fault}): no upstream time for a completed request")
            else:
                joined.added_s.append(e2e_s - served_s)
    return joined
