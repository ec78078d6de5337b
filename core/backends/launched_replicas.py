"""vLLM replicas the gateway owns (`slo-console gateway --launch`): started from the profile's `server:`
section, and swapped for one with other flags without downtime (issue 23 item 2).

vLLM's flags (max_num_seqs, ...) cannot change on a running server (paper 000 sec. II-B says as much). A
swap therefore runs a second server beside the first: start it with the new flags, wait until it serves,
route new requests to it (`AdmissionController.add_upstream`), stop routing to the old one
(`retire_upstream`), let what the old one serves finish there, then stop it. No request is cut: a request
at the old replica ends there, a held one is released to the new one, and the gateway's account closes
throughout. Each server runs in its own process group under the supervisor (core/serve/supervise.py), so
a gateway killed by SIGKILL leaves no vLLM behind.

The same swap answers an operator's POST /gateway/swap (`swap_knobs`, e.g. the console's "restart with these
knobs" when this gateway fronts the server); one swap runs at a time.

On vLLM's CPU build the two servers of a swap run on disjoint cores (core/serve/cpu_binding.py): the first
replica binds its OpenMP threads to slot 0 of the machine's cores, each swap's new replica to the slot the old
one does not use, so the new one starts beside the serving one instead of behind it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import ValidationError

from core.events import EventSink, make_event
from core.gateway.admission import AdmissionController
from core.gateway.server import Gateway, SwapRefused
from core.profile import KnobsSpec, Profile, ProfileError
from core.serve.cpu_binding import other_slot, replica_core_slots
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
        self.core_slots = replica_core_slots()  # None below 2 cores: vLLM binds as it likes
        self.slots: dict[int, int] = {}  # upstream index -> its slot of core_slots
        self.swaps = 0
        self.swapping = False  # a swap is under way (the tuner's or an operator's): no second one starts

    async def _start(self, knobs: KnobsSpec, slot: int) -> VllmServer:
        cores = self.core_slots[slot] if self.core_slots is not None else None
        server = VllmServer(self.profile.server, knobs, python=self.python, omp_cores=cores)
        process = await asyncio.to_thread(server.prepare, knobs)
        try:
            await asyncio.to_thread(process.start)
        except BaseException:
            await asyncio.to_thread(process.stop)
            raise
        self._emit(
            "replica_started", url=server.base_url, pid=process.pid, max_num_seqs=knobs.max_num_seqs, cores=cores
        )
        return server

    async def start_first(self, knobs: KnobsSpec | None = None) -> str:
        """Start the first replica (before the gateway serves) on core slot 0; returns its URL, upstream 0."""
        knobs = knobs or self.profile.knobs
        self.servers[0] = await self._start(knobs, slot=0)
        self.knobs[0] = knobs
        self.slots[0] = 0
        return self.servers[0].base_url

    def current_knobs(self, gateway: AdmissionController) -> KnobsSpec:
        return self.knobs[gateway.routable[0].index]

    def edited_knobs(self, gateway: AdmissionController, update: dict[str, Any]) -> KnobsSpec:
        """The knobs in force with `update` ({"max_num_seqs": 8, ...}) applied; ProfileError (one line) if invalid."""
        try:
            return KnobsSpec.model_validate({**self.current_knobs(gateway).model_dump(), **update})
        except ValidationError as exc:
            problem = exc.errors()[0]
            field = ".".join(str(part) for part in problem["loc"]) or "knobs"
            fix = 'post valid knobs, e.g. {"max_num_seqs": 8}'
            raise ProfileError(f"knob {field}: {problem['msg']}; {fix}") from None

    def answer_swaps(self, gateway: Gateway) -> None:
        """Let POST /gateway/swap on `gateway` swap these servers (with --tune the online tuner answers it
        instead: core/tune/online_gateway.py)."""

        async def swap(update: dict[str, Any]) -> dict[str, Any]:
            return await self.swap_knobs(gateway, self.edited_knobs(gateway, update))

        gateway.replica_swap = swap

    async def swap_knobs(self, gateway: AdmissionController, knobs: KnobsSpec) -> dict[str, Any]:
        """An operator's swap (POST /gateway/swap): to `knobs` unless those are in force already (a server flag
        differs; `concurrency` is the gateway's cap, no flag). Returns the knobs in force after it."""
        if self.swapping:
            raise SwapRefused("a replica swap is under way; ask again when it is done")
        current = self.current_knobs(gateway)
        if current.model_dump(exclude={"concurrency"}) != knobs.model_dump(exclude={"concurrency"}):
            await self.swap(gateway, knobs)
        return self.current_knobs(gateway).model_dump()

    async def swap(self, gateway: AdmissionController, knobs: KnobsSpec) -> None:
        """Replace the routable replica with one started with `knobs`; returns once the old one has stopped."""
        self.swapping = True
        try:
            await self._swap(gateway, knobs)
        finally:
            self.swapping = False

    async def _swap(self, gateway: AdmissionController, knobs: KnobsSpec) -> None:
        began = time.perf_counter()
        old = gateway.routable[0].index
        slot = other_slot(self.slots[old])
        server = await self._start(knobs, slot)
        upstream = gateway.add_upstream(server.base_url)
        self.servers[upstream.index] = server
        self.knobs[upstream.index] = knobs
        self.slots[upstream.index] = slot
        gateway.retire_upstream(old)
        ready_s = time.perf_counter() - began
        deadline = time.perf_counter() + self.drain_timeout_s
        while gateway.upstreams[old].load and time.perf_counter() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        left = gateway.upstreams[old].load  # past the drain timeout these end failed when the server stops
        await asyncio.to_thread(self.servers.pop(old).stop)
        self.knobs.pop(old, None)
        self.slots.pop(old, None)
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
