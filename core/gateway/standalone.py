"""`slo-console gateway`: the admission gateway as a standalone server any OpenAI client can use.

    slo-console gateway --profile saber-w1 --upstream http://127.0.0.1:8000 [--upstream URL ...] \
        --port 9000 [--host 127.0.0.1] [--mode saber] [--tune [--max-queue N]]

Startup checks each upstream (GET /v1/models) and binds the port; it then serves until SIGTERM or Ctrl-C,
when requests still held are answered `deferred` and those at an upstream may finish. Events (start, mode
changes, stop with the final counters; with --log-requests one per request) go to stdout as JSON Lines.
Exit codes: 0 stopped by SIGTERM, 2 bad usage/profile/mode/port, 3 an upstream unreachable, 130 Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from core.backend_api import BackendUnavailable
from core.controller_api import Policy
from core.events import Event, to_json_line
from core.exit_codes import ExitCode
from core.gateway.admission import PolicyFactory
from core.gateway.server import Gateway, GatewayError, policy_factory_for
from core.gateway.upstream import probe_upstreams
from core.profile import Profile, ProfileError, SchedulingMode, load_profile, parse_scheduling_mode

# Something the caller runs on the gateway once it serves (the online tuner, core/tune/online_gateway.py, which
# sits in a layer above the gateway): it returns the coroutine function that stops it, or raises ProfileError.
GatewayAttachment = Callable[[Gateway, Profile], Callable[[], Awaitable[None]]]
# --launch: starts the servers from the profile (core/backends/launched_replicas.py, a layer above) and returns
# their URLs and the coroutine function that stops them; raises BackendUnavailable when one does not start.
GatewayLauncher = Callable[[Profile], Awaitable[tuple[list[str], Callable[[], Awaitable[None]]]]]


@dataclass(slots=True)
class GatewayArgs:
    profile: str
    upstreams: list[str]
    port: int
    host: str = "127.0.0.1"
    mode: SchedulingMode | None = None  # None: the profile's mode
    log_requests: bool = False
    attach: GatewayAttachment | None = None
    launch: GatewayLauncher | None = None


def _check_url(url: str) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"--upstream {url!r} is not a URL; give one like http://127.0.0.1:8000"
    return None


T = TypeVar("T")


def run_on_gateway_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on the event loop the gateway serves on: uvloop's (libuv's) where it is installed, 10-15%
    less of the gateway's CPU per request than asyncio's here; asyncio's otherwise. The soak
    (benchmarks/soak.py) runs its gateway through this too, so it measures the loop the product runs."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - a dependency on Linux and macOS; asyncio's loop elsewhere
        return asyncio.run(main)
    return uvloop.run(main)


def running_loop_name() -> str:
    """Which event loop runs the calling coroutine: "uvloop" or "asyncio"."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"


def run_gateway(args: GatewayArgs) -> int:
    """Serve until stopped; returns the exit code. Problems are one line on stderr."""
    try:
        return run_on_gateway_loop(_serve(args))
    except KeyboardInterrupt:  # pragma: no cover - the signal handler normally catches it first
        return ExitCode.INTERRUPTED


def settle_heap() -> None:
    """Move everything start-up made (imports, the profile, the mode) out of the garbage collector's view.

    The gateway's heap after start-up is ~55k container objects that live as long as the process; a full
    collection walks them all, 10-40 ms measured on this machine, and while it runs every request in flight
    waits: at 200 req/s that set the gateway's p99. Frozen, a collection only walks what requests allocated.
    """
    gc.collect()
    gc.freeze()


def _print_event(event: Event) -> None:
    print(to_json_line(event), flush=True)


async def _serve(args: GatewayArgs) -> int:
    problems = [p for p in (_check_url(u) for u in args.upstreams) if p]
    if not args.upstreams and args.launch is None:
        problems.append("give at least one --upstream http://HOST:PORT, or --launch")
    if args.upstreams and args.launch is not None:
        problems.append("give either --upstream or --launch, not both")
    if not 0 <= args.port <= 65535:
        problems.append(f"--port {args.port} is not a port number (0-65535)")
    if problems:
        print(f"slo-console gateway: {problems[0]}", file=sys.stderr)
        return ExitCode.USAGE
    try:
        profile = load_profile(args.profile)
        factory = policy_factory_for(profile, replicas=max(1, len(args.upstreams)))
        policy = factory(profile.mode if args.mode is None else parse_scheduling_mode(args.mode))
    except ProfileError as exc:
        print(f"slo-console gateway: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if args.launch is not None:
        try:
            upstreams, close_servers = await args.launch(profile)
        except BackendUnavailable as exc:
            print(f"slo-console gateway: {exc}", file=sys.stderr)
            return ExitCode.BACKEND
        except ProfileError as exc:  # a knob this vLLM cannot express
            print(f"slo-console gateway: {exc}", file=sys.stderr)
            return ExitCode.USAGE
        try:
            return await _serve_on(args, profile, factory, policy, upstreams)
        finally:
            await close_servers()
    unreachable = await probe_upstreams(args.upstreams)
    if unreachable:
        message = f"upstream unreachable: {unreachable[0]}; start it or fix --upstream"
        print(f"slo-console gateway: {message}", file=sys.stderr)
        return ExitCode.BACKEND
    return await _serve_on(args, profile, factory, policy, args.upstreams)


async def _serve_on(
    args: GatewayArgs, profile: Profile, factory: PolicyFactory, policy: Policy, upstreams: list[str]
) -> int:
    gateway = Gateway(
        upstreams,
        policy,
        profile=profile,
        policy_factory=factory,
        host=args.host,
        port=args.port,
        on_event=_print_event,
        request_events=args.log_requests,  # otherwise no per-request event is even built
        keep_decisions=False,  # nothing reads them here: kept, they grow with every request served
    )
    try:
        url = await gateway.start()
    except GatewayError as exc:
        print(f"slo-console gateway: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    detach: Callable[[], Awaitable[None]] | None = None
    if args.attach is not None:
        try:
            detach = args.attach(gateway, profile)
        except ProfileError as exc:
            await gateway.stop()
            print(f"slo-console gateway: {exc}", file=sys.stderr)
            return ExitCode.USAGE
    settle_heap()
    serving = f"serving on {url} (mode {policy.name}, {running_loop_name()} loop)"
    print(f"slo-console gateway: {serving}, Ctrl-C to stop", file=sys.stderr)
    stopped: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    loop = asyncio.get_running_loop()
    for signum, code in ((signal.SIGINT, ExitCode.INTERRUPTED), (signal.SIGTERM, ExitCode.OK)):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, lambda c=code: stopped.done() or stopped.set_result(c))
    try:
        code = await stopped
    finally:
        if detach is not None:
            await detach()
        await gateway.stop()
    return code
