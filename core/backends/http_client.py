"""One streamed request to an OpenAI-compatible server, measured like `vllm bench serve`.

`StreamingClient.send` posts a completion (or chat completion) with `stream: true`, timestamps each SSE
chunk on the run's clock (time.perf_counter relative to the run start) and fills a `RequestRecord`.
Whatever goes wrong with one request (HTTP error, timeout, broken or malformed stream) ends up in that
request's record as a failure; `send` only raises on cancellation, after recording it.

Token counting: we ask vLLM for `continuous_usage_stats`, so every chunk carries the cumulative
`completion_tokens`, and a chunk's token count is the increase. This is exact even for chunks whose text
is empty (vLLM sends an empty-text chunk for a token that decodes to nothing yet, e.g. a partial UTF-8
byte). Servers without per-chunk usage get one token per non-empty chunk, and the final usage total's
remainder goes on the last chunk.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import Callable
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from core.backends.prompts import PromptBuilder, load_token_counter
from core.gateway.protocol import HEADER_SENT_AT
from core.gateway.protocol import slo_fields as gateway_slo_fields
from core.gateway.upstream import StaleConnectionRetry
from core.records import RequestRecord, RequestSpec, Status

__all__ = ["Api", "PromptBuilder", "StreamingClient", "is_loopback", "load_token_counter", "open_load_session"]

Api = Literal["completions", "chat"]

# Error texts quote at most this much of a server's body or a bad SSE line.
_SNIPPET_CHARS = 200

# aiohttp's per-line read limit: a streamed chunk line longer than this would fail the request.
_READ_BUFSIZE = 10 * 1024 * 1024


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "..."


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_load_session(
    base_url: str, *, connect_timeout_s: float = 10.0, force_close: bool = False
) -> aiohttp.ClientSession:
    """The HTTP session a load run streams its requests over (aiohttp, set up as `vllm bench serve` does).

    No connection cap (queueing inside the client would count as server latency), keep-alive reuse (unless
    `force_close`: a connection per request, for the retry of a stale one), and environment proxies only for
    non-loopback servers (a corporate HTTP_PROXY must not capture 127.0.0.1). The per-request deadline is the
    client's own (`StreamingClient.request_timeout_s`).
    """
    # aiohttp refuses a keep-alive timeout on a connector that closes every connection.
    reuse: dict[str, Any] = {"force_close": True} if force_close else {"keepalive_timeout": 60}
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, **reuse)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
        trust_env=not is_loopback(base_url),
        read_bufsize=_READ_BUFSIZE,
    )


class _StreamFailure(Exception):
    """A request failed in a way that ends it: carries the status and the one-line cause."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# Transport failures: the server refused the connection, or it broke while the request was under way
# (ClientConnectorError and a reset socket are ClientOSErrors; a cut chunked body is a ClientPayloadError).
TRANSPORT_ERRORS = (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)


_JSON_HEADERS = {"Content-Type": "application/json"}


class StreamingClient:
    """Sends `RequestSpec`s as streamed completions and measures them into `RequestRecord`s.

    `http` is shared by all requests of a run: an aiohttp session from `open_load_session` (its pool must
    not cap connections, or requests would queue inside the client and count as server latency).

    Why aiohttp and not httpx: measured against one vLLM CPU server (8 closed-loop clients, 64 tokens per
    stream; benchmarks/client_agreement.py), an httpx AsyncClient stream costs several times the client
    CPU per chunk of an aiohttp one (pure-Python h11 parsing and anyio layers per chunk, against aiohttp's
    C parser; encode/httpx issue 3215). On a loaded machine the client then falls behind the streams it
    reads: chunks pile up in socket buffers and are stamped when the client gets round to them, so TTFT
    came out near e2e and throughput near half of `vllm bench serve`'s on the same server. vllm bench
    uses aiohttp; so does the load path here. httpx stays for control calls (probes, /metrics, /tokenize).
    """

    def __init__(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        model: str,
        *,
        api: Api = "completions",
        prompt_builder: PromptBuilder | None = None,
        request_timeout_s: float = 300.0,
        ignore_eos: bool = True,
        continuous_usage: bool = True,
        extra_body: dict[str, Any] | None = None,
        on_transport_error: Callable[[BaseException], None] | None = None,
        slo_fields: bool = False,
        temperature: float | None = 0.0,
    ) -> None:
        if api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', got {api!r}")
        self.http = http
        self.base_url = base_url.rstrip("/")
        # A keep-alive connection the server closed while this client was not scheduled is retried once on a
        # fresh one (StaleConnectionRetry): a busy machine must not turn into failed requests.
        connect_s = http.timeout.sock_connect or 10.0
        self.poster = StaleConnectionRetry(
            http, lambda: open_load_session(self.base_url, connect_timeout_s=connect_s, force_close=True)
        )
        self.model = model
        self.api: Api = api
        self.prompts = prompt_builder or PromptBuilder()
        self.request_timeout_s = request_timeout_s
        self.ignore_eos = ignore_eos
        self.continuous_usage = continuous_usage
        self.extra_body = dict(extra_body or {})
        # 0.0: greedy, so a prompt's output is the same every run; None leaves sampling to the server's
        # defaults (what `vllm bench serve` sends since it stopped setting temperature 0).
        self.temperature = temperature
        # Tell an admission gateway each request's task, SLO and id (core/gateway/protocol.py).
        self.slo_fields = slo_fields
        # Told about refused connections and broken streams, so a load driver can check whether the
        # server died rather than failing every remaining request one by one.
        self.on_transport_error = on_transport_error

    async def close(self) -> None:
        """Close what the client opened itself (the retry's fresh session; the pooled one is the caller's)."""
        await self.poster.close()

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        return self.base_url + path

    def encode_body(self, spec: RequestSpec) -> bytes:
        """The request's JSON body, ready to send: build these before the timed loop (as vllm bench does)."""
        return json.dumps(self.request_body(spec), separators=(",", ":")).encode()

    def request_body(self, spec: RequestSpec) -> dict[str, Any]:
        text = self.prompts.build(spec.prompt_tokens, salt=spec.request_id)
        stream_options: dict[str, Any] = {"include_usage": True}
        if self.continuous_usage:
            stream_options["continuous_usage_stats"] = True
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": spec.output_tokens,
            "stream": True,
            "stream_options": stream_options,
        }
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        if self.ignore_eos:
            body["ignore_eos"] = True  # vLLM extension: generate exactly max_tokens
        body.update(self.extra_body)
        if self.slo_fields:
            body.update(gateway_slo_fields(spec))
        return body

    async def send(
        self,
        spec: RequestSpec,
        run_start: float,
        record: RequestRecord | None = None,
        *,
        ready_s: float | None = None,
        body: bytes | None = None,
    ) -> RequestRecord:
        """Send one request now and fill `record` (created from `spec` if not given).

        `run_start` is the time.perf_counter() value of the run's time zero. `ready_s` (run clock) is when
        the client was ready to send it, if it then waited for an in-flight slot: latency counts from there
        (see RequestRecord.arrival_s). `body` is the pre-built `encode_body(spec)`; built here if None.
        On cancellation the record is marked CANCELLED and the CancelledError propagates.
        """
        if record is None:
            record = RequestRecord.from_spec(spec)
        if body is None:
            body = self.encode_body(spec)
        stream = _StreamState(self.continuous_usage)
        record.sent_s = time.perf_counter() - run_start
        record.arrival_s = record.sent_s if ready_s is None else ready_s
        headers = _JSON_HEADERS
        if self.slo_fields:  # the gateway counts the SLO from when the latency clock started here
            headers = {**headers, HEADER_SENT_AT: f"{time.time() - (record.sent_s - record.arrival_s):.6f}"}
        try:
            async with asyncio.timeout(self.request_timeout_s):
                await self._stream(body, run_start, stream, headers)
            record.status = Status.OK
        except _StreamFailure as failure:
            record.status = failure.status
            record.error = failure.message
        except aiohttp.ServerTimeoutError as exc:
            # aiohttp's connect timeout (the session's sock_connect) is a TimeoutError too: say which it was.
            record.status = Status.TIMEOUT
            record.error = f"could not connect: {type(exc).__name__}: {exc}"
        except TimeoutError:
            record.status = Status.TIMEOUT
            record.error = f"no complete response within {self.request_timeout_s:g} s"
        except TRANSPORT_ERRORS as exc:
            phase = "stream broken" if stream.chunk_times else "connection failed"
            record.status = Status.ERROR
            record.error = f"{phase}: {type(exc).__name__}: {exc}"
            if self.on_transport_error is not None:
                self.on_transport_error(exc)
        except aiohttp.ClientError as exc:
            record.status = Status.ERROR
            record.error = f"{type(exc).__name__}: {exc}"
        except asyncio.CancelledError:
            record.status = Status.CANCELLED
            record.error = "cancelled"
            raise
        except Exception as exc:  # a server sending odd but valid JSON must fail one request, not the run
            record.status = Status.ERROR
            record.error = f"unexpected response: {type(exc).__name__}: {_snippet(str(exc))}"
        finally:
            stream.fill(record, time.perf_counter() - run_start)
        return record

    async def _stream(
        self, body: bytes, run_start: float, stream: _StreamState, headers: dict[str, str] = _JSON_HEADERS
    ) -> None:
        response = await self.poster.post(self.url, data=body, headers=headers)
        async with response:
            if response.status >= 400:
                raw = await response.read()
                text = raw.decode("utf-8", errors="replace")
                raise _StreamFailure(Status.ERROR, f"HTTP {response.status}: {_snippet(text)}")
            # Whatever bytes have arrived, in one read (as `vllm bench serve` reads them: iter_any), split
            # into SSE lines here: a read per line costs the client two awaits per chunk, and on a CPU
            # server the client's cycles are the engine's (they share the cores). Lines that arrived in one
            # read are stamped with that read's time: that is when the client saw them.
            pending = b""
            now = 0.0
            async for data in response.content.iter_any():
                now = time.perf_counter() - run_start
                pending += data
                if b"\n" not in pending:
                    continue
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    _read_line(line, now, stream)
            if pending:
                _read_line(pending, now, stream)  # a last line without its newline
        if stream.done_s is None and not stream.finished:
            raise _StreamFailure(Status.ERROR, "stream ended before [DONE] or a finish_reason")


def _read_line(line: bytes, now: float, stream: _StreamState) -> None:
    """One SSE line of a completions stream, received at `now` (run clock)."""
    if not line.startswith(b"data:"):
        return  # blank separators, SSE comments and event/id fields carry no tokens
    payload = line[len(b"data:") :].strip()
    if payload == b"[DONE]":
        # Read on to the end of the body (it follows at once): a response left unread makes aiohttp close
        # the connection instead of reusing it, and a new connection per request costs the server's API
        # process, which is what limits a loaded CPU server.
        stream.done_s = now
        return
    if stream.done_s is not None:
        return
    try:
        data = json.loads(payload)
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        text = payload.decode("utf-8", errors="replace")
        cause = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
        raise _StreamFailure(Status.ERROR, f"malformed SSE JSON ({cause}): {_snippet(text)}") from None
    stream.add(data, now)


class _StreamState:
    """What one SSE stream has delivered so far."""

    def __init__(self, continuous_usage: bool) -> None:
        self.continuous_usage = continuous_usage
        self.chunk_times: list[float] = []
        self.chunk_tokens: list[int] = []
        self.completion_tokens_seen = 0  # cumulative usage.completion_tokens, from per-chunk usage
        self.usage_per_chunk = False
        self.final_completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        self.done_s: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.final_completion_tokens is not None

    def add(self, data: Any, now: float) -> None:
        if not isinstance(data, dict):
            raise _StreamFailure(Status.ERROR, f"malformed SSE chunk (not an object): {_snippet(str(data))}")
        if "error" in data:
            # vLLM reports engine errors inside the stream after the 200 status has been sent.
            error = data["error"]
            message = error.get("message", error) if isinstance(error, dict) else error
            raise _StreamFailure(Status.ERROR, f"server error in stream: {_snippet(str(message))}")
        choices = data.get("choices") or []
        usage = data.get("usage") or {}
        shaped = isinstance(choices, list) and isinstance(usage, dict) and all(isinstance(c, dict) for c in choices[:1])
        if not shaped:
            message = f"malformed SSE chunk (choices: a list of objects, usage: an object): {_snippet(str(data))}"
            raise _StreamFailure(Status.ERROR, message)
        prompt_tokens = _token_count(usage, "prompt_tokens")
        if prompt_tokens is not None:
            self.prompt_tokens = prompt_tokens
        completion_tokens = _token_count(usage, "completion_tokens")
        if not choices:
            # The closing usage chunk (choices == []) carries the totals.
            if completion_tokens is not None:
                self.final_completion_tokens = completion_tokens
            return
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        if completion_tokens is not None:
            self.usage_per_chunk = True
            cumulative = completion_tokens
            tokens = cumulative - self.completion_tokens_seen
            self.completion_tokens_seen = cumulative
        else:
            tokens = 1 if _chunk_text(choice) else 0
        if tokens > 0:
            self.chunk_times.append(now)
            self.chunk_tokens.append(tokens)

    def fill(self, record: RequestRecord, now: float) -> None:
        """Write the measured timeline into the record (also for failed requests: partial data helps)."""
        counted = sum(self.chunk_tokens)
        total = self.final_completion_tokens
        if total is None:
            total = self.completion_tokens_seen if self.usage_per_chunk else counted
        if total > counted and self.chunk_tokens:
            self.chunk_tokens[-1] += total - counted
        record.output_tokens = total
        if self.prompt_tokens is not None:
            record.prompt_tokens = self.prompt_tokens  # what the server actually processed
        record.chunk_times = np.asarray(self.chunk_times, dtype=float)
        tokens = np.asarray(self.chunk_tokens, dtype=np.int64)
        record.chunk_tokens = None if bool(np.all(tokens == 1)) else tokens
        record.end_s = self.done_s if (record.status is Status.OK and self.done_s is not None) else now


def _token_count(usage: dict[str, Any], key: str) -> int | None:
    """A usage count: None when absent, else a whole number >= 0 or the stream fails (one line)."""
    value = usage.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _StreamFailure(Status.ERROR, f"malformed SSE usage: {key} is {_snippet(repr(value))}, not a count")
    return value


def _chunk_text(choice: dict[str, Any]) -> str:
    """The chunk's text; a field of another type than a string carries none."""
    if "text" in choice:
        text = choice.get("text")
    else:
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
    return text if isinstance(text, str) else ""
