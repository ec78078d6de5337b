"""`VllmBackend` (`--backend vllm`): launch and manage a local vLLM, then drive it like any live server.

It composes two parts: `core.serve.vllm_server.VllmServer` (knobs -> flags, process group, readiness,
crash watch, clean stop) and `core.backends.live.UrlBackend` (streaming load client and /metrics
sampling). The server starts on the first run with the profile's knobs and is reused by later runs until
`restart(knobs)` (the tuner's move between segments) or `close()`.

A server that dies mid-run is seen twice: the client's liveness check stops sending and counts the
requests that were lost as failed records, and the process watcher reports `crashed` with vLLM's exit
status and the telling line of its log; both end up in `RunOutcome.notes`. The next run (or an explicit
`restart()`) starts a fresh server.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from core.backend_api import BackendUnavailable, LoadPlan, RunObserver, RunOutcome
from core.backends.live import UrlBackend
from core.profile import KnobsSpec, Profile, ServerSpec
from core.serve.process import ServerState, StateCallback
from core.serve.server_log import telling_log_line
from core.serve.vllm_server import VllmServer


class VllmBackend:
    """A vLLM this process starts, restarts with new knobs, and stops (nothing is left running)."""

    name = "vllm"

    def __init__(
        self,
        server: ServerSpec | None = None,
        knobs: KnobsSpec | None = None,
        *,
        python: str | None = None,
        on_state: StateCallback | None = None,
        log_dir: Path | None = None,
        speculation_extra: dict[str, object] | None = None,
        **client_options: Any,
    ) -> None:
        """`client_options` go to `UrlBackend` (api, request_timeout_s, metrics_interval_s, ignore_eos...);
        `speculation_extra`: more --speculative-config keys (a mode's, e.g. AdaServe's schedule)."""
        self.server = VllmServer(
            server, knobs, python=python, on_state=on_state, log_dir=log_dir, speculation_extra=speculation_extra
        )
        self.client_options = client_options
        self.client: UrlBackend | None = None
        self.runs = 0

    @classmethod
    def from_profile(cls, profile: Profile, **options: Any) -> VllmBackend:
        return cls(profile.server, profile.knobs, **options)

    @property
    def knobs(self) -> KnobsSpec:
        return self.server.knobs

    @property
    def base_url(self) -> str:
        return self.server.base_url

    # ------------------------------------------------------------ lifecycle

    async def start(self, knobs: KnobsSpec | None = None) -> None:
        """Start vLLM with `knobs` and wait until it serves. Raises BackendUnavailable (one line) or
        UnsupportedKnob (a ProfileError) before anything starts."""
        process = await asyncio.to_thread(self.server.prepare, knobs)
        try:
            await asyncio.to_thread(process.start)
        except BaseException:
            # Cancelled (Ctrl-C) while the thread still waits for readiness: make it give up and clean up.
            await asyncio.to_thread(process.stop)
            raise
        self.client = UrlBackend(process.base_url, self.server.served_model_name, **self.client_options)

    async def restart(self, knobs: KnobsSpec | None = None) -> None:
        """Stop and start with new knobs (a new port, a new log file)."""
        if knobs is not None:
            await asyncio.to_thread(self.server.command, knobs)  # refuse a bad knob before stopping
        await self.stop()
        await self.start(knobs)

    async def stop(self) -> None:
        await asyncio.to_thread(self.server.stop)
        self.client = None

    async def close(self) -> None:
        await self.stop()

    async def __aenter__(self) -> VllmBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _needs_start(self) -> bool:
        process = self.server.process
        return self.client is None or process is None or process.state is not ServerState.READY

    # ------------------------------------------------------------ running

    async def run(self, plan: LoadPlan, observer: RunObserver | None = None) -> RunOutcome:
        if self._needs_start():
            await self.start()
        assert self.client is not None and self.server.process is not None
        process = self.server.process
        self.runs += 1
        outcome = await self.client.run(plan, observer)
        if process.state is ServerState.READY and "server_lost" in outcome.notes:
            # The client saw the server go; give the watcher a moment to read the exit status.
            await asyncio.to_thread(process.wait_crashed, 2.0)
        outcome.notes["vllm"] = {
            "state": str(process.state),
            "knobs": self.server.knobs.model_dump(),
            "argv": process.argv,
            "startup_s": process.startup_s,
            "log_path": str(process.log_path) if process.log_path else None,
        }
        if process.state is ServerState.CRASHED:
            outcome.notes["vllm"].update(
                returncode=process.returncode,
                crash=process.state_detail,
                log_line=telling_log_line(process.log_tail()),
            )
        return outcome

    def describe(self) -> dict[str, Any]:
        """Engine, version, model, knobs, argv and hardware; probes vLLM (not starting it) if needed."""
        try:
            self.server.install()
        except BackendUnavailable as exc:
            return {"backend": self.name, "engine": "vllm", "available": False, "error": str(exc)}
        facts = {"backend": self.name, **self.server.describe()}
        if self.client is not None and self.server.is_running():
            client_facts = self.client.describe()
            facts["max_model_len"] = client_facts.get("max_model_len")
            facts["api"] = client_facts.get("api")
        return facts
