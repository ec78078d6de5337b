"""Latency the admission gateway adds: the same open-loop load sent directly to a server and through the gateway.

    python benchmarks/gateway_overhead.py [--rate 200] [--duration 10] [--tokens 16] [--rounds 2]
        [--baseline-root DIR]

The upstream is a small aiohttp server in its own process that streams `--tokens` SSE chunks shaped like
vLLM's at once (no model: it exists to make the gateway's own cost visible, not to measure serving). The
gateway is `slo-console gateway` (mode fcfs) in a process of its own, as a user runs it. This process sends
Poisson arrivals at `--rate` req/s for `--duration` s with aiohttp, the paths taking turns (each round
rotates their order, so no path always runs first), and reports per-request TTFT and end-to-end latency
percentiles for both paths and their difference (what the gateway adds): over all rounds pooled, and per
round with the median over rounds (one stall of another process on a shared machine spoils one round's p99,
not the median). All three processes share this machine's cores, so the figures include that contention.
The client and the upstream freeze their start-up heap out of the garbage collector's view (both paths see
them alike; the gateway does the same for itself, core/gateway/standalone.py).

`--reference-proxy` adds a bare aiohttp relay (no policy, no counting, no parsing), run the way the gateway
runs: the least any aiohttp front adds on this machine, so what lies between it and the gateway is the
gateway's own work.

`--baseline-root DIR` adds a third path: the gateway of another checkout (e.g. `git worktree add DIR COMMIT`),
run the same way, in the same rotation, for before/after comparisons under the same load.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = 20  # requests per round that warm the connection pool, not measured
sys.path.insert(0, str(ROOT))

from core.metrics import percentiles  # noqa: E402


def serve_upstream(tokens: int) -> None:
    """The fast upstream: /v1/models, and /v1/completions streaming `tokens` chunks then [DONE]."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        count = int(body.get("max_tokens", tokens))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(count):
            finish = "length" if i == count - 1 else None
            chunk = {
                "id": "cmpl-bench",
                "object": "text_completion",
                "model": "bench",
                "choices": [{"index": 0, "text": " tok", "finish_reason": finish}],
                "usage": {"prompt_tokens": 8, "completion_tokens": i + 1, "total_tokens": 9 + i},
            }
            await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    gc.collect()
    gc.freeze()
    web.run_app(app, host="127.0.0.1", port=0, print=lambda _: None, handle_signals=True, access_log=None)


def serve_reference_proxy(upstream_url: str) -> None:
    """The least an aiohttp front can do: relay each request to the upstream and its stream back chunk by chunk,
    nothing decided, counted or parsed. Run like the gateway (own process, uvloop when installed, start-up heap
    frozen, pooled upstream connections), it is the floor under the gateway's added latency on this machine:
    what remains between the two is the gateway's own work."""

    async def relay(request: web.Request) -> web.StreamResponse:
        session: aiohttp.ClientSession = request.app["session"]
        body = await request.read()
        headers = {"Content-Type": "application/json"}
        async with session.post(upstream_url + request.path_qs, data=body, headers=headers) as upstream:
            response = web.StreamResponse(status=upstream.status, headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", relay)
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        gc.collect()
        gc.freeze()
        await asyncio.Event().wait()  # until SIGTERM ends the process

    try:
        import uvloop  # the gateway's own loop when installed (core/gateway/standalone.py)
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spawn(argv: list[str]) -> subprocess.Popen[str]:
    # A process group of its own (stopped as a whole, never by name) in this session: a session of its own would
    # put it in another scheduler autogroup, which shares the CPU unlike the product's own children
    # (core/serve/process.py's docstring) and would measure the scheduler rather than the gateway.
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0, cwd=ROOT)


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _listening_port(pid: int, timeout_s: float = 30.0) -> int:
    """The TCP port a child process listens on (from /proc: the upstream picks a free one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        inodes = set()
        fd_dir = Path(f"/proc/{pid}/fd")
        for fd in fd_dir.iterdir():
            target = os.readlink(fd) if fd.is_symlink() else ""
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                return int(fields[1].split(":")[1], 16)
        time.sleep(0.1)
    raise RuntimeError(f"process {pid} is not listening after {timeout_s:g} s")


async def _one(session: aiohttp.ClientSession, url: str, tokens: int, out: list[tuple[float, float]]) -> None:
    body = {"model": "bench", "prompt": "hello", "max_tokens": tokens, "stream": True}
    start = time.perf_counter()
    first = None
    async with session.post(url + "/v1/completions", json=body) as response:
        async for chunk in response.content.iter_any():
            if first is None and b'"text"' in chunk:
                first = time.perf_counter()
    end = time.perf_counter()
    out.append(((first or end) - start, end - start))


async def _load(url: str, rate: float, duration_s: float, tokens: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=int(rate * duration_s * 2) + 10)
    arrivals = np.cumsum(gaps)
    arrivals = arrivals[arrivals < duration_s]
    results: list[tuple[float, float]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(WARM_UP):  # warm the connection pool; not measured
            await _one(session, url, tokens, [])
        start = time.perf_counter()
        tasks = []
        for at in arrivals:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, tokens, results)))
        await asyncio.gather(*tasks)
    return np.asarray(results)


def _start_gateway(root: Path, upstream_url: str) -> tuple[subprocess.Popen[str], str]:
    """`slo-console gateway` of the checkout at `root`, in front of the upstream; returns it and its URL."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    argv = [sys.executable, "-m", "console", "gateway", "--upstream", upstream_url, "--port", "0"]
    gateway = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0, cwd=root, env=env
    )  # process_group=0, not a session of its own: see _spawn
    assert gateway.stderr is not None
    line = gateway.stderr.readline()
    match = re.search(r"serving on (http://\S+)", line)
    if not match:
        _stop(gateway)
        raise RuntimeError(f"the gateway in {root} did not start: {line.strip()}")
    print(f"{root}: {line.strip()}")
    return gateway, match.group(1)


def _ms(values: np.ndarray) -> tuple[float, float]:
    p50, p99 = percentiles(values, (50.0, 99.0))
    return p50 * 1e3, p99 * 1e3


def _report(
    args: argparse.Namespace, samples: dict[str, list[np.ndarray]], cpu: dict[str, float], loads: list[float]
) -> None:
    """Print the pooled table, the gateways' CPU per request, each round (with the 1-minute load average at
    its end) and the medians over rounds."""
    print(
        f"rate {args.rate:g} req/s Poisson, {args.duration:g} s x {args.rounds} rounds per path, "
        f"{args.tokens} streamed chunks per request, {os.cpu_count()} CPUs, load average "
        + " ".join(f"{v:.1f}" for v in os.getloadavg())
    )
    print("all rounds pooled:")
    print(f"{'path':<9} {'requests':>8} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'e2e p50 ms':>11} {'e2e p99 ms':>11}")
    figures: dict[str, tuple[float, ...]] = {}
    for name, parts in samples.items():
        data = np.concatenate(parts)
        figures[name] = (*_ms(data[:, 0]), *_ms(data[:, 1]))
        print(f"{name:<9} {len(data):>8} " + " ".join(f"{v:>11.3f}" for v in figures[name]))
    gateways = [name for name in samples if name != "direct"]
    for name in gateways:
        added = [g - d for g, d in zip(figures[name], figures["direct"], strict=True)]
        label = "added" if name == "gateway" else f"added ({name})"
        print(f"{label:<18}" + " ".join(f"{v:>11.3f}" for v in added))
    for name in gateways:
        served = sum(len(part) for part in samples[name]) + WARM_UP * args.rounds  # warm-up went through it too
        print(f"{name} CPU per request: {cpu[name] / served * 1e3:.3f} ms (its process, user + system)")
    # Each round on its own: on a shared machine one stall of another process shows up in one round's p99.
    print("per round (e2e ms; added: the gateway's round minus the direct round of the same turn):")
    per_round: dict[str, list[tuple[float, float]]] = {name: [] for name in samples}
    for index in range(args.rounds):
        parts = []
        for name in samples:
            p50, p99 = _ms(samples[name][index][:, 1])
            per_round[name].append((p50, p99))
            parts.append(f"{name} p50 {p50:.3f} p99 {p99:.3f}")
        for name in gateways:
            parts.append(f"{name} added p99 {per_round[name][index][1] - per_round['direct'][index][1]:.3f}")
        print(f"round {index + 1} (load {loads[index]:.1f}): " + ", ".join(parts))
    for name in gateways:
        added_p50 = [g[0] - d[0] for g, d in zip(per_round[name], per_round["direct"], strict=True)]
        added_p99 = [g[1] - d[1] for g, d in zip(per_round[name], per_round["direct"], strict=True)]
        print(
            f"median over rounds, {name}: e2e p99 {np.median([r[1] for r in per_round[name]]):.3f} ms "
            f"(direct {np.median([r[1] for r in per_round['direct']]):.3f}), "
            f"added p50 {np.median(added_p50):.3f} ms, added p99 {np.median(added_p99):.3f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second (Poisson)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per round")
    parser.add_argument("--tokens", type=int, default=16, help="streamed chunks per request")
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each path runs once per round")
    parser.add_argument("--baseline-root", type=Path, help="also run the gateway of this checkout, as 'baseline'")
    parser.add_argument(
        "--reference-proxy", action="store_true", help="also run a bare aiohttp relay, as 'proxy' (the floor)"
    )
    parser.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-proxy", metavar="UPSTREAM_URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.tokens)
        return
    if args.serve_proxy:
        serve_reference_proxy(args.serve_proxy)
        return
    upstream = _spawn([sys.executable, __file__, "--serve-upstream", "--tokens", str(args.tokens)])
    gateways: dict[str, subprocess.Popen[str]] = {}
    try:
        upstream_url = f"http://127.0.0.1:{_listening_port(upstream.pid)}"
        urls = {"direct": upstream_url}
        roots = {"gateway": ROOT} | ({"baseline": args.baseline_root.resolve()} if args.baseline_root else {})
        for name, root in roots.items():
            gateways[name], urls[name] = _start_gateway(root, upstream_url)
        if args.reference_proxy:
            gateways["proxy"] = _spawn([sys.executable, __file__, "--serve-proxy", upstream_url])
            urls["proxy"] = f"http://127.0.0.1:{_listening_port(gateways['proxy'].pid)}"
        gc.collect()
        gc.freeze()
        names = list(urls)
        samples: dict[str, list[np.ndarray]] = {name: [] for name in names}
        cpu = dict.fromkeys(gateways, 0.0)
        loads: list[float] = []
        for round_index in range(args.rounds):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                before = _cpu_s(gateways[name].pid) if name in gateways else 0.0
                load = _load(urls[name], args.rate, args.duration, args.tokens, round_index)
                samples[name].append(asyncio.run(load))
                if name in gateways:
                    cpu[name] += _cpu_s(gateways[name].pid) - before
            loads.append(os.getloadavg()[0])
        _report(args, samples, cpu, loads)
    finally:
        for gateway in gateways.values():
            _stop(gateway)
        _stop(upstream)


if __name__ == "__main__":
    main()
