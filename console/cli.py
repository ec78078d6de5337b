"""Command line of slo-console. Parsing only: the batch path must not import Textual (see tests)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from core.executor import EXECUTOR_KINDS, RAY_EXTRA
from core.exit_codes import EXIT_CODES_HELP, ExitCode
from core.job_registry import JOBS
from core.jobs.options import BACKEND_KINDS, DEFAULT_PROFILE, OperatorOptions
from core.profile import SCHEDULING_MODES, ProfileError


def package_version() -> str:
    """slo-console's version from the installed package's metadata."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("slo-console")
    except PackageNotFoundError:  # pragma: no cover - running from a checkout that was never installed
        return "unknown (not installed; pip install -e .)"


class _VersionAction(argparse.Action):
    """--version: the package version, and whether the simulator's hot modules run mypyc-compiled (setup.py).

    Looked up only when asked: finding the modules imports their packages."""

    def __call__(self, parser: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> None:
        import core

        built = core.compiled()
        how = f"{len(built)} of {len(core.COMPILED_MODULES)} hot modules compiled" if built else "pure Python"
        print(f"{parser.prog} {package_version()} ({how})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    jobs = "; ".join(f"{name}: {spec.description}" for name, spec in JOBS.items())
    parser = argparse.ArgumentParser(
        prog="slo-console",
        description="Operator console for LLM serving against a latency SLO (vLLM or the embedded simulator). "
        "`slo-console gateway --help`: the admission gateway as a standalone server.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument(
        "--version", action=_VersionAction, nargs=0, help="show the version and whether it runs compiled"
    )
    parser.add_argument("--batch", action="store_true", help="run headless: JSON Lines on stdout, logs on stderr")
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="profile YAML path or shipped name")
    parser.add_argument(
        "--job", default="run", choices=list(JOBS), help=f"what to do (default: run). {jobs}".replace("%", "%%")
    )
    parser.add_argument(
        "--backend",
        default="sim",
        choices=BACKEND_KINDS,
        help="sim: embedded simulator (default); vllm: launch a local vLLM; url: attach to --url",
    )
    parser.add_argument("--url", help="base URL of a running OpenAI-compatible server (with --backend url)")
    parser.add_argument(
        "--mode",
        metavar="{" + ",".join(SCHEDULING_MODES) + "}",
        help="scheduling mode (default: the profile's); with --backend vllm or url the admission gateway runs "
        "it in front of the server",
    )
    parser.add_argument("--seed", type=int, help="override the profile's seed")
    parser.add_argument("--requests", type=int, help="override the number of requests")
    parser.add_argument("--duration", type=float, dest="duration_s", help="stop sending after this many seconds")
    parser.add_argument("--out", type=Path, help="write events.jsonl, requests.jsonl, summary.json, factsheet.*")
    parser.add_argument(
        "--resume", action="store_true", help="--job tune: continue the journal in --out (finished segments are kept)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="compare, capacity and the tuner's simulator runs side by side in this many processes "
        "(default: one per CPU; 1: one after another); the results are the same",
    )
    parser.add_argument(
        "--executor",
        default="local",
        choices=EXECUTOR_KINDS,
        help=f"where those runs go: local processes (default) or ray tasks on a Ray cluster ({RAY_EXTRA})",
    )
    parser.add_argument(
        "--ray-address",
        help="--executor ray: the cluster to join (auto, or ray://HOST:10001); default: start a local Ray",
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="console only: simulator speed factor against wall time (default 1.0)",
    )
    return parser


def build_gateway_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slo-console gateway",
        description="Admission gateway: an OpenAI-compatible front that runs a scheduling mode in front of "
        "one or more running servers (point any OpenAI client at it).",
        epilog="Exit codes: 0 stopped (SIGTERM), 2 bad usage, profile, mode or port, 3 upstream unreachable, "
        "130 interrupted (Ctrl-C) (core/exit_codes.py).",
    )
    parser.add_argument("--profile", default=DEFAULT_PROFILE, help="profile YAML path or shipped name (SLOs, mode)")
    parser.add_argument(
        "--upstream",
        action="append",
        default=[],
        dest="upstreams",
        metavar="URL",
        help="base URL of a running OpenAI-compatible server; repeat for several replicas",
    )
    parser.add_argument(
        "--launch",
        action="store_true",
        help="start and own a vLLM from the profile's server: section instead of --upstream (with --tune, "
        "max_num_seqs is tuned too, by replica swap)",
    )
    parser.add_argument(
        "--one-replica",
        action="store_true",
        help="with --launch: two vLLMs do not fit (GPU memory), so a swap drains and restarts the server while "
        "the gateway holds arrivals (found by itself when a second server fails to start for lack of memory)",
    )
    parser.add_argument("--port", type=int, required=True, help="port to listen on (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--mode", metavar="{" + ",".join(SCHEDULING_MODES) + "}", help="scheduling mode (default: the profile's mode)"
    )
    parser.add_argument("--log-requests", action="store_true", help="print one event per request on stdout")
    parser.add_argument(
        "--tune",
        action="store_true",
        help="tune online on the traffic served: the per-replica concurrency cap (fcfs), or the mode's own knobs "
        "(saber, slos-serve); tune_step events on stdout",
    )
    parser.add_argument(
        "--tune-modes",
        nargs="+",
        default=None,
        metavar="MODE",
        help="with --tune: the scheduling modes it may switch among (fcfs, saber, slos-serve; default: the mode "
        "the gateway starts in, alone)",
    )
    parser.add_argument(
        "--max-queue", type=int, default=None, metavar="N", help="with --tune: reject arrivals when N wait (429)"
    )
    parser.add_argument(
        "--tune-window",
        type=float,
        nargs=2,
        default=None,
        metavar=("REQUESTS", "SECONDS"),
        help="with --tune: a window ends after at least REQUESTS ended requests and SECONDS (default 200 60)",
    )
    return parser


def gateway_main(argv: list[str]) -> int:
    parser = build_gateway_parser()
    args = parser.parse_args(argv)
    if bool(args.upstreams) == args.launch:
        parser.error("give either --upstream URL (repeatable) or --launch")
    if args.one_replica and not args.launch:
        parser.error("--one-replica is for --launch (the gateway swaps only servers it started)")
    launched: dict[str, Any] = {}
    try:
        attach = (
            _online_tuning(args.max_queue, args.tune_window, launched, args.tune_modes)
            if args.tune
            else _answer_swaps(launched)
        )
    except ValueError as exc:
        parser.error(f"--tune-window: {exc}")
    from core.gateway.standalone import GatewayArgs, run_gateway

    return run_gateway(
        GatewayArgs(
            profile=args.profile,
            upstreams=args.upstreams,
            port=args.port,
            host=args.host,
            mode=args.mode,
            log_requests=args.log_requests,
            attach=attach,
            launch=_launcher(launched, one_at_a_time=args.one_replica) if args.launch else None,
        )
    )


def _print_json_line(event: dict[str, Any]) -> None:
    from core.events import to_json_line

    print(to_json_line(event), flush=True)


def _launcher(launched: dict[str, Any], *, one_at_a_time: bool = False):  # type: ignore[no-untyped-def]
    """The standalone gateway's --launch: one vLLM from the profile, kept in `launched` for --tune's swaps
    (drain-and-restart ones with --one-replica)."""
    from core.backends.launched_replicas import LaunchedReplicas

    async def launch(profile):  # type: ignore[no-untyped-def]
        replicas = launched["replicas"] = LaunchedReplicas(profile, sink=_print_json_line, one_at_a_time=one_at_a_time)
        try:
            url = await replicas.start_first()
        except BaseException:
            await replicas.close()
            raise
        return [url], replicas.close

    return launch


def _answer_swaps(launched: dict[str, Any]):  # type: ignore[no-untyped-def]
    """Without --tune: POST /gateway/swap swaps the servers --launch started (a 409 without --launch)."""

    async def detach() -> None:
        return None

    def attach(gateway, profile):  # type: ignore[no-untyped-def]
        if "replicas" in launched:
            launched["replicas"].answer_swaps(gateway)
        return detach

    return attach


def _online_tuning(  # type: ignore[no-untyped-def]
    max_queue: int | None, window: list[float] | None, launched: dict[str, Any], modes: list[str] | None
):
    """The standalone gateway's --tune: the online tuner attached once the gateway serves."""
    from core.tune.online import OnlineSettings
    from core.tune.online_gateway import attach_online_tuner

    settings = (
        OnlineSettings() if window is None else OnlineSettings(window_requests=int(window[0]), window_s=window[1])
    )

    def attach(gateway, profile):  # type: ignore[no-untyped-def]
        tuning = attach_online_tuner(
            gateway,
            profile,
            settings=settings,
            sink=_print_json_line,
            max_queue=max_queue,
            replicas=launched.get("replicas"),
            modes=tuple(modes) if modes else None,
        )
        return tuning.stop

    return attach


def options_from_args(args: argparse.Namespace, argv: list[str]) -> OperatorOptions:
    """The operator's options from the parsed command line: what both front ends build from."""
    return OperatorOptions(
        profile=args.profile,
        job=args.job,
        backend=args.backend,
        url=args.url,
        mode=args.mode,
        seed=args.seed,
        requests=args.requests,
        duration_s=args.duration_s,
        out=args.out,
        resume=args.resume,
        speed=args.speed,
        workers=args.workers,
        executor=args.executor,
        ray_address=args.ray_address,
        command_line=["slo-console", *argv],
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["gateway"]:
        return gateway_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    options = options_from_args(args, argv)
    try:
        options.check()
    except ProfileError as exc:  # bad usage: one line, exit code 2
        print(f"slo-console: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if args.batch:
        from console.batch import run_batch

        return run_batch(options)
    from console.launch import run_app  # imported only here: the batch path never loads Textual

    return run_app(options)
