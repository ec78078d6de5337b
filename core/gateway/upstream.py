"""The admission gateway's side toward the upstream servers: one pooled aiohttp client, header filtering and
the reachability probe. HTTP is aiohttp's; nothing here parses HTTP by hand."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

from core.gateway.protocol import GATEWAY_HEADERS

# Request headers not passed upstream: hop-by-hop ones, those aiohttp sets itself, and the gateway's own.
_DROP_HEADERS = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade"})
_DROP_HEADERS = _DROP_HEADERS | GATEWAY_HEADERS
# Response headers not copied back from the upstream (aiohttp computes framing itself).
_DROP_RESPONSE_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}
)


def request_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's request headers that go on to the upstream."""
    return {k: v for k, v in headers.items() if k.lower() not in _DROP_HEADERS}


def response_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    """The upstream's response headers that go back to the client."""
    return {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE_HEADERS}


# What reusing a pooled keep-alive connection that the server has just closed raises before the status line
# (a reset socket is a ClientOSError).
STALE_CONNECTION_ERRORS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def drop_tracebacks(exc: BaseException) -> None:
    """Unlink a handled upstream error, and the errors chained to it, from their tracebacks.

    aiohttp keeps an error it raises on its protocol and payload objects, which the frames in the error's own
    traceback hold: a reference cycle (error -> traceback -> frame -> protocol -> error) that only the garbage
    collector frees. One per failed upstream request, with the frames and everything they hold, made the
    collector run about ten times as often with faults as without, each run a pause of the gateway's loop for
    every request in flight. Without the traceback link, reference counting frees them when the request ends.
    Only for an error the gateway has handled and will not raise again (the cause is already a string)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__


class StaleConnectionRetry:
    """POST on a pooled session, with the one retry of a stale keep-alive connection on a fresh one.

    uvicorn (vLLM's HTTP server) closes a connection idle for 5 s. A client that was not scheduled for that
    long (a busy machine) wakes, reads the end of a response and at once sends its next request on the same
    connection before its event loop has read the server's close: the POST fails before the server read it.
    That one case is retried once on a connection of its own (nothing was processed, so nothing runs twice);
    the gateway toward its upstreams and the load client toward the server under test both need it. `retries`
    counts them, so a run can say how often it happened."""

    def __init__(self, pooled: aiohttp.ClientSession, make_fresh: Callable[[], aiohttp.ClientSession]) -> None:
        self.pooled = pooled
        self._make_fresh = make_fresh
        self._fresh: aiohttp.ClientSession | None = None  # no pooling: force_close connections
        self.retries = 0

    async def post(self, url: str, **request: Any) -> aiohttp.ClientResponse:
        """POST and wait for the status line (the response is the caller's to read and release)."""
        try:
            return await self.pooled.post(url, **request)
        except aiohttp.ClientConnectorError:
            raise  # no connection was made: not a stale one, and a second try would fail the same way
        except STALE_CONNECTION_ERRORS:
            if self._fresh is None:
                self._fresh = self._make_fresh()
            self.retries += 1
            return await self._fresh.post(url, **request)

    async def close(self) -> None:
        """Close the fresh session (the pooled one is its owner's to close)."""
        if self._fresh is not None:
            await self._fresh.close()
            self._fresh = None


class UpstreamClient:
    """The gateway's HTTP client toward its upstreams: one session whose keep-alive connections are pooled."""

    def __init__(self, request_timeout_s: float) -> None:
        self.session = aiohttp.ClientSession(
            # Idle upstream connections are dropped before uvicorn's 5 s keep-alive timeout closes them.
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=3.0),
            timeout=aiohttp.ClientTimeout(total=request_timeout_s, connect=10.0),
            auto_decompress=False,
            # One session serves every client: an upstream's cookies must not pass from one client to the next.
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        self._poster = StaleConnectionRetry(
            self.session,
            lambda: aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=self.session.timeout,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            ),
        )

    async def post(self, url: str, data: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """POST and wait for the status line, retrying a stale keep-alive connection once (StaleConnectionRetry)."""
        return await self._poster.post(url, data=data, headers=headers)

    async def close(self) -> None:
        await self._poster.close()
        await self.session.close()


async def probe_upstreams(urls: Sequence[str], timeout_s: float = 5.0) -> list[str]:
    """One line per upstream that does not answer GET /v1/models with 200 (empty: all reachable)."""
    problems: list[str] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        for url in urls:
            try:
                async with session.get(url.rstrip("/") + "/v1/models") as response:
                    if response.status != 200:
                        problems.append(f"{url}: GET /v1/models answered HTTP {response.status}")
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                problems.append(f"{url}: {type(exc).__name__}: {exc or 'no answer'}")
    return problems
