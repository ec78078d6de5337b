"""vLLM replicas the gateway owns (`slo-console gateway --launch`): started from the profile's `server:`
section, and swapped for one with other flags without downtime (issue 23 item 2).

vLLM's flags (max_num_seqs, ...) cannot change on a running server (paper 000 sec. II-B says as much). A
swap therefore runs a second server beside the first: start it with the new flags, wait until it serves,
route new requests to it (`AdmissionController.add_upstream`), stop routing to the old one
(`retire_upstream`), let what the old one serves finish there, then stop it. No request is cut: a request
at the old replica ends there, a held one is released to the new one, and the gateway's account closes
throughout. Each server runs in its own process group under the supervisor (core/serve/supervise.py), so
a gateway killed by SIGKILL leaves no vLLM behind.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from core.events import EventSink, make_event
from core.gateway.admission import AdmissionController
from core.profile import KnobsSpec, Profile
from core.serve.vllm_server import VllmServer

DRAIN_POLL_S = 0.05


class LaunchedReplicas:
    """The servers behind a `--launch` gateway, by the gateway's upstream index."""

    def __init__(
        self,
        profile: Profile,
        *,
        python: str | None = None,
        sink: EventSink | None = None,
        drain_timeout_s: float = 600.0,
    ) -> None:
        self.profile = profile
        self.python = python
        self.sink = sink
        self.drain_timeout_s = drain_timeout_s
        self.servers: dict[int, VllmServer] = {}
        self.knobs: dict[int, KnobsSpec] = {}
        self.swaps = 0

    async def _start(self, knobs: KnobsSpec) -> VllmServer:
        server = VllmServer(self.profile.server, knobs, python=self.python)
        process = await asyncio.to_thread(server.prepare, knobs)
        try:
            await asyncio.to_thread(process.start)
        except BaseException:
            await asyncio.to_thread(process.stop)
            raise
        self._emit("replica_started", url=server.base_url, pid=process.pid, max_num_seqs=knobs.max_num_seqs)
        return server

    async def start_first(self, knobs: KnobsSpec | None = None) -> str:
        """Start the first replica (before the gateway serves); returns its URL, upstream 0."""
        knobs = knobs or self.profile.knobs
        self.servers[0] = await self._start(knobs)
        self.knobs[0] = knobs
        return self.servers[0].base_url

    def current_knobs(self, gateway: AdmissionController) -> KnobsSpec:
        return self.knobs[gateway.routable[0].index]

    async def swap(self, gateway: AdmissionController, knobs: KnobsSpec) -> None:
        """Replace the routable replica with one started with `knobs`; returns once the old one has stopped."""
        began = time.perf_counter()
        old = gateway.routable[0].index
        server = await self._start(knobs)
        upstream = gateway.add_upstream(server.base_url)
        self.servers[upstream.index] = server
        self.knobs[upstream.index] = knobs
        gateway.retire_upstream(old)
        ready_s = time.perf_counter() - began
        deadline = time.perf_counter() + self.drain_timeout_s
        while gateway.upstreams[old].load and time.perf_counter() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        left = gateway.upstreams[old].load  # past the drain timeout these end failed when the server stops
        await asyncio.to_thread(self.servers.pop(old).stop)
        self.knobs.pop(old, None)
        self.swaps += 1
        self._emit(
            "replica_swap",
            old=old,
            new=upstream.index,
            url=upstream.url,
            max_num_seqs=knobs.max_num_seqs,
            ready_s=ready_s,
            swap_s=time.perf_counter() - began,
            cut_in_flight=left,
        )

    async def close(self) -> None:
        for index in list(self.servers):
            await asyncio.to_thread(self.servers.pop(index).stop)

    def _emit(self, name: str, **fields: Any) -> None:
        if self.sink is not None:
            self.sink(make_event(name, **fields))
