"""An in-process OpenAI-style streaming server on a real 127.0.0.1 socket, for unit tests of the client.

It speaks just enough HTTP/1.1 (one request per connection, chunked SSE responses) to let tests script
what the real vLLM does (chunk shapes copied from vLLM 0.32's CPU build) and what it does when things go
wrong: malformed JSON, a dropped connection mid-stream, a hang, an HTTP error, a server that dies.
`FakeLaunchedReplicas` is a `--launch` gateway's servers made of these (replica swaps without vLLM).
It proves nothing about vLLM itself; the live path's integration tests use the real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from core.backends.launched_replicas import LaunchedReplicas
from core.profile import KnobsSpec, Profile


@dataclass
class StreamReply:
    """A streamed completion. By default one token per chunk, `max_tokens` of them."""

    chunk_tokens: list[int] | None = None
    first_delay_s: float = 0.0
    chunk_delay_s: float = 0.0
    # None: send per-chunk usage only when the request asks for continuous_usage_stats (as vLLM does).
    usage_per_chunk: bool | None = None
    final_usage: bool = True
    send_done: bool = True
    # Indices of chunks that carry a token but no text (vLLM does this for not-yet-decodable tokens).
    empty_text_chunks: frozenset[int] = frozenset()
    malformed_after: int | None = None  # after this many chunks, send a line that is not JSON
    disconnect_after: int | None = None  # after this many chunks, drop the connection
    error_after: int | None = None  # after this many chunks, send vLLM's in-stream error object
    end_after: int | None = None  # after this many chunks, end the response cleanly (no finish, no [DONE])
    tail_delay_s: float = 0.0  # after the last event ([DONE]), wait this long before ending the response body


@dataclass
class ErrorReply:
    status: int
    body: str = '{"error": {"message": "fake failure"}}'


@dataclass
class HangReply:
    """Accept the request and never answer."""


Reply = StreamReply | ErrorReply | HangReply
ReplyFor = Callable[[dict[str, Any]], Reply]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error", 503: "Unavailable"}


@dataclass
class FakeOpenAIServer:
    reply: Reply | ReplyFor = field(default_factory=StreamReply)
    model: str = "fake-model"
    version: str | None = "0.0.0-fake"
    metrics_text: str | None = None
    # /tokenize counts this many tokens per whitespace-separated word (None: no /tokenize endpoint).
    tokens_per_word: int | None = None
    # What the tests inspect.
    bodies: list[dict[str, Any]] = field(default_factory=list)
    received_at: list[float] = field(default_factory=list)  # time.perf_counter() at each completion request
    in_flight: int = 0
    max_in_flight: int = 0
    metrics_requests: int = 0

    def __post_init__(self) -> None:
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeOpenAIServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.kill()

    async def kill(self) -> None:
        """Die like a SIGKILLed server: stop listening and drop every open connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        current = asyncio.current_task()
        handlers = [task for task in self._handlers if task is not current]
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
        try:
            method, path, body = await self._read_request(reader)
            await self._route(method, path, body, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            self._handlers.discard(handler)  # type: ignore[arg-type]
            writer.close()

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes]:
        request_line = (await reader.readline()).decode()
        method, path, _ = request_line.split(" ", 2)
        length = 0
        while (line := (await reader.readline()).decode().strip()) != "":
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        body = await reader.readexactly(length) if length else b""
        return method, path, body

    async def _route(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter) -> None:
        if method == "GET" and path == "/v1/models":
            models = {"object": "list", "data": [{"id": self.model, "object": "model", "max_model_len": 1024}]}
            await _send_json(writer, 200, models)
        elif method == "GET" and path == "/version" and self.version is not None:
            await _send_json(writer, 200, {"version": self.version})
        elif method == "GET" and path == "/health":
            await _send_json(writer, 200, {})
        elif method == "GET" and path == "/metrics" and self.metrics_text is not None:
            self.metrics_requests += 1
            await _send(writer, 200, self.metrics_text.encode(), "text/plain; version=0.0.4")
        elif method == "POST" and path == "/tokenize" and self.tokens_per_word is not None:
            words = len(json.loads(body)["prompt"].split())
            await _send_json(writer, 200, {"count": words * self.tokens_per_word, "max_model_len": 1024})
        elif method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            request = json.loads(body)
            self.bodies.append(request)
            self.received_at.append(time.perf_counter())
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                reply = self.reply(request) if callable(self.reply) else self.reply
                await self._reply(reply, request, path.endswith("chat/completions"), writer)
            finally:
                self.in_flight -= 1
        else:
            await _send_json(writer, 404, {"detail": "Not Found"})

    async def _reply(self, reply: Reply, request: dict[str, Any], chat: bool, writer: asyncio.StreamWriter) -> None:
        if isinstance(reply, HangReply):
            await asyncio.sleep(3600)
            return
        if isinstance(reply, ErrorReply):
            await _send(writer, reply.status, reply.body.encode(), "application/json")
            return
        await self._stream(reply, request, chat, writer)

    async def _stream(
        self, reply: StreamReply, request: dict[str, Any], chat: bool, writer: asyncio.StreamWriter
    ) -> None:
        options = request.get("stream_options") or {}
        usage_per_chunk = reply.usage_per_chunk
        if usage_per_chunk is None:
            usage_per_chunk = bool(options.get("continuous_usage_stats"))
        chunk_tokens = reply.chunk_tokens or [1] * int(request["max_tokens"])
        prompt_tokens = 7
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        await asyncio.sleep(reply.first_delay_s)

        def usage(completion: int) -> dict[str, int]:
            return {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + completion,
                "completion_tokens": completion,
            }

        if chat:  # vLLM opens a chat stream with a role-only chunk that carries no token
            role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
            if usage_per_chunk:
                role["usage"] = usage(0)
            await _send_event(writer, json.dumps(role))
        generated = 0
        for index, tokens in enumerate(chunk_tokens):
            if index == reply.malformed_after:
                await _send_event(writer, '{"choices": [{"text": "unterminated')
                break
            if index == reply.disconnect_after:
                await writer.drain()
                writer.transport.abort()
                return
            if index == reply.error_after:
                await _send_event(writer, json.dumps({"error": {"message": "engine died", "code": 500}}))
                break
            if index == reply.end_after:
                break
            if index > 0:
                await asyncio.sleep(reply.chunk_delay_s)
            generated += tokens
            text = "" if index in reply.empty_text_chunks else " tok" * tokens
            last = index == len(chunk_tokens) - 1
            finish = "length" if last else None
            choice: dict[str, Any] = (
                {"index": 0, "delta": {"content": text}, "finish_reason": finish}
                if chat
                else {"index": 0, "text": text, "finish_reason": finish}
            )
            chunk: dict[str, Any] = {"id": "cmpl-fake", "model": self.model, "choices": [choice]}
            if usage_per_chunk:
                chunk["usage"] = usage(generated)
            await _send_event(writer, json.dumps(chunk))
        else:
            if reply.final_usage and options.get("include_usage"):
                await _send_event(writer, json.dumps({"choices": [], "usage": usage(generated)}))
            if reply.send_done:
                await _send_event(writer, "[DONE]")
        await asyncio.sleep(reply.tail_delay_s)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


async def _send_event(writer: asyncio.StreamWriter, payload: str) -> None:
    data = f"data: {payload}\n\n".encode()
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def _send(writer: asyncio.StreamWriter, status: int, body: bytes, content_type: str) -> None:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    writer.write(head.encode() + body)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


async def _send_json(writer: asyncio.StreamWriter, status: int, payload: Any) -> None:
    await _send(writer, status, json.dumps(payload).encode(), "application/json")


class _FakeVllm:
    """What `LaunchedReplicas` keeps of a server it started: its URL and a blocking stop (run in a thread)."""

    def __init__(self, fake: FakeOpenAIServer, loop: asyncio.AbstractEventLoop) -> None:
        self.fake, self.loop = fake, loop

    @property
    def base_url(self) -> str:
        return self.fake.base_url

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.kill(), self.loop).result(timeout=10)


class FakeLaunchedReplicas(LaunchedReplicas):
    """`slo-console gateway --launch`'s servers, each a scripted server: `started` lists each one's knobs."""

    def __init__(self, profile: Profile, reply: Reply | ReplyFor | None = None) -> None:
        super().__init__(profile)
        self.reply = reply or StreamReply(first_delay_s=0.01, chunk_delay_s=0.005)
        self.started: list[KnobsSpec] = []
        self.started_slots: list[int] = []  # the core slot each was given (core/serve/cpu_binding.py)

    async def _start(self, knobs: KnobsSpec, slot: int) -> Any:
        fake = await FakeOpenAIServer(self.reply).__aenter__()
        self.started.append(knobs)
        self.started_slots.append(slot)
        return _FakeVllm(fake, asyncio.get_running_loop())
