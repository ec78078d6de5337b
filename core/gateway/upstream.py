"""The admission gateway's side toward the upstream servers: one pooled aiohttp client, header filtering and
the reachability probe. HTTP is aiohttp's; nothing here parses HTTP by hand."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
        self._fresh: aiohttp.ClientSession | None = None  # no pooling: for the one retry of a stale connection

    async def post(self, url: str, data: bytes, headers: dict[str, str]) -> aiohttp.ClientResponse:
        """POST and wait for the status line. A pooled keep-alive connection that the server closed just as it
        was reused fails before the server read the request; that one case is retried once on a fresh
        connection (nothing was processed, so nothing runs twice)."""
        try:
            return await self.session.post(url, data=data, headers=headers)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if self._fresh is None:
                self._fresh = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0, force_close=True),
                    timeout=self.session.timeout,
                    auto_decompress=False,
                    cookie_jar=aiohttp.DummyCookieJar(),
                )
            return await self._fresh.post(url, data=data, headers=headers)

    async def close(self) -> None:
        for session in (self.session, self._fresh):
            if session is not None:
                await session.close()
        self._fresh = None


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
