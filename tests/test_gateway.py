"""The admission gateway (core/gateway/server.py) on real 127.0.0.1 sockets, in front of scripted upstreams.

The upstreams are tests/fakeserver.py's scripted OpenAI server (streams shaped like vLLM's) and, for
non-streamed answers, a few-line aiohttp app. They prove the gateway's plumbing and accounting; the
gateway in front of a real vLLM is tests/test_gateway_live.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from core.control.concurrency_cap import ConcurrencyCapPolicy
from core.controller_api import ControlledRequest, Policy, ReplicaView, Verdict
from core.gateway.protocol import (
    BadGatewayRequest,
    SSETokenCounter,
    parse_event,
    read_request_meta,
    scan_event,
    sent_before_s,
    slo_fields,
)
from core.gateway.server import Gateway, GatewayError
from core.gateway.upstream import probe_upstreams
from core.profile import ProfileError, load_profile
from core.records import RequestSLO, RequestSpec
from tests.fakeserver import FakeOpenAIServer, StreamReply


def completion(max_tokens: int = 4, stream: bool = True, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "fake-model", "prompt": "hello there", "max_tokens": max_tokens, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    body.update(extra)
    return body


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], **kw: Any) -> tuple[int, bytes]:
    async with session.post(url + "/v1/completions", json=body, **kw) as response:
        return response.status, await response.read()


async def until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Wait until `condition()` holds (a loaded machine may take long to deliver the requests); fail after
    `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def assert_accounted(gateway: Gateway, received: int) -> None:
    stats = gateway.stats
    assert stats.received == received
    assert stats.held == 0 and stats.in_flight == 0
    assert stats.completed + stats.rejected + stats.deferred + stats.failed == received
    assert stats.accounted()


def test_streams_through_chunk_by_chunk_and_strips_the_slo_field() -> None:
    async def scenario() -> None:
        async with (
            FakeOpenAIServer(StreamReply(chunk_delay_s=0.02)) as fake,
            Gateway([fake.base_url], Policy()) as gateway,
            aiohttp.ClientSession() as session,
        ):
            body = completion(max_tokens=5, slo={"task": "chat", "e2e_s": 3.0, "request_id": 41})
            arrivals: list[float] = []
            loop = asyncio.get_running_loop()
            async with session.post(gateway.base_url + "/v1/completions", json=body) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/event-stream")
                raw = b""
                async for chunk in response.content.iter_any():
                    arrivals.append(loop.time())
                    raw += chunk
            events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            assert sum(1 for e in events if '"text": " tok"' in e) == 5
            # Chunks arrive spread over the upstream's 4 x 20 ms, not in one piece at the end.
            assert len(arrivals) >= 3 and arrivals[-1] - arrivals[0] > 0.04
            assert "slo" not in fake.bodies[0]
            assert gateway.decisions["41"].outcome == "completed"
            assert gateway.decisions["41"].replica == 0
            assert_accounted(gateway, 1)
            assert gateway.stats.completed == 1

    asyncio.run(scenario())


def test_non_streamed_completion_and_upstream_http_error_pass_through() -> None:
    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        if body["max_tokens"] > 100:
            return web.json_response({"error": {"message": "too long"}}, status=400)
        usage = {"prompt_tokens": 3, "completion_tokens": body["max_tokens"], "total_tokens": 3 + body["max_tokens"]}
        return web.json_response({"choices": [{"text": "x", "finish_reason": "length"}], "usage": usage})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def scenario() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with Gateway([f"http://127.0.0.1:{port}"], Policy()) as gateway, aiohttp.ClientSession() as s:
                status, raw = await post(s, gateway.base_url, completion(max_tokens=7, stream=False))
                assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 7
                status, raw = await post(s, gateway.base_url, completion(max_tokens=500, stream=False))
                assert status == 400 and json.loads(raw)["error"]["message"] == "too long"
                async with s.get(gateway.base_url + "/v1/models") as response:  # proxied to the upstream
                    assert (await response.json())["data"][0]["id"] == "m"
                assert (gateway.stats.completed, gateway.stats.failed) == (1, 1)
                assert_accounted(gateway, 2)
        finally:
            await runner.cleanup()

    asyncio.run(scenario())


def test_per_request_events_only_when_asked_for() -> None:
    async def scenario(request_events: bool) -> list[str]:
        events: list[dict[str, Any]] = []
        async with (
            FakeOpenAIServer(StreamReply()) as fake,
            Gateway([fake.base_url], Policy(), on_event=events.append, request_events=request_events) as gateway,
            aiohttp.ClientSession() as session,
        ):
            for _ in range(3):
                assert (await post(session, gateway.base_url, completion()))[0] == 200
            assert_accounted(gateway, 3)
        return [e["event"] for e in events]

    assert asyncio.run(scenario(True)) == ["gateway_started", *["gateway_request"] * 3, "gateway_stopped"]
    assert asyncio.run(scenario(False)) == ["gateway_started", "gateway_stopped"]


def test_cap_holds_requests_at_the_gateway_and_releases_them_as_slots_free() -> None:
    async def scenario() -> None:
        async with (
            FakeOpenAIServer(StreamReply(first_delay_s=0.05, chunk_delay_s=0.01)) as fake,
            Gateway([fake.base_url], ConcurrencyCapPolicy(cap=2)) as gateway,
        ):
            async with aiohttp.ClientSession() as session:
                results = await asyncio.gather(*(post(session, gateway.base_url, completion()) for _ in range(8)))
            assert [status for status, _ in results] == [200] * 8
            assert fake.max_in_flight == 2  # the cap held the rest at the gateway
            assert gateway.stats.completed == 8
            assert_accounted(gateway, 8)

    asyncio.run(scenario())


def test_rejections_are_429_with_the_reason_and_every_request_is_accounted_for() -> None:
    async def scenario() -> None:
        async with (
            FakeOpenAIServer(StreamReply(first_delay_s=0.1)) as fake,
            Gateway([fake.base_url], ConcurrencyCapPolicy(cap=1, max_queue=2)) as gateway,
        ):
            async with aiohttp.ClientSession() as session:
                results = await asyncio.gather(*(post(session, gateway.base_url, completion()) for _ in range(6)))
            statuses = sorted(status for status, _ in results)
            assert statuses == [200, 200, 200, 429, 429, 429]
            rejected = [json.loads(raw) for status, raw in results if status == 429]
            assert all(r["error"]["type"] == "rejected" and "queue full" in r["error"]["message"] for r in rejected)
            assert (gateway.stats.completed, gateway.stats.rejected) == (3, 3)
            assert_accounted(gateway, 6)

    asyncio.run(scenario())


def test_requests_still_held_at_the_end_are_deferred_and_late_holds_too() -> None:
    async def scenario() -> None:
        # The first request stays at the upstream long enough for the rest to arrive, even on a loaded machine.
        async with FakeOpenAIServer(StreamReply(first_delay_s=2.0)) as fake:
            gateway = Gateway([fake.base_url], ConcurrencyCapPolicy(cap=1))
            await gateway.start()
            async with aiohttp.ClientSession() as session:
                sends = [asyncio.create_task(post(session, gateway.base_url, completion())) for _ in range(4)]
                await until(lambda: gateway.stats.received == 4)
                assert gateway.stats.held == 3 and gateway.stats.in_flight == 1
                assert gateway.end_arrivals() == 3
                late = await post(session, gateway.base_url, completion())  # the slot is still taken: held
                results = [*await asyncio.gather(*sends), late]
            await gateway.stop()
            statuses = sorted(status for status, _ in results)
            assert statuses == [200, 503, 503, 503, 503]
            deferred = [json.loads(raw)["error"] for status, raw in results if status == 503]
            assert all(error["type"] == "deferred" for error in deferred)
            assert (gateway.stats.completed, gateway.stats.deferred) == (1, 4)
            assert_accounted(gateway, 5)

    asyncio.run(scenario())


def test_a_client_that_hangs_up_while_held_counts_as_failed_and_never_reaches_the_upstream() -> None:
    # The first request holds the one slot for 2 s; the second's client gives up after 0.1 s. With a 0.3 s slot
    # the gateway released the second before it saw the hang-up, in a run beside a .ci/run (2026-11-24).
    async def scenario() -> None:
        async with (
            FakeOpenAIServer(StreamReply(first_delay_s=2.0)) as fake,
            Gateway([fake.base_url], ConcurrencyCapPolicy(cap=1)) as gateway,
        ):
            async with aiohttp.ClientSession() as session:
                first = asyncio.create_task(post(session, gateway.base_url, completion()))
                await asyncio.sleep(0.05)
                with pytest.raises(TimeoutError):
                    await post(session, gateway.base_url, completion(), timeout=aiohttp.ClientTimeout(total=0.1))
                assert (await first)[0] == 200
                await asyncio.sleep(0.05)
            assert len(fake.bodies) == 1
            assert (gateway.stats.completed, gateway.stats.failed) == (1, 1)
            assert_accounted(gateway, 2)

    asyncio.run(scenario())


def test_policy_swap_at_runtime_releases_what_the_old_mode_held() -> None:
    async def scenario() -> None:
        async with FakeOpenAIServer(StreamReply(first_delay_s=2.0)) as fake:

            def factory(name: str) -> Policy:
                if name != "fcfs":
                    raise ProfileError(f"mode {name!r} is not available")
                return Policy()

            gateway = Gateway([fake.base_url], ConcurrencyCapPolicy(cap=1), policy_factory=factory)
            async with gateway, aiohttp.ClientSession() as session:
                sends = [asyncio.create_task(post(session, gateway.base_url, completion())) for _ in range(3)]
                await until(lambda: gateway.stats.received == 3 and fake.max_in_flight == 1)
                assert fake.max_in_flight == 1 and gateway.stats.held == 2
                async with session.post(gateway.base_url + "/gateway/policy", json={"mode": "fcfs"}) as response:
                    assert response.status == 200 and (await response.json())["mode"] == "fcfs"
                async with session.post(gateway.base_url + "/gateway/policy", json={"mode": "nope"}) as response:
                    assert response.status == 400
                results = await asyncio.gather(*sends)
                assert [status for status, _ in results] == [200, 200, 200]
                assert fake.max_in_flight == 3  # the held two went out at once under fcfs
                async with session.get(gateway.base_url + "/gateway/stats") as response:
                    stats = await response.json()
                assert stats["mode"] == "fcfs" and stats["policy_swaps"] == 1 and stats["accounted"]
                assert_accounted(gateway, 3)

    asyncio.run(scenario())


def test_spreads_load_over_several_upstreams() -> None:
    async def scenario() -> None:
        reply = StreamReply(first_delay_s=0.1)
        async with (
            FakeOpenAIServer(reply) as one,
            FakeOpenAIServer(reply) as two,
            Gateway([one.base_url, two.base_url], Policy()) as gateway,
        ):
            async with aiohttp.ClientSession() as session:
                await asyncio.gather(*(post(session, gateway.base_url, completion()) for _ in range(6)))
            assert len(one.bodies) == 3 and len(two.bodies) == 3
            assert [u.served for u in gateway.upstreams] == [3, 3]
            assert_accounted(gateway, 6)

    asyncio.run(scenario())


def test_upstream_down_is_a_502_failure_and_the_probe_names_it() -> None:
    async def scenario() -> None:
        async with FakeOpenAIServer() as fake:
            url = fake.base_url
        assert await probe_upstreams([url]) and "ClientConnectorError" in (await probe_upstreams([url]))[0]
        async with Gateway([url], Policy()) as gateway, aiohttp.ClientSession() as session:
            status, raw = await post(session, gateway.base_url, completion())
            assert status == 502 and json.loads(raw)["error"]["type"] == "upstream_error"
            status, _ = await post(session, gateway.base_url, {"prompt": "x", "slo": {"e2e_s": -1}})
            assert status == 400
            assert gateway.stats.failed == 2
            assert_accounted(gateway, 2)

    asyncio.run(scenario())


def test_a_taken_port_is_one_clear_error() -> None:
    async def scenario() -> None:
        async with FakeOpenAIServer() as fake, Gateway([fake.base_url], Policy()) as first:
            with pytest.raises(GatewayError, match="choose another --port"):
                await Gateway([fake.base_url], Policy(), port=first.port).start()

    asyncio.run(scenario())


def test_request_meta_from_headers_body_and_profile() -> None:
    profile = load_profile("saber-w1")
    body = {"prompt": "x" * 40, "max_tokens": 30, "slo": {"task": "code-qna"}}
    meta = read_request_meta({}, body, profile)
    assert "slo" not in body
    assert (meta.task, meta.slo, meta.max_tokens, meta.prompt_tokens) == ("code-qna", RequestSLO(e2e_s=1.0), 30, 10)
    meta = read_request_meta({"x-task": "code-generation", "x-slo-e2e-s": "2.5"}, {"prompt": "x"}, profile)
    assert (meta.task, meta.slo.e2e_s, meta.max_tokens) == ("code-generation", 2.5, 256)
    assert read_request_meta({}, {"prompt": "x"}, profile).slo == RequestSLO(e2e_s=12.0)  # the profile's
    with pytest.raises(BadGatewayRequest, match="x-slo-e2e-s"):
        read_request_meta({"x-slo-e2e-s": "soon"}, {}, profile)
    spec = RequestSpec(7, 10, 20, task="chat", slo=RequestSLO(e2e_s=2.0))
    assert slo_fields(spec) == {"slo": {"task": "chat", "request_id": 7, "e2e_s": 2.0}}
    assert read_request_meta({}, {"prompt": "x", **slo_fields(spec)}, None).client_request_id == "7"


def test_the_slo_counts_from_the_clients_send_when_it_says_when() -> None:
    meta = read_request_meta({"x-slo-sent-at": "1000.25", "x-slo-e2e-s": "2.0"}, {"prompt": "x"}, None)
    assert meta.sent_unix_s == 1000.25
    assert sent_before_s(meta, now_unix_s=1000.75) == pytest.approx(0.5)
    assert sent_before_s(meta, now_unix_s=999.0) == 0.0  # a client clock ahead of ours adds no time
    assert sent_before_s(meta, now_unix_s=1100.0) == 2.0  # nor can a skewed one hold more than its SLO against it
    assert sent_before_s(read_request_meta({}, {"prompt": "x"}, None), now_unix_s=5.0) == 0.0  # not given: 0
    with pytest.raises(BadGatewayRequest, match="x-slo-sent-at"):
        read_request_meta({"x-slo-sent-at": "yesterday"}, {}, None)

    class Recording(Policy):
        def __init__(self) -> None:
            self.seen: list[tuple[float, float]] = []

        def on_arrival(self, req: ControlledRequest, now: float, replicas: Sequence[ReplicaView]) -> Verdict:
            self.seen.append((req.arrival_s, now))
            return super().on_arrival(req, now, replicas)

    async def scenario() -> None:
        policy = Recording()
        async with FakeOpenAIServer(StreamReply()) as fake, Gateway([fake.base_url], policy) as gateway:
            async with aiohttp.ClientSession() as session:
                headers = {"x-slo-sent-at": f"{time.time() - 0.5:.6f}", "x-slo-e2e-s": "3"}
                status, _ = await post(session, gateway.base_url, completion(), headers=headers)
            assert status == 200
        ((arrival, now),) = policy.seen
        assert now - arrival >= 0.5  # the deadline counts from half a second before the gateway saw it

    asyncio.run(scenario())


def test_sse_counter_uses_usage_when_given_and_text_otherwise() -> None:
    counter = SSETokenCounter()
    stream = b'data: {"choices":[{"text":"a"}],"usage":{"completion_tokens":2}}\n\ndata: {"choices":[{"te'
    counter.feed(stream)
    counter.feed(b'xt":"b","finish_reason":"length"}],"usage":{"completion_tokens":5}}\n\ndata: [DONE]\n\n')
    assert (counter.tokens, counter.finished) == (5, True)
    plain = SSETokenCounter()
    plain.feed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: {"choices":[{"delta":{"content":""}}]}\n\n')
    assert (plain.tokens, plain.finished) == (1, False)


# Text the model could write that spells out the keys the scan looks for (it arrives escaped inside a string).
_TRICKY_TEXTS = [
    " tok",
    "",
    '"finish_reason": "stop", "completion_tokens": 7, "text": "a", "content": "b", "error": {}',
    '\\"text\\": "x"',
    "null",
    "caf\u00e9 \n",
]


def _events() -> list[dict[str, Any]]:
    """Stream events shaped like vLLM's completions and chat streams, with and without usage."""
    events: list[dict[str, Any]] = []
    usages: list[Any] = [
        None,
        {"prompt_tokens": 8, "total_tokens": 11, "completion_tokens": 3},
        {"prompt_tokens": 8, "completion_tokens": None},
        {"prompt_tokens": 8, "completion_tokens": 12, "completion_tokens_details": {"reasoning_tokens": 2}},
    ]
    for text in _TRICKY_TEXTS:
        for finish in (None, "length", "stop"):
            for usage in usages:
                completion = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
                events.append({"id": "cmpl-1", "object": "text_completion", "choices": [completion], "usage": usage})
                delta = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
                events.append({"id": "chat-1", "object": "chat.completion.chunk", "choices": [delta], "usage": usage})
        events.append({"choices": [{"delta": {"reasoning_content": text}, "finish_reason": None}]})
        events.append({"choices": [{"delta": {"content": ""}, "logprobs": {"content": [{"token": text}]}}]})
    events.append({"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    events.append({"choices": [{"text": None, "finish_reason": None}]})
    events.append({"choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 40, "total_tokens": 48}})
    return events


def test_the_byte_scan_of_stream_events_agrees_with_parsing_them() -> None:
    checked = 0
    for event in _events():
        for separators in ((",", ":"), (", ", ": ")):  # vLLM's compact JSON and json.dumps' default
            payload = json.dumps(event, separators=separators).encode()
            parsed = parse_event(payload)
            assert isinstance(parsed, tuple)
            assert scan_event(payload) == parsed, payload
            checked += 1
    assert checked > 300
    # A whole stream, cut at arbitrary byte offsets, counts what parsing each event counts.
    payloads = [json.dumps(e, separators=(",", ":")).encode() for e in _events()]
    stream = b"".join(b"data: " + p + b"\n\n" for p in payloads) + b"data: [DONE]\n\n"
    expected = 0
    for p in payloads:
        usage_tokens, has_text, _ = parse_event(p)  # type: ignore[misc]
        expected = usage_tokens if usage_tokens is not None else expected + int(has_text)
    for cut in (7, 64, 1000):
        counter = SSETokenCounter()
        for start in range(0, len(stream), cut):
            counter.feed(stream[start : start + cut])
        assert (counter.tokens, counter.finished, counter.error) == (expected, True, None)
    broken = SSETokenCounter()
    broken.feed(b'data: {"choices":[{"text":"a"}]}\n\ndata: {"error": {"message": "engine died"}}\n\n')
    assert broken.tokens == 1 and broken.error is not None and "engine died" in broken.error


class _InOrderCounter(SSETokenCounter):
    """The counter reading every event in order (what `feed` does for a read holding an "error" key)."""

    def _feed_from_the_end(self, data: bytes, cut: int) -> bool:
        return False


def _counter_state(counter: SSETokenCounter) -> tuple[Any, ...]:
    return (counter.tokens, counter.finished, counter.done, counter.error, counter.at_event_boundary)


def test_reading_a_read_from_its_last_event_back_agrees_with_reading_every_event_in_order() -> None:
    import random

    rng = random.Random(13)
    payloads = [json.dumps(e, separators=(",", ":")).encode() for e in _events()]
    extra_lines = [b": keep-alive comment", b"event: message", b"data:", b'data: "a string"', b"data: [1, 2]"]
    compared = 0
    for trial in range(400):
        lines = [b"data: " + rng.choice(payloads) for _ in range(rng.randint(1, 12))]
        if trial % 3 == 0:  # now and then a line that is not a JSON-object event, anywhere
            lines.insert(rng.randint(0, len(lines)), rng.choice(extra_lines))
        if trial % 2 == 0:
            lines.append(b"data: [DONE]")
        if trial % 5 == 0:  # events after [DONE], and CRLF line ends
            lines.append(b"data: " + rng.choice(payloads))
        end = b"\r\n\r\n" if trial % 7 == 0 else b"\n\n"
        stream = b"".join(line + end for line in lines)
        fast, in_order = SSETokenCounter(), _InOrderCounter()
        cuts = sorted(rng.sample(range(1, len(stream)), k=min(3, len(stream) - 1)))
        for start, stop in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            fast.feed(stream[start:stop])
            in_order.feed(stream[start:stop])
            assert _counter_state(fast) == _counter_state(in_order), stream
            compared += 1
    assert compared > 1000
    # A typical read that got ahead: many vLLM-shaped events with usage, a finish_reason, [DONE].
    burst = b"".join(
        b'data: {"choices":[{"text":" t","finish_reason":%s}],"usage":{"completion_tokens":%d}}\n\n'
        % (b'"length"' if i == 15 else b"null", i + 1)
        for i in range(16)
    )
    counter = SSETokenCounter()
    counter.feed(burst + b"data: [DONE]\n\n")
    assert (counter.tokens, counter.finished, counter.done) == (16, True, True)


def test_a_client_that_hangs_up_before_its_body_is_read_counts_as_failed() -> None:
    async def scenario() -> None:
        async with FakeOpenAIServer(StreamReply()) as fake, Gateway([fake.base_url], Policy()) as gateway:
            _reader, writer = await asyncio.open_connection(gateway.host, gateway.port)
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 1000\r\n\r\n{"prompt":'
            )
            await writer.drain()
            await until(lambda: gateway.stats.reading == 1)
            assert gateway.stats.open() == 1  # received, not yet ended: still accounted
            assert gateway.stats.accounted()
            writer.close()
            await until(lambda: gateway.stats.failed == 1)
            assert fake.bodies == []
            assert_accounted(gateway, 1)
            assert gateway.stats.reading == 0

    asyncio.run(scenario())


def test_settle_waits_for_the_gateway_to_end_a_stream_its_client_has_already_read() -> None:
    # The gateway ends the client's response at the last event, and its own request when the upstream's body
    # ends (0.5 s later here): `settle` is what an embedded run waits on before taking its account.
    async def scenario() -> None:
        async with (
            FakeOpenAIServer(StreamReply(tail_delay_s=0.5)) as fake,
            Gateway([fake.base_url], Policy()) as gateway,
            aiohttp.ClientSession() as session,
        ):
            status, body = await post(session, gateway.base_url, completion())
            assert status == 200 and b"[DONE]" in body
            assert gateway.stats.in_flight == 1 and gateway.stats.completed == 0
            assert not await gateway.settle(0.05)
            assert await gateway.settle(5.0)
            assert_accounted(gateway, 1)
            assert gateway.stats.completed == 1

    asyncio.run(scenario())
