"""A replica swap at the gateway (core/gateway/admission.py add_upstream / retire_upstream) under steady load,
in front of scripted upstreams: new requests go to the new replica, the old one drains, nothing fails, and
the account closes at every instant (received = ended + reading + held + in flight)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from core.control.concurrency_cap import ConcurrencyCapPolicy
from core.gateway.server import Gateway
from tests.fakeserver import FakeOpenAIServer, StreamReply
from tests.test_gateway import assert_accounted, completion, post, until


def test_a_replica_swap_under_steady_load_drops_nothing_and_the_account_closes_at_every_instant() -> None:
    async def scenario() -> None:
        reply = StreamReply(first_delay_s=0.05, chunk_delay_s=0.02)
        async with (
            FakeOpenAIServer(reply) as old,
            FakeOpenAIServer(reply) as new,
            Gateway([old.base_url], ConcurrencyCapPolicy(cap=2)) as gateway,
        ):
            audits: list[bool] = []
            stop = asyncio.Event()

            async def audit() -> None:
                while not stop.is_set():
                    audits.append(gateway.stats.accounted())
                    await asyncio.sleep(0.002)

            auditor = asyncio.create_task(audit())
            async with aiohttp.ClientSession() as session:

                async def steady(count: int) -> list[tuple[int, bytes]]:
                    tasks = []
                    for _ in range(count):
                        tasks.append(asyncio.create_task(post(session, gateway.base_url, completion())))
                        await asyncio.sleep(0.01)
                    return await asyncio.gather(*tasks)

                load = asyncio.create_task(steady(60))
                await until(lambda: gateway.stats.received >= 20 and gateway.upstreams[0].load > 0)
                gateway.add_upstream(new.base_url)
                gateway.retire_upstream(0)
                served_by_old = gateway.upstreams[0].served + gateway.upstreams[0].load
                results = await load
            stop.set()
            await auditor
            assert [status for status, _ in results] == [200] * 60
            assert gateway.stats.failed == 0 and gateway.stats.completed == 60
            assert_accounted(gateway, 60)
            assert audits and all(audits)
            old_upstream, new_upstream = gateway.upstreams
            assert old_upstream.retired and old_upstream.load == 0
            assert old_upstream.served == served_by_old  # nothing new reached the old replica after the swap
            assert new_upstream.served == 60 - served_by_old > 0

    asyncio.run(scenario())


def test_the_last_routable_upstream_cannot_be_retired() -> None:
    async def scenario() -> None:
        async with (
            FakeOpenAIServer(StreamReply()) as fake,
            Gateway([fake.base_url], ConcurrencyCapPolicy(cap=2)) as gateway,
        ):
            with pytest.raises(ValueError, match="last routable upstream"):
                gateway.retire_upstream(0)

    asyncio.run(scenario())
