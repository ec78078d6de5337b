"""Lay out the profiling data Vidur 0.0.26 needs so that it runs offline, and print how to run it.

    python benchmarks/vidur_offline.py --data DIR [--cache ~/.cache/slo-console/vidur] [--requests 100000]

vidur 0.0.26 (PyPI) ships no profiling data: at start-up it asks the Hugging Face hub for precomputed
predictions, then for its compute and network profiles (`mlp.csv.xz`, `attention.csv.xz`, `all_reduce.csv.xz`,
`send_recv.csv.xz` plus a `config.json`), and trains random forests on them. A machine that cannot reach the hub
stops there. This script writes a stand-in for those two datasets in the layout of a Hugging Face cache, which
`snapshot_download` resolves with `HF_HUB_OFFLINE=1`; nothing in Vidur is changed.

DIR holds CSVs taken from github microsoft/vidur @7d47513 (data files only; copy them yourself):
    mlp.csv             data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv   (real A100 profile)
    all_reduce.csv      data/profiling/network/a100_dgx/all_reduce.csv                 (unused at TP1/PP1)
    send_recv.csv       data/profiling/network/a100_dgx/send_recv.csv                  (unused at TP1/PP1)
    splitwise_conv.csv  data/processed_traces/splitwise_conv.csv                       (request lengths)
The A100 `attention.csv` is missing from every snapshot of that repository we could read, so the script writes a
synthetic one: the profiler's grid and schema, with latencies from formulas calibrated to Llama-2-7B on an A100
(seeded +-2% noise). Simulated latencies are therefore not faithful A100 numbers; the cost of one Vidur
iteration does not depend on them.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import lzma
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

COMPUTE_DATASET = "local/a100-llama-2-7b-hf"
NETWORK_DATASET = "local/a100-dgx"
SNAPSHOT = "0" * 40
MAX_TOKENS = 4096  # Llama-2-7B's context; also the trace clip and every prediction key's bound
DEFAULT_CACHE = Path.home() / ".cache" / "slo-console" / "vidur"

# Llama-2-7B's attention shape (vidur's Llama2_7BModelConfig) and vidur's default KV block size.
N_EMBD, N_Q_HEAD, N_KV_HEAD, BLOCK_SIZE = 4096, 32, 32, 16


def _decode_ms(batch: int, kv: int, tp: int) -> float:
    return 0.008 + (0.0012 * batch + 8.0e-6 * batch * kv) / tp


def _prefill_ms(chunk: int, kv: int, tp: int) -> float:
    return 0.010 + (2.4e-4 * chunk + 1.067e-7 * chunk * (kv + chunk / 2)) / tp


def _grid(max_len: int = MAX_TOKENS) -> list[tuple[int, int, int]]:
    """(prefill_chunk_size, kv_cache_size, batch_size) points, the grid Vidur's attention profiler sweeps."""
    chunks = [*range(64, 128, 16), *range(128, 1024, 32), *range(1024, 4 * 1024 + 1, 64)]
    seq_lens = [*range(0, 1024, 32), *range(1024, max_len, 64)]
    points = []
    for chunk in (c for c in chunks if c <= max_len):  # chunked prefills
        points += [(chunk, i * chunk, 1) for i in range(max_len // chunk)]
    points += [(length, 0, 1) for length in seq_lens if length > 0]  # whole prefills
    points += [(0, kv, b) for kv in seq_lens if kv > 0 for b in range(1, 129)]  # decodes
    return points


def synthetic_attention_csv(seed: int = 0) -> str:
    """attention.csv with the real file's columns Vidur reads, for TP 1/2/4/8 (deterministic for a seed)."""
    rng = random.Random(seed)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(
        [
            "n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers",
            "batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill",
            "time_stats.attn_prefill.median", "time_stats.attn_decode.median",
        ]
    )  # fmt: skip
    for tp in (1, 2, 4, 8):
        for chunk, kv, batch in _grid():
            prefill = _prefill_ms(chunk, kv, tp) * rng.uniform(0.98, 1.02) if chunk else ""
            decode = "" if chunk else _decode_ms(batch, kv, tp) * rng.uniform(0.98, 1.02)
            row = [N_EMBD, N_Q_HEAD, N_KV_HEAD, BLOCK_SIZE, tp, batch, chunk, kv, bool(chunk), prefill, decode]
            writer.writerow(row)
    return out.getvalue()


def _write_dataset(cache: Path, kind: str, name: str, files: dict[str, bytes]) -> None:
    """One dataset in the Hugging Face cache layout: datasets--ORG--NAME/{refs/main, snapshots/REV/...}."""
    repo = cache / "profiling_data" / kind / f"datasets--{name.replace('/', '--')}"
    snapshot = repo / "snapshots" / SNAPSHOT
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    for file_name, data in files.items():
        (snapshot / file_name).write_bytes(data)


def _xz(path: Path) -> bytes:
    return lzma.compress(path.read_bytes())


def prepare(data: Path, cache: Path, requests: int) -> Path:
    """Write the stand-in datasets (once) and a trace long enough for `requests`; return the trace's path."""
    needed = ("mlp.csv", "all_reduce.csv", "send_recv.csv", "splitwise_conv.csv")
    missing = [f for f in needed if not (data / f).exists()]
    if missing:
        raise SystemExit(f"{data} lacks {', '.join(missing)} (see `python benchmarks/vidur_offline.py -h`)")
    cache.mkdir(parents=True, exist_ok=True)
    marker = cache / "profiling_data" / "ready"
    if not marker.exists():
        compute = {
            "config.json": json.dumps({"model": "meta-llama/Llama-2-7b-hf", "device_sku": "a100"}).encode(),
            "mlp.csv.xz": _xz(data / "mlp.csv"),
            "attention.csv.xz": lzma.compress(synthetic_attention_csv().encode()),
        }
        network = {
            "config.json": json.dumps({"sku": "a100_dgx"}).encode(),
            "all_reduce.csv.xz": _xz(data / "all_reduce.csv"),
            "send_recv.csv.xz": _xz(data / "send_recv.csv"),
        }
        _write_dataset(cache, "compute", COMPUTE_DATASET, compute)
        _write_dataset(cache, "network", NETWORK_DATASET, network)
        marker.write_text("ok\n")
    # Vidur's trace length generator returns None once its trace runs out (and the run crashes), so the trace is
    # repeated until it has at least `requests` rows.
    header, *rows = (data / "splitwise_conv.csv").read_text().splitlines()
    copies = -(-requests // len(rows))
    trace = cache / f"splitwise_conv_x{copies}.csv"
    if not trace.exists():
        with trace.open("w") as f:
            f.write("\n".join([header] + rows * copies) + "\n")
    return trace


def vidur_args(cache: Path, trace: Path, requests: int, max_tokens_in_batch: int = MAX_TOKENS) -> list[str]:
    """`python -m vidur.main` arguments for bench-chat's shape at Vidur's leanest settings (see docs/simulator.md).

    vLLM's scheduler in Vidur does not chunk prefills, so its token budget must hold the longest prompt (4,096):
    with bench-chat's 2,048 a longer prompt at the head of the queue could never be scheduled.
    """
    predictor = "--random_forrest_execution_time_predictor_config_"
    return [
        "--replica_config_device", "a100", "--replica_config_network_device", "a100_dgx",
        "--replica_config_model_name", "meta-llama/Llama-2-7b-hf",
        "--cluster_config_num_replicas", "1",
        "--replica_config_tensor_parallel_size", "1", "--replica_config_num_pipeline_stages", "1",
        "--request_generator_config_type", "synthetic",
        "--synthetic_request_generator_config_num_requests", str(requests),
        "--length_generator_config_type", "trace",
        "--trace_request_length_generator_config_max_tokens", str(MAX_TOKENS),
        "--trace_request_length_generator_config_trace_file", str(trace),
        "--interval_generator_config_type", "poisson", "--poisson_request_interval_generator_config_qps", "4.0",
        "--replica_scheduler_config_type", "vllm", "--vllm_scheduler_config_batch_size_cap", "128",
        "--vllm_scheduler_config_max_tokens_in_batch", str(max_tokens_in_batch),
        "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace",
        "--metrics_config_output_dir", str(cache / "out"),
        f"{predictor}cache_dir", str(cache),
        f"{predictor}model_profiling_dataset", COMPUTE_DATASET,
        f"{predictor}network_profiling_dataset", NETWORK_DATASET,
        f"{predictor}prediction_max_tokens_per_request", str(MAX_TOKENS),
        f"{predictor}num_estimators", "250", f"{predictor}max_depth", "16", f"{predictor}min_samples_split", "2",
        f"{predictor}use_native_execution_time_predictor",
    ]  # fmt: skip


def vidur_env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


# What `python -m vidur.main` does (vidur/main.py), plus a report of the simulated work: Vidur numbers its batches
# from a class counter, so the count is the last id + 1.
PROBE = """
from vidur.config import SimulationConfig
from vidur.entities import Batch
from vidur.simulator import Simulator
from vidur.utils.random import set_seeds
config = SimulationConfig.create_from_cli_args()
set_seeds(config.seed)
simulator = Simulator(config)
simulator.run()
print("VIDUR_PROBE", Batch._id + 1, simulator._time)
"""


class VidurRun:
    """Runs vidur 0.0.26 (in its own venv's `python`) offline on bench-chat's shape, N requests."""

    def __init__(self, python: str, data: Path, cache: Path = DEFAULT_CACHE) -> None:
        self.python, self.data, self.cache = python, data, cache

    def command(self, requests: int) -> list[str]:
        trace = prepare(self.data, self.cache, requests)
        return [self.python, "-m", "vidur.main", *vidur_args(self.cache, trace, requests)]

    def clear_outputs(self) -> None:
        """Vidur writes a timestamped metrics folder per run; drop them so repeated runs do not fill the disk."""
        shutil.rmtree(self.cache / "out", ignore_errors=True)

    def probe(self, requests: int) -> dict[str, float]:
        """One untimed run that reports Vidur's batch count and simulated seconds (and trains it on a cold cache)."""
        command = self.command(requests)
        done = subprocess.run(
            [self.python, "-c", PROBE, *command[3:]], env=vidur_env(), capture_output=True, text=True, check=False
        )
        self.clear_outputs()
        lines = [line.split() for line in done.stdout.splitlines() if line.startswith("VIDUR_PROBE")]
        if done.returncode != 0 or not lines:
            raise SystemExit(f"vidur failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return {"batches": int(lines[-1][1]), "simulated_s": float(lines[-1][2])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="folder with the CSVs listed above")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args()
    trace = prepare(args.data, args.cache, args.requests)
    print("WANDB_MODE=disabled HF_HUB_OFFLINE=1 python -m vidur.main \\", file=sys.stdout)
    print("  " + " ".join(vidur_args(args.cache, trace, args.requests)))


if __name__ == "__main__":
    main()
