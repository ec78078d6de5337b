"""A short soak of the admission gateway (issue 25 item 1): benchmarks/soak.py at a size the suite can afford.

Every fault of `FAULTS` hits a few requests (seeded); the checks are the benchmark's own: every request ends
in the outcome its fault must give, with a cause, the counters add up, no asyncio task or file descriptor
outlives the run, and the gateway's added p99 for untouched requests stays within twice a fault-free run's.
The client and the upstream run in processes of their own, as in the benchmark, and die with the soak even
when it is SIGKILLed; the soak's first form (all on the gateway's loop) runs too, shorter. The long form runs
the gateway on the loop `slo-console gateway` serves on (uvloop), as benchmarks/soak.py does; the short one on
asyncio's, so both loops are held to the same accounting.
The long run and its figures: docs/gateway.md, "Soak".
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.soak import describe, problems, soak
from benchmarks.soak_faults import FAULTS, UNTOUCHED
from core.gateway.standalone import run_on_gateway_loop

REPO = Path(__file__).resolve().parents[1]


def test_a_short_soak_accounts_for_every_request_and_leaks_nothing() -> None:
    async def scenario() -> None:
        baseline = await soak(300, rate=100.0, seed=3, faulty=False, max_seconds=20.0)
        result = await soak(700, rate=100.0, seed=3, max_seconds=30.0)
        assert problems(baseline, None) == []
        # The latency check is printed, not asserted: wall-time percentiles on a shared machine (docs/gateway.md).
        print("\n".join(describe("fault-free", baseline) + describe("with faults", result)))
        found = problems(result, baseline, latency=False)
        assert found == [], found
        assert result.requests == 700 and baseline.requests == 300
        # Every kind of fault happened, and each ended as scheduled (problems() checked each request).
        assert {fault for fault, _ in result.outcomes} == set(FAULTS)
        assert sum(count for (fault, _), count in result.outcomes.items() if fault == UNTOUCHED) == len(result.added_s)
        assert result.reasons["refused"].startswith("upstream http://127.0.0.1:")
        assert "client disconnected" in result.reasons["hangup_early"]

    run_on_gateway_loop(scenario())


def test_the_one_loop_soak_accounts_for_every_request_too() -> None:
    """`--in-process`: client and upstream on the gateway's loop (no fault-free run: its latency is printed only)."""
    result = asyncio.run(soak(400, rate=100.0, seed=3, max_seconds=30.0, in_process=True))
    print("\n".join(describe("with faults, one loop", result)))
    assert problems(result, None) == []
    assert result.requests == 400
    assert {fault for fault, _ in result.outcomes} == set(FAULTS)
    assert sum(count for (fault, _), count in result.outcomes.items() if fault == UNTOUCHED) == len(result.added_s)


def _descendants(root: int) -> dict[int, str]:
    """Live processes below `root` (read from /proc): pid -> command line."""
    parents: dict[int, int] = {}
    lines: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                lines[int(entry)] = handle.read().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    found: dict[int, str] = {}
    for pid in parents:
        up = pid
        while up in parents and up != root:
            up = parents[up]
        if up == root and pid != root:
            found[pid] = lines[pid]
    return found


def test_the_soaks_processes_die_with_it_even_by_sigkill() -> None:
    soak_argv = [sys.executable, str(REPO / "benchmarks" / "soak.py"), "--requests", "5000", "--rate", "20",
                 "--baseline-requests", "0"]  # fmt: skip
    process = subprocess.Popen(soak_argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        workers: dict[int, str] = {}
        while time.monotonic() < deadline:
            workers = _descendants(process.pid)
            roles = {role for role in ("upstream", "client") if any(f"soak_load {role}" in c for c in workers.values())}
            if len(roles) == 2:
                break
            time.sleep(0.2)
        assert len(roles) == 2, f"the soak did not start both workers: {workers}"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in workers):
        time.sleep(0.1)
    left = [pid for pid in workers if os.path.exists(f"/proc/{pid}") and _state(pid) != "Z"]
    assert left == [], f"left running after the soak was SIGKILLed: {[workers[pid] for pid in left]}"


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
