"""The executor options every benchmark that runs many independent simulations takes: the batch CLI's
--workers, --executor and --ray-address (console/cli.py), on the same seam (core/executor.py)."""

from __future__ import annotations

import argparse

from core.executor import EXECUTOR_KINDS, RAY_EXTRA, ExecutorSpec, default_workers, run_tasks

__all__ = ["add_executor_arguments", "describe", "executor_spec", "run_tasks"]


def add_executor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, help="local processes side by side (default: one per CPU; 1: serial)")
    parser.add_argument("--executor", default="local", choices=EXECUTOR_KINDS, help=f"local or ray ({RAY_EXTRA})")
    parser.add_argument("--ray-address", help="--executor ray: the cluster to join (default: start a local Ray)")


def executor_spec(args: argparse.Namespace) -> ExecutorSpec:
    return ExecutorSpec(args.executor, args.workers, args.ray_address)


def describe(spec: ExecutorSpec) -> str:
    if spec.kind == "ray":
        return f"Ray at {spec.ray_address or 'a local Ray'}"
    workers = default_workers() if spec.workers is None else spec.workers
    return f"{workers} local process{'es' if workers > 1 else ''}"
