"""vLLM replicas the gateway owns (`slo-console gateway --launch`): started from the profile's `server:`
section, and swapped for one with other flags without downtime (issue 23 item 2).

vLLM's flags (max_num_seqs, ...) cannot change on a running server (paper 000 sec. II-B says as much). A
swap therefore runs a second server beside the first: start it with the new flags, wait until it serves,
route new requests to it (`AdmissionController.add_upstream`), stop routing to the old one
(`retire_upstream`), let what the old one serves finish there, then stop it. No request is cut: a request
at the old replica ends there, a held one is released to the new one, and the gateway's account closes
throughout. Each server runs in its own process group under the supervisor (core/serve/supervise.py), so
a gateway killed by SIGKILL leaves no vLLM behind.

Where two servers cannot fit (GPU memory: the gateway was told so, `one_at_a_time`, or the second server's
start failed for lack of memory, `out_of_memory`), a swap is a drain-and-restart instead: the gateway pauses
(`AdmissionController.pause`: arrivals wait at the gateway in arrival order, nothing is released), the old
server finishes what it serves and stops, the new one starts, and the gateway resumes: what it held goes to
the new server in order. Nothing is dropped or failed; the pause is the price (`paused_s` and `held` in the
`replica_swap` event). A new server that does not start is replaced by the old flags again (the swap then
raises, as a failed side-by-side start does).

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
from core.gateway.admission import AdmissionController, Upstream
from core.gateway.server import Gateway, SwapRefused
from core.profile import KnobsSpec, Profile, ProfileError
from core.serve.cpu_binding import other_slot, replica_core_slots
from core.serve.vllm_server import VllmServer

DRAIN_POLL_S = 0.05
SIDE_BY_SIDE = "side-by-side"
DRAIN_AND_RESTART = "drain-and-restart"
# What a server's failed start says when the GPU had no room for it (PyTorch's CUDA allocator, vLLM's KV-cache
# sizing): lower case, matched in the error and its log's last lines.
OUT_OF_MEMORY_MARKERS = (
    "out of memory",
    "no available memory for the cache blocks",
    "not enough memory",
    "insufficient memory",
)


def out_of_memory(error: BaseException) -> bool:
    """Did this start fail for lack of (GPU) memory? Then a second server beside the first cannot fit."""
    lines = [str(error), *(getattr(error, "log_tail", None) or [])]
    return any(marker in line.lower() for line in lines for marker in OUT_OF_MEMORY_MARKERS)


class LaunchedReplicas:
    """The servers behind a `--launch` gateway, by the gateway's upstream index."""

    def __init__(
        self,
        profile: Profile,
        *,
        python: str | None = None,
        sink: EventSink | None = None,
        drain_timeout_s: float = 600.0,
        one_at_a_time: bool = False,
    ) -> None:
        self.profile = profile
        # Two servers do not fit (GPU memory): swaps drain and restart, with arrivals held at the gateway. Set
        # by the operator (--one-replica), or after a side-by-side start failed for lack of memory.
        self.one_at_a_time = one_at_a_time
        self.python = python
        self.sink = sink
        self.drain_timeout_s = drain_timeout_s
        self.servers: dict[int, VllmServer] = {}
        self.knobs: dict[int, KnobsSpec] = {}
        self.core_slots = replica_core_slots()  # None below 2 cores: vLLM binds as it likes
        self.slots: dict[int, int] = {}  # upstream index -> its slot of core_slots
        self.swaps = 0
        self.last_swap: dict[str, Any] = {}  # the last swap's replica_swap event fields (paused_s, held, ...)
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
        if self.one_at_a_time:
            await self._drain_and_restart(gateway, knobs)
            return
        began = time.perf_counter()
        old = gateway.routable[0].index
        slot = other_slot(self.slots[old])
        try:
            server = await self._start(knobs, slot)
        except Exception as exc:
            if not out_of_memory(exc):
                raise
            # The second server did not fit beside the first: from now on one at a time.
            self.one_at_a_time = True
            self._emit("replica_one_at_a_time", reason=f"a second server did not fit: {exc}")
            await self._drain_and_restart(gateway, knobs)
            return
        upstream = self._route_to(gateway, server, knobs, slot)
        gateway.retire_upstream(old)
        ready_s = time.perf_counter() - began
        left = await self._drain(gateway, old)  # past the drain timeout these end failed when the server stops
        await self._stop(old)
        self.swaps += 1
        self._emit_swap(old, upstream, knobs, began, ready_s, left, SIDE_BY_SIDE)

    def _route_to(self, gateway: AdmissionController, server: VllmServer, knobs: KnobsSpec, slot: int) -> Upstream:
        """A started server becomes a routable upstream of the gateway."""
        upstream = gateway.add_upstream(server.base_url)
        self.servers[upstream.index] = server
        self.knobs[upstream.index] = knobs
        self.slots[upstream.index] = slot
        return upstream

    async def _stop(self, index: int) -> None:
        await asyncio.to_thread(self.servers.pop(index).stop)
        self.knobs.pop(index, None)
        self.slots.pop(index, None)

    def _emit_swap(
        self,
        old: int,
        upstream: Upstream,
        knobs: KnobsSpec,
        began: float,
        ready_s: float,
        left: int,
        how: str,
        paused_s: float = 0.0,
        held: int = 0,
        error: str | None = None,
    ) -> None:
        self._emit(
            "replica_swap",
            old=old,
            new=upstream.index,
            url=upstream.url,
            max_num_seqs=knobs.max_num_seqs,
            ready_s=ready_s,
            swap_s=time.perf_counter() - began,
            cut_in_flight=left,
            how=how,
            paused_s=paused_s,
            held=held,
            error=error,
        )

    async def _drain(self, gateway: AdmissionController, index: int) -> int:
        """Wait until upstream `index` serves nothing (at most the drain timeout); returns what it still serves."""
        deadline = time.perf_counter() + self.drain_timeout_s
        while gateway.upstreams[index].load and time.perf_counter() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        return gateway.upstreams[index].load

    async def _drain_and_restart(self, gateway: AdmissionController, knobs: KnobsSpec) -> None:
        """The swap where two servers cannot fit (module docstring): pause the gateway, drain and stop the old
        server, start the new one on the same cores, resume. If the new one does not start, the old flags are
        started again (the gateway resumes on that server) and the error is raised."""
        began = time.perf_counter()
        old = gateway.routable[0].index
        slot = self.slots[old]
        old_knobs = self.knobs[old]
        gateway.pause()
        try:
            left = await self._drain(gateway, old)  # past the drain timeout these end failed when it stops
            await self._stop(old)
            failure: Exception | None = None
            try:
                server = await self._start(knobs, slot)
            except Exception as exc:
                failure, knobs = exc, old_knobs
                server = await self._start(old_knobs, slot)  # no server is up: the old flags again
            upstream = self._route_to(gateway, server, knobs, slot)
            gateway.retire_upstream(old)
        finally:
            paused_s = time.perf_counter() - began
            held = gateway.resume()
        self.swaps += failure is None
        error = None if failure is None else str(failure)
        self._emit_swap(old, upstream, knobs, began, paused_s, left, DRAIN_AND_RESTART, paused_s, held, error)
        if failure is not None:
            raise failure

    async def close(self) -> None:
        for index in list(self.servers):
            await asyncio.to_thread(self.servers.pop(index).stop)

    def _emit(self, name: str, **fields: Any) -> None:
        if name == "replica_swap":
            self.last_swap = fields
        if self.sink is not None:
            self.sink(make_event(name, **fields))
