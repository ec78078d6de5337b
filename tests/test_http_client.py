"""The per-request streaming client against an in-process server on a real loopback socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest

from core.backends.http_client import PromptBuilder, StreamingClient, load_token_counter
from core.records import RequestRecord, RequestSpec, Status
from tests.fakeserver import ErrorReply, FakeOpenAIServer, HangReply, Reply, StreamReply


def spec(request_id: int = 1, prompt_tokens: int = 16, output_tokens: int = 5) -> RequestSpec:
    return RequestSpec(request_id=request_id, prompt_tokens=prompt_tokens, output_tokens=output_tokens)


@contextlib.asynccontextmanager
async def raw_completions_server(completions: Any) -> AsyncIterator[int]:
    """An aiohttp app serving `completions` at /v1/completions on a free loopback port (yields the port), for
    replies the scripted fake server cannot shape (bytes split across writes, a late end of body)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def send_one(reply: Reply, *, api: str = "completions", **client_kwargs: object):
    """Start a server with one scripted reply, send one request, return (record, server)."""
    async with FakeOpenAIServer(reply=reply) as server, aiohttp.ClientSession() as http:
        client = StreamingClient(http, server.base_url, server.model, api=api, **client_kwargs)  # type: ignore[arg-type]
        start = time.perf_counter()
        record = await client.send(spec(), start)
        return record, server


async def test_normal_stream_records_one_timestamp_per_chunk() -> None:
    record, server = await send_one(StreamReply(first_delay_s=0.05, chunk_delay_s=0.02))

    assert record.status is Status.OK, record.error
    assert record.output_tokens == 5
    assert record.chunk_tokens is None  # one token per chunk
    assert record.chunk_times is not None and len(record.chunk_times) == 5
    gaps = np.diff(record.chunk_times)
    assert np.all(gaps >= 0.015), gaps  # each chunk is stamped when it arrives, not when the stream ends
    assert record.ttft_s is not None and record.ttft_s >= 0.045
    assert record.e2e_s is not None and record.ttft_s < record.e2e_s
    assert record.end_s is not None and record.end_s >= record.chunk_times[-1]
    assert record.prompt_tokens == 7  # the server's usage count wins over the spec's nominal length
    body = server.bodies[0]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["max_tokens"] == 5
    assert body["ignore_eos"] is True
    assert body["temperature"] == 0
    assert body["model"] == server.model
    assert isinstance(body["prompt"], str)


async def test_chat_api_sends_messages_and_skips_the_role_chunk() -> None:
    record, server = await send_one(StreamReply(), api="chat")

    assert record.status is Status.OK, record.error
    assert record.output_tokens == 5
    assert record.chunk_times is not None and len(record.chunk_times) == 5  # no chunk for the role delta
    body = server.bodies[0]
    assert body["messages"][0]["role"] == "user"
    assert "prompt" not in body


async def test_multi_token_chunks_count_all_their_tokens_from_per_chunk_usage() -> None:
    record, _ = await send_one(StreamReply(chunk_tokens=[1, 3, 2]))

    assert record.status is Status.OK, record.error
    assert record.output_tokens == 6
    assert record.chunk_tokens is not None and record.chunk_tokens.tolist() == [1, 3, 2]
    assert len(record.token_times()) == 6


async def test_without_per_chunk_usage_the_remainder_goes_on_the_last_chunk() -> None:
    record, _ = await send_one(StreamReply(chunk_tokens=[1, 3, 2], usage_per_chunk=False))

    assert record.status is Status.OK, record.error
    assert record.output_tokens == 6  # from the closing usage chunk
    assert record.chunk_tokens is not None and record.chunk_tokens.tolist() == [1, 1, 4]


async def test_a_token_with_empty_text_still_counts_when_usage_is_per_chunk() -> None:
    record, _ = await send_one(StreamReply(empty_text_chunks=frozenset({4})))

    assert record.output_tokens == 5
    assert record.chunk_times is not None and len(record.chunk_times) == 5


async def test_ignore_eos_and_continuous_usage_can_be_turned_off() -> None:
    record, server = await send_one(StreamReply(), ignore_eos=False, continuous_usage=False)

    assert record.status is Status.OK
    assert "ignore_eos" not in server.bodies[0]
    assert server.bodies[0]["stream_options"] == {"include_usage": True}


async def test_malformed_sse_json_fails_the_request_and_keeps_what_arrived() -> None:
    record, _ = await send_one(StreamReply(malformed_after=2))

    assert record.status is Status.ERROR
    assert record.error is not None and record.error.startswith("malformed SSE JSON")
    assert "unterminated" in record.error
    assert record.chunk_times is not None and len(record.chunk_times) == 2
    assert record.end_s is not None


async def test_mid_stream_disconnect_is_a_broken_stream() -> None:
    record, _ = await send_one(StreamReply(disconnect_after=3))

    assert record.status is Status.ERROR
    assert record.error is not None and record.error.startswith("stream broken")
    assert record.output_tokens == 3


async def test_error_object_inside_the_stream_fails_the_request() -> None:
    record, _ = await send_one(StreamReply(error_after=1))

    assert record.status is Status.ERROR
    assert record.error == "server error in stream: engine died"


async def test_a_missing_done_is_tolerated_after_a_finish_reason() -> None:
    record, _ = await send_one(StreamReply(send_done=False, final_usage=False))

    assert record.status is Status.OK, record.error
    assert record.output_tokens == 5


async def test_a_stream_closed_cleanly_before_finishing_is_an_error() -> None:
    record, _ = await send_one(StreamReply(end_after=2))

    assert record.status is Status.ERROR
    assert record.error == "stream ended before [DONE] or a finish_reason"
    assert record.output_tokens == 2


async def test_stalled_request_times_out() -> None:
    started = time.perf_counter()
    record, _ = await send_one(HangReply(), request_timeout_s=0.3)

    assert record.status is Status.TIMEOUT
    assert record.error is not None and "0.3 s" in record.error
    assert time.perf_counter() - started < 2.0


async def test_slow_stream_times_out_on_the_total_deadline() -> None:
    record, _ = await send_one(StreamReply(chunk_delay_s=0.1), request_timeout_s=0.25)

    assert record.status is Status.TIMEOUT
    assert record.chunk_times is not None and 1 <= len(record.chunk_times) < 5


@pytest.mark.parametrize("status", [400, 404, 500, 503])
async def test_http_errors_carry_status_and_a_short_body(status: int) -> None:
    record, _ = await send_one(ErrorReply(status, '{"error": {"message": "' + "x" * 500 + '"}}'))

    assert record.status is Status.ERROR
    assert record.error is not None and record.error.startswith(f"HTTP {status}: {{")
    assert len(record.error) < 260


async def test_connection_refused_is_an_error_record() -> None:
    async with FakeOpenAIServer() as server:
        url = server.base_url
    async with aiohttp.ClientSession() as http:
        record = await StreamingClient(http, url, "m").send(spec(), time.perf_counter())

    assert record.status is Status.ERROR
    assert record.error is not None and record.error.startswith("connection failed: ClientConnectorError")


async def test_a_connect_timeout_says_so_rather_than_blaming_the_response() -> None:
    # A server that never accepts, its accept queue full: the next connect waits for a SYN that is dropped.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=0.3)
        async with aiohttp.ClientSession(timeout=timeout) as http:
            client = StreamingClient(http, f"http://127.0.0.1:{port}", "m", request_timeout_s=60.0)
            record = await client.send(spec(), time.perf_counter())
    finally:
        for sock in [*fillers, listener]:
            sock.close()

    assert record.status is Status.TIMEOUT
    assert record.error is not None and record.error.startswith("could not connect: ConnectionTimeoutError")
    assert "60 s" not in record.error


async def test_transport_errors_are_reported_to_the_hook() -> None:
    seen: list[BaseException] = []
    async with FakeOpenAIServer(reply=StreamReply(disconnect_after=1)) as server, aiohttp.ClientSession() as http:
        client = StreamingClient(http, server.base_url, "m", on_transport_error=seen.append)
        await client.send(spec(), time.perf_counter())

    assert len(seen) == 1 and isinstance(seen[0], aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError)


async def test_cancellation_records_cancelled_and_propagates() -> None:
    async with FakeOpenAIServer(reply=StreamReply(chunk_delay_s=0.5)) as server, aiohttp.ClientSession() as http:
        client = StreamingClient(http, server.base_url, "m")
        record = RequestRecord.from_spec(spec())
        task = asyncio.create_task(client.send(spec(), time.perf_counter(), record))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    assert record.status is Status.CANCELLED
    assert record.end_s is not None
    assert record.chunk_times is not None and len(record.chunk_times) == 1


async def test_times_are_on_the_run_clock() -> None:
    async with FakeOpenAIServer() as server, aiohttp.ClientSession() as http:
        run_start = time.perf_counter() - 10.0  # the run started ten seconds ago
        record = await StreamingClient(http, server.base_url, "m").send(spec(), run_start)

    assert 10.0 <= record.arrival_s < 11.0
    assert record.chunk_times is not None and np.all(record.chunk_times >= record.arrival_s)


# -- prompts ------------------------------------------------------------------------------------------


def test_prompt_builder_reaches_the_token_count_with_a_counter() -> None:
    def count(text: str) -> int:
        return (len(text) + 3) // 4  # a stand-in tokenizer: one token per four characters

    builder = PromptBuilder(count)
    for n_tokens in (1, 10, 100, 1000):
        text = builder.body(n_tokens)
        assert n_tokens <= count(text) <= n_tokens + 3  # the shortest word sequence that reaches n
    assert builder.tokenizer_aware


def test_prompt_builder_is_deterministic_cached_and_salted() -> None:
    builder = PromptBuilder()
    assert builder.body(50) is builder.body(50)
    assert PromptBuilder().body(50) == builder.body(50)
    first, second = builder.build(50, salt=1), builder.build(50, salt=2)
    assert first != second  # distinct prompts keep the prefix cache out of the measurement
    assert first.split()[1:] == second.split()[1:]
    assert not builder.tokenizer_aware


def test_prompt_builder_estimate_without_tokenizer() -> None:
    words = len(PromptBuilder(words_per_token=0.75).body(400).split())
    assert words == 300


def test_token_counter_is_none_without_a_tokenizer_file(tmp_path) -> None:
    assert load_token_counter(tmp_path) is None
    assert not PromptBuilder.for_model_dir(tmp_path).tokenizer_aware


def test_token_counter_from_a_tokenizer_json(tmp_path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(tmp_path / "tokenizer.json"))

    builder = PromptBuilder.for_model_dir(tmp_path)
    assert builder.tokenizer_aware
    assert len(builder.body(40).split()) == 40  # a word-level tokenizer: one token per word


async def test_one_connection_serves_consecutive_requests() -> None:
    """The body is read to its end after [DONE], so the connection goes back to the pool: a new connection
    per request would cost the server's API process (the bottleneck of a loaded CPU server)."""
    from aiohttp import web

    client_ports: set[int] = set()

    async def completions(request: web.Request) -> web.StreamResponse:
        client_ports.add(request.transport.get_extra_info("peername")[1])  # type: ignore[union-attr]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            chunk = {
                "choices": [{"index": 0, "text": "x", "finish_reason": "length" if i == 2 else None}],
                "usage": {"prompt_tokens": 7, "completion_tokens": i + 1},
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await asyncio.sleep(0.1)  # the end of the body comes in a later packet, as it can from vLLM
        await response.write_eof()
        return response

    async with raw_completions_server(completions) as port, aiohttp.ClientSession() as http:
        client = StreamingClient(http, f"http://127.0.0.1:{port}", "m")
        records = [await client.send(spec(request_id=i, output_tokens=3), time.perf_counter()) for i in range(5)]

    assert all(r.status is Status.OK and r.output_tokens == 3 for r in records), [r.error for r in records]
    # Released before the body's end (the chunked terminator came later), each connection would be closed.
    assert len(client_ports) == 1, f"{len(client_ports)} connections for 5 consecutive requests"


async def test_sse_lines_split_across_reads_or_joined_in_one_are_parsed_and_stamped_on_arrival() -> None:
    """The client reads whatever bytes have arrived (iter_any) and splits SSE lines itself: a line cut
    across two TCP writes is joined, two events in one write are both counted, each stamped on arrival."""
    from aiohttp import web

    def event(text: str, finish: str | None = None) -> bytes:
        choice = {"index": 0, "text": text, "finish_reason": finish}
        return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        first = event("a")
        await response.write(first[:10])  # half a line
        await asyncio.sleep(0.05)
        await response.write(first[10:])
        await asyncio.sleep(0.05)
        await response.write(event("b") + event("c"))  # two events in one write
        await asyncio.sleep(0.05)
        await response.write(event("d", "length") + b"data: [DONE]")  # the last line without its newline
        await response.write_eof()
        return response

    async with raw_completions_server(completions) as port, aiohttp.ClientSession() as http:
        client = StreamingClient(http, f"http://127.0.0.1:{port}", "m", continuous_usage=False)
        record = await client.send(spec(output_tokens=4), time.perf_counter())
    assert record.status is Status.OK, record.error
    assert record.output_tokens == 4
    assert record.chunk_times is not None and len(record.chunk_times) == 4
    first, second, third, fourth = record.chunk_times
    assert first >= 0.045  # stamped when its line was complete, not when its first half arrived
    assert third - second < 0.02 <= second - first  # arrived together, stamped together
    assert fourth - third >= 0.04


async def test_a_keep_alive_connection_closed_by_the_server_is_retried_once_on_a_fresh_one() -> None:
    """uvicorn closes a connection idle for 5 s; a client that was not scheduled meanwhile sends its next
    request on it before reading the close, and the POST fails before the server read it (a CI run: four
    requests failed at once on a loaded machine, all 200 OK in vLLM's log). Here the server drops every
    connection's second request unanswered, the same failure made certain: the request is sent again on a
    fresh connection and completes."""
    from aiohttp import web

    requests_by_port: dict[int, int] = {}

    async def completions(request: web.Request) -> web.StreamResponse:
        port = request.transport.get_extra_info("peername")[1]  # type: ignore[union-attr]
        requests_by_port[port] = requests_by_port.get(port, 0) + 1
        if requests_by_port[port] > 1:
            request.transport.abort()  # type: ignore[union-attr]
            return web.Response()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {"choices": [{"index": 0, "text": "x", "finish_reason": "length"}], "usage": {"completion_tokens": 1}}
        await response.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
        await response.write_eof()
        return response

    async with raw_completions_server(completions) as port, aiohttp.ClientSession() as http:
        client = StreamingClient(http, f"http://127.0.0.1:{port}", "m")
        try:
            records = [await client.send(spec(request_id=i, output_tokens=1), time.perf_counter()) for i in range(3)]
        finally:
            await client.close()

    assert [r.status for r in records] == [Status.OK] * 3, [r.error for r in records]
    assert client.poster.retries == 1  # the pooled connection's second request; the fresh one closes after each
    assert sorted(requests_by_port.values()) == [1, 1, 2]
