"""Soak: many requests through the admission gateway over upstreams that misbehave on a seeded schedule.

    python benchmarks/soak.py [--requests 20000] [--rate 60] [--seed 0] [--max-seconds 600]
        [--baseline-requests 3000] [--in-process] [--worker-cpus C,U] [--one-fault FAULT] [--asyncio-loop]

Three processes, on 127.0.0.1 only (benchmarks/soak_load.py): this one runs the gateway alone, as in
production (core/gateway/server.py, the same `Gateway` the standalone server runs, with a port where nothing
listens as its second upstream); an aiohttp upstream that carries out each request's fault, and an open-loop
client (Poisson arrivals at `--rate`), each run in a process of its own that dies with this one (SIGKILL
included). `--in-process` runs all three on one event loop, the soak's first form (the added latency then
includes the time the client and the upstream took on that loop); `--worker-cpus` pins the client and the
upstream to the given cores (pin this process with taskset); `--one-fault` gives half the requests that one
fault and leaves the other half untouched (what one fault costs the gateway). The gateway runs on the loop
`slo-console gateway` serves on (uvloop's where installed, core/gateway/standalone.py); `--asyncio-loop` runs
it on asyncio's default loop, the soak's form before 2026-11-26 afternoon.

Each request draws one fault from `FAULTS` (seeded; benchmarks/soak_faults.py): the upstream dies
mid-stream, resets the connection, hangs without sending, truncates the stream or sends malformed events or
an in-stream error, answers 429/500/503, or trickles slowly; the connection is refused (the request is
routed to the dead port); the mode rejects it, holds it and releases it later, or holds it until the load
ends (deferred); the client hangs up early (after the first chunk, or while the request is held) or reads
slowly. The routing, holds and rejections are a scripted `Policy` (`ScriptedFaults`): the soak tests the
gateway's plumbing and accounting, the modes' own logic has its own tests.

After the run it checks, and prints:
- accounting: received = completed + rejected + deferred + failed, and every request's outcome (from the
  gateway's `gateway_request` events, by the client's request id) is the one its fault must give, with a
  cause (no request left open or counted twice); the client's and the upstream's records come back to this
  process after the run and are joined per request (benchmarks/soak_ledger.py);
- cleanup: asyncio tasks and open file descriptors of the gateway's process after the run (gateway, sessions,
  upstream and workers closed) equal those before it, and no per-request state is left (held, in flight,
  decisions, the mode's queue);
- memory, of the gateway's process: Python's live memory blocks before the load and after it drained (at
  most BLOCKS_ALLOWED more), and the resident set size sampled through the run (it keeps the high-water mark
  of any backlog);
- latency: the gateway's added latency (the client's end to end minus the upstream's own time, each a
  duration on its own process's monotonic clock) of the requests no fault touched, p50 and p99 pooled and
  the median over windows of 500 of the p99 (one stall of the machine spoils a window, not the figure),
  against a fault-free run of `--baseline-requests` first at the same rate; the check compares the windowed
  p99s (at most twice the fault-free one).
Exit code 0 when every check passes, 1 otherwise. Every loop is bounded in count and in time
(`--max-seconds`: arrivals stop, what is open is waited for at most `DRAIN_S`, then everything is closed).
Every process also reports what aiohttp and asyncio logged at ERROR. tests/test_gateway_soak.py runs a short
soak in the suite; benchmarks/soak_device.sh the 100,000 requests on a quiet multi-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.soak_faults import (
    FAULTS,
    HOST,
    ONE_FAULT_ENV,
    UNTOUCHED,
    UPSTREAM_TIMEOUT_S,
    ScriptedFaults,
    draw_faults,
)
from benchmarks.soak_ledger import ErrorLogs, GatewayRecord, cpu_s, join, open_fds
from benchmarks.soak_load import InProcessLoad, ProcessLoad, first_spawn
from core.gateway.server import Gateway
from core.gateway.standalone import run_on_gateway_loop, running_loop_name, settle_heap
from core.metrics import percentiles

IDLE_S = 3.5  # after the run, the wait before the live-memory count (the upstream pool's keep-alive is 3 s)
RSS_EVERY = 250  # requests between memory samples
# Live memory blocks a run may leave behind after it drained: caches of asyncio, aiohttp and yarl take 1.5-3k
# whatever the count (measured at 300-1,200 requests); a leak of one block per request exceeds it from 5,000 on.
BLOCKS_ALLOWED = 5000


# ---------------------------------------------------------------- one run


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@dataclass
class SoakResult:
    requests: int
    wall_s: float
    stats: dict[str, int]
    outcomes: Counter[tuple[str, str]]  # (fault, gateway outcome) -> count
    reasons: dict[str, str]  # fault -> the cause the gateway recorded for one request of it
    leftovers: dict[str, int]  # per-request state the gateway still held after the run
    wrong: list[str]  # requests whose outcome, cause or client view is not what their fault must give
    tasks_before: int
    tasks_after: int
    fds_before: int
    fds_after: int
    rss_mb: list[float]
    # Python's allocated memory blocks before the load and after it drained (gateway still up, garbage
    # collected): RSS keeps the high-water mark of a backlog, blocks count what is still alive.
    blocks: tuple[int, int]
    added_s: list[float]  # added latency of untouched requests
    error_logs: list[str]
    cpu_s: dict[str, float]  # CPU seconds over the run per process (gateway, client, upstream; one loop: all)
    # The client's and the upstream's own processes: (before, after) of asyncio tasks and of open descriptors.
    workers: dict[str, dict[str, tuple[int, int]]]

    @property
    def rss_growth_second_half_mb(self) -> float:
        half = self.rss_mb[len(self.rss_mb) // 2 :]
        return (half[-1] - half[0]) if len(half) >= 2 else 0.0


async def soak(
    requests: int,
    rate: float,
    seed: int,
    *,
    faulty: bool = True,
    max_seconds: float = 600.0,
    in_process: bool = False,
    worker_cpus: tuple[int, int] | None = None,
) -> SoakResult:
    """Send `requests` through a gateway in front of the misbehaving upstream; see the module docstring.
    `in_process`: client and upstream on this process's event loop instead of processes of their own;
    `worker_cpus`: the cores to pin the client's and the upstream's processes to."""
    if not in_process:
        await first_spawn()
    gc.collect()
    tasks_before, fds_before = len(asyncio.all_tasks()), open_fds()
    errors = ErrorLogs()
    errors.attach()
    rss: list[float] = []
    gateway_record = GatewayRecord(draw_faults(requests, seed, faulty), faulty, RSS_EVERY, lambda: rss.append(rss_mb()))
    load: InProcessLoad | ProcessLoad
    if in_process:
        load = InProcessLoad(requests, rate, seed, faulty, max_seconds)
    else:
        load = ProcessLoad(requests, rate, seed, faulty, max_seconds, worker_cpus)
    policy = ScriptedFaults()
    gateway: Gateway | None = None
    try:
        upstream_url = await load.start_upstream()
        dead = f"http://{HOST}:{_free_port()}"  # nothing listens there: connections are refused
        gateway = Gateway(  # set up as `slo-console gateway` sets it up (core/gateway/standalone.py)
            [upstream_url, dead],
            policy,
            on_event=gateway_record.on_event,
            request_timeout_s=UPSTREAM_TIMEOUT_S,
            keep_decisions=False,
        )
        await gateway.start()
        settle_heap()  # as the standalone gateway does once it serves; undone at the end
        await load.start_client(gateway.base_url)  # it sent the warm-up requests
        # Idle connections close, then what is alive is what start-up and the warm-up left.
        await asyncio.sleep(IDLE_S)
        gc.collect()
        blocks_before = sys.getallocatedblocks()
        warm_stats = gateway.stats.as_dict()
        rss[:] = [rss_mb()]
        start, start_cpu_s = time.perf_counter(), cpu_s()
        await load.run_arrivals()  # every request but the deferred ended (or DRAIN_S passed)
        gateway.end_arrivals()
        await load.finish()  # the deferred were answered; the client ended
        await gateway.settle(timeout_s=5.0)
        await asyncio.sleep(0.05)  # the last upstream handlers record their time
        wall_s, gateway_cpu_s = time.perf_counter() - start, cpu_s() - start_cpu_s
        # What the gateway and the mode still hold per request once every request has ended: all should be 0.
        leftovers = {
            "held": len(gateway._held),
            "in_flight": sum(len(u.in_flight) for u in gateway.upstreams),
            "decisions": len(gateway.decisions),
            "mode_held": len(policy.held),
        }
        rss.append(rss_mb())
        # Idle pooled connections (and their handlers) close after the upstream pool's keep-alive (3 s): what
        # is alive after that is what the requests left behind.
        await asyncio.sleep(IDLE_S)
        gc.collect()
        blocks_after = sys.getallocatedblocks()
    finally:
        if gateway is not None:
            await gateway.stop(grace_s=2.0)
        await load.stop()  # the workers' records come back, the workers end
        errors.detach()
        gc.unfreeze()
    await asyncio.sleep(0.2)  # closed transports release their sockets on the next loop iterations
    gc.collect()
    client_record, upstream_record = load.records()
    joined = join(gateway_record, client_record, upstream_record)
    return SoakResult(
        requests=client_record.sent,
        wall_s=wall_s,
        stats={key: value - warm_stats[key] for key, value in gateway.stats.as_dict().items()},
        outcomes=joined.outcomes,
        reasons=joined.reasons,
        leftovers=leftovers,
        wrong=joined.wrong,
        tasks_before=tasks_before,
        tasks_after=len(asyncio.all_tasks()),
        fds_before=fds_before,
        fds_after=open_fds(),
        rss_mb=rss,
        blocks=(blocks_before, blocks_after),
        added_s=joined.added_s,
        error_logs=errors.lines
        + [f"client: {line}" for line in client_record.error_logs]
        + [f"upstream: {line}" for line in upstream_record.error_logs],
        workers={}
        if in_process
        else {
            "client": {"tasks": client_record.tasks, "fds": client_record.fds},
            "upstream": {"tasks": upstream_record.tasks, "fds": upstream_record.fds},
        },
        cpu_s={"one loop": gateway_cpu_s}
        if in_process
        else {"gateway": gateway_cpu_s, "client": client_record.cpu_s, "upstream": upstream_record.cpu_s},
    )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


WINDOW = 500  # untouched requests per window of the windowed p99


def windowed_p99(added_s: list[float]) -> float:
    """The median over consecutive windows of WINDOW untouched requests of each window's p99 (the pooled p99
    when there are fewer than two windows): one stall of this shared machine spoils a window, not the figure."""
    values = np.array(added_s)
    windows = [values[i : i + WINDOW] for i in range(0, len(values) - WINDOW + 1, WINDOW)]
    if len(windows) < 2:
        return percentiles(values, [99])[0]
    return float(np.median([percentiles(w, [99])[0] for w in windows]))


def problems(result: SoakResult, baseline: SoakResult | None, *, latency: bool = True) -> list[str]:
    """What a soak run got wrong: one line each (empty: every check passed). `latency`: also hold the added
    p99 of untouched requests within twice the fault-free run's (`baseline`)."""
    found = list(result.wrong[:5])
    if len(result.wrong) > 5:
        found.append(f"... and {len(result.wrong) - 5} more requests")
    s = result.stats
    unreceived = sum(count for (_, outcome), count in result.outcomes.items() if outcome == "unreceived")
    if unreceived:
        found.append(f"{unreceived} requests never reached the gateway (the client gave up first: overloaded?)")
    ended = s["completed"] + s["rejected"] + s["deferred"] + s["failed"]
    if s["received"] != result.requests - unreceived or ended != s["received"]:
        found.append(f"counters do not add up: {s}")
    if any(result.leftovers.values()):
        found.append(f"per-request state left in the gateway: {result.leftovers}")
    if result.blocks[1] - result.blocks[0] > BLOCKS_ALLOWED:
        found.append(f"live memory blocks grew by {result.blocks[1] - result.blocks[0]} over the run")
    if result.tasks_after != result.tasks_before:
        found.append(f"asyncio tasks: {result.tasks_before} before, {result.tasks_after} after")
    if result.fds_after != result.fds_before:
        found.append(f"open file descriptors: {result.fds_before} before, {result.fds_after} after")
    for worker, counts in result.workers.items():
        for what, (before, after) in counts.items():
            if before != after:
                found.append(f"the {worker}'s process: {what} {before} before, {after} after")
    found += [f"logged: {line}" for line in result.error_logs[:3]]
    if latency and baseline is not None and baseline.added_s and result.added_s:
        p99, base = windowed_p99(result.added_s), windowed_p99(baseline.added_s)
        if p99 > 2 * base:
            found.append(f"added p99 {p99 * 1e3:.2f} ms is more than twice the fault-free {base * 1e3:.2f} ms")
    return found


def describe(label: str, result: SoakResult) -> list[str]:
    p50, p99 = percentiles(np.array(result.added_s), [50, 99])
    s = result.stats
    per_request = {name: seconds / max(result.requests, 1) * 1e3 for name, seconds in result.cpu_s.items()}
    cpu = ", ".join(f"{name} {ms:.2f} ms" for name, ms in per_request.items())
    return [
        f"{label}: {result.requests} requests in {result.wall_s:.1f} s ({result.requests / result.wall_s:.0f} req/s): "
        f"received {s['received']} = completed {s['completed']} + rejected {s['rejected']} + deferred "
        f"{s['deferred']} + failed {s['failed']}; outcomes not as scheduled: {len(result.wrong)}",
        f"  tasks {result.tasks_before} -> {result.tasks_after}, open fds {result.fds_before} -> {result.fds_after}"
        + "".join(
            f" ({name}'s: {c['tasks'][0]} -> {c['tasks'][1]}, {c['fds'][0]} -> {c['fds'][1]})"
            for name, c in result.workers.items()
        )
        + ", "
        f"RSS {result.rss_mb[0]:.1f} -> {result.rss_mb[-1]:.1f} MB "
        f"(second half +{result.rss_growth_second_half_mb:.1f} MB), "
        f"live blocks {result.blocks[0]} -> {result.blocks[1]}; CPU per request: {cpu}",
        f"  gateway added latency, untouched requests ({len(result.added_s)}): p50 {p50 * 1e3:.2f} ms, "
        f"p99 {p99 * 1e3:.2f} ms; median over windows of {WINDOW} of the p99 "
        f"{windowed_p99(result.added_s) * 1e3:.2f} ms",
    ]


def table_row(label: str, result: SoakResult) -> str:
    """The run as a row of docs/gateway.md's soak table."""
    p50, p99 = percentiles(np.array(result.added_s), [50, 99])
    s = result.stats
    cells = [
        label,
        f"{result.requests:,} in {result.wall_s:.0f} s",
        f"{s['received']:,} = {s['completed']:,} + {s['rejected']:,} + {s['deferred']:,} + {s['failed']:,}",
        f"{len(result.wrong):,}",
        f"{result.tasks_before} -> {result.tasks_after}, {result.fds_before} -> {result.fds_after}",
        f"{result.blocks[0]:,} -> {result.blocks[1]:,}",
        f"{result.rss_mb[0]:.1f} -> {result.rss_mb[-1]:.1f}",
        f"{p50 * 1e3:.2f} / {p99 * 1e3:.2f} / {windowed_p99(result.added_s) * 1e3:.2f}",
    ]
    return "| " + " | ".join(cells) + " |"


async def run(args: argparse.Namespace) -> int:
    cpus = tuple(int(cpu) for cpu in args.worker_cpus.split(",")) if args.worker_cpus else None
    if cpus is not None and len(cpus) != 2:
        raise SystemExit("--worker-cpus takes two cores: the client's, the upstream's (e.g. 1,2)")
    how = {"max_seconds": args.max_seconds, "in_process": args.in_process, "worker_cpus": cpus}
    print(f"soak: the gateway on the {running_loop_name()} loop", flush=True)
    baseline = None
    if args.baseline_requests:
        baseline = await soak(args.baseline_requests, args.rate, args.seed, faulty=False, **how)
        print("\n".join(describe("fault-free", baseline)), flush=True)
    result = await soak(args.requests, args.rate, args.seed, **how)
    print("\n".join(describe("with faults", result)))
    for (fault, outcome), count in sorted(result.outcomes.items()):
        print(f"  {fault:13s} -> {outcome:9s} {count:6d}  e.g. {result.reasons.get(fault)}")
    found = problems(result, baseline) + (problems(baseline, None) if baseline is not None else [])
    print("checks: " + ("all passed" if not found else "; ".join(found)))
    mode = "one loop" if args.in_process else "processes"
    print(f"table rows ({mode}, {running_loop_name()} loop, --rate {args.rate:g}, seed {args.seed}):")
    if baseline is not None:
        print(table_row("fault-free", baseline))
    print(table_row("with faults", result))
    if baseline is not None and baseline.added_s and result.added_s:
        ratio = windowed_p99(result.added_s) / windowed_p99(baseline.added_s)
        print(f"added p99 (windowed) with faults / fault-free: {ratio:.2f}x (the check's limit: 2x)")
    return 1 if found else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--rate", type=float, default=60.0, help="Poisson arrivals per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop sending after this long")
    parser.add_argument("--baseline-requests", type=int, default=3000, help="fault-free run first (0: none)")
    parser.add_argument(
        "--in-process", action="store_true", help="client and upstream on the gateway's event loop, not processes"
    )
    parser.add_argument("--worker-cpus", help="pin the client's and the upstream's processes to these cores: C,U")
    parser.add_argument(
        "--one-fault", choices=[name for name in FAULTS if name != UNTOUCHED], help="half the requests carry this fault"
    )
    parser.add_argument(
        "--asyncio-loop", action="store_true", help="the gateway on asyncio's default loop, not the product's uvloop"
    )
    args = parser.parse_args(argv)
    if args.one_fault:
        os.environ[ONE_FAULT_ENV] = args.one_fault  # the workers draw the schedule too
    # Each deferred request holds a connection for the whole run (1,000 in 100,000 requests) in the gateway's
    # process and in the client's: the soft limit on descriptors (often 1,024) goes up to the hard one.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 65536), hard))
    return asyncio.run(run(args)) if args.asyncio_loop else run_on_gateway_loop(run(args))


if __name__ == "__main__":
    sys.exit(main())
