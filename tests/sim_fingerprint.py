"""A digest of every request's timeline in a simulator run: what fcfs did, independent of metric definitions."""

from __future__ import annotations

import hashlib

import numpy as np

from core.backends.sim import SimBackend, run_to_completion
from core.controller_api import Policy
from core.profile import load_calibration, load_profile
from core.records import RequestRecord
from core.workload import build_load_plan

FINGERPRINT_REQUESTS = 2000


def records_digest(records: list[RequestRecord]) -> str:
    digest = hashlib.sha256()
    for r in sorted(records, key=lambda r: r.request_id):
        fields = (r.request_id, r.status.value, r.arrival_s, r.sent_s, r.end_s, r.output_tokens, r.preemptions)
        digest.update(repr(fields).encode())
        if r.chunk_times is not None:
            digest.update(np.asarray(r.chunk_times, float).tobytes())
        if r.chunk_tokens is not None:
            digest.update(np.asarray(r.chunk_tokens, np.int64).tobytes())
    return digest.hexdigest()[:16]


def run_profile(name: str, policy_factory=None, replicas: int = 1) -> list[RequestRecord]:  # type: ignore[no-untyped-def]
    profile = load_profile(name)
    backend = SimBackend(
        load_calibration(profile), profile.knobs, seed=profile.seed, policy_factory=policy_factory, replicas=replicas
    )
    plan = build_load_plan(profile, seed=profile.seed, requests=min(profile.workload.requests, FINGERPRINT_REQUESTS))
    return run_to_completion(backend, plan).records


def fingerprint_profile(name: str, policy_factory=None) -> dict[str, object]:  # type: ignore[no-untyped-def]
    records = run_profile(name, policy_factory)
    return {"records": len(records), "sha256": records_digest(records)}


class ControlledFcfs(Policy):
    """fcfs through the controller's full bookkeeping (not the fast path): must give the same timelines."""

    name = "fcfs-controlled"
    passthrough = False
