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
import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np

from core.control.gateway_protocol import slo_fields as gateway_slo_fields
from core.records import RequestRecord, RequestSpec, Status

Api = Literal["completions", "chat"]

# Error texts quote at most this much of a server's body or a bad SSE line.
_SNIPPET_CHARS = 200

# Without a tokenizer, English-like text averages about 0.75 words per token for BPE vocabularies.
DEFAULT_WORDS_PER_TOKEN = 0.75

# A fixed vocabulary of common words: prompts read as text to any tokenizer and stay deterministic.
_WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "time",
    "people",
    "year",
    "way",
    "day",
    "thing",
    "man",
    "world",
    "life",
    "hand",
    "part",
    "child",
    "eye",
    "woman",
    "place",
    "work",
    "week",
    "case",
    "point",
    "number",
    "group",
    "problem",
    "fact",
    "system",
    "program",
    "question",
    "government",
    "company",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "community",
    "name",
    "president",
    "team",
    "minute",
    "idea",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "others",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "good",
    "new",
    "first",
    "last",
    "long",
    "great",
    "little",
    "own",
    "other",
    "old",
    "big",
    "high",
    "different",
    "small",
    "large",
    "next",
    "early",
    "young",
    "important",
    "few",
    "public",
    "bad",
    "same",
    "able",
]


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET_CHARS else text[:_SNIPPET_CHARS] + "..."


class PromptBuilder:
    """Builds prompt text of about N tokens, deterministically; cached by length.

    With `count_tokens` (a callable text -> token count, e.g. from the model's tokenizer) the body is the
    shortest word sequence that reaches N tokens, found by bisection. Without one, token counts are
    estimated at `words_per_token`. A per-request tag at the start (`build(n, salt=request_id)`) makes
    every prompt distinct so vLLM's prefix cache does not turn prefills into cache hits, as random-token
    prompts in `vllm bench serve` also avoid.
    """

    def __init__(
        self,
        count_tokens: Callable[[str], int] | None = None,
        *,
        words_per_token: float = DEFAULT_WORDS_PER_TOKEN,
        seed: int = 0,
    ) -> None:
        self.tokenizer_aware = count_tokens is not None
        self._words_per_token = words_per_token
        self._count = count_tokens or self._estimate_tokens
        self._seed = seed
        self._words: list[str] = []
        self._bodies: dict[int, str] = {}

    @classmethod
    def for_model_dir(cls, model_dir: str | Path | None, **kwargs: Any) -> PromptBuilder:
        """Tokenizer-aware when `<model_dir>/tokenizer.json` exists and `tokenizers` is installed."""
        count = load_token_counter(model_dir) if model_dir is not None else None
        return cls(count, **kwargs)

    @property
    def words_per_token(self) -> float:
        return self._words_per_token

    def calibrate(self, text: str, tokens: int) -> None:
        """Set the words-per-token estimate from a text whose token count is known (e.g. a server's
        /tokenize answer). Only used without a token counter."""
        words = len(text.split())
        if tokens > 0 and words > 0 and not self.tokenizer_aware:
            self._words_per_token = words / tokens
            self._bodies.clear()

    def _estimate_tokens(self, text: str) -> int:
        return math.ceil(len(text.split()) / self._words_per_token)

    def _word_prefix(self, n_words: int) -> str:
        if len(self._words) < n_words:
            rng = random.Random(self._seed + len(self._words))
            self._words.extend(rng.choice(_WORDS) for _ in range(n_words - len(self._words)))
        return " ".join(self._words[:n_words])

    def body(self, n_tokens: int) -> str:
        """Text of about `n_tokens` tokens (at least one word)."""
        n_tokens = max(1, n_tokens)
        cached = self._bodies.get(n_tokens)
        if cached is not None:
            return cached
        # Bisect on the word count: the fewest words whose text reaches n_tokens.
        low, high = 1, max(2, int(n_tokens * 2))
        while self._count(self._word_prefix(high)) < n_tokens:
            low, high = high, high * 2
        while low < high:
            middle = (low + high) // 2
            if self._count(self._word_prefix(middle)) >= n_tokens:
                high = middle
            else:
                low = middle + 1
        text = self._word_prefix(low)
        self._bodies[n_tokens] = text
        return text

    def build(self, n_tokens: int, salt: int | None = None) -> str:
        if salt is None:
            return self.body(n_tokens)
        tag = f"{salt}:"
        return f"{tag} {self.body(n_tokens - self._count(tag))}"


def load_token_counter(model_dir: str | Path) -> Callable[[str], int] | None:
    """A token counter from `<model_dir>/tokenizer.json`, or None (no file, or `tokenizers` missing)."""
    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer  # optional: the dev install does not need it
    except ImportError:
        return None
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception:  # a corrupt or unsupported tokenizer file only costs us exact prompt lengths
        return None
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


class _StreamFailure(Exception):
    """A request failed in a way that ends it: carries the status and the one-line cause."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# Transport failures: the server refused the connection, or it broke while the request was under way.
TRANSPORT_ERRORS = (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


class StreamingClient:
    """Sends `RequestSpec`s as streamed completions and measures them into `RequestRecord`s.

    `http` is shared by all requests of a run (its pool should not cap connections, or requests would
    queue inside the client and the queueing would count as server latency).
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
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
    ) -> None:
        if api not in ("completions", "chat"):
            raise ValueError(f"api must be 'completions' or 'chat', got {api!r}")
        self.http = http
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api: Api = api
        self.prompts = prompt_builder or PromptBuilder()
        self.request_timeout_s = request_timeout_s
        self.ignore_eos = ignore_eos
        self.continuous_usage = continuous_usage
        self.extra_body = dict(extra_body or {})
        # Tell an admission gateway each request's task, SLO and id (core/control/gateway_protocol.py).
        self.slo_fields = slo_fields
        # Told about refused connections and broken streams, so a load driver can check whether the
        # server died rather than failing every remaining request one by one.
        self.on_transport_error = on_transport_error

    @property
    def url(self) -> str:
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        return self.base_url + path

    def request_body(self, spec: RequestSpec) -> dict[str, Any]:
        text = self.prompts.build(spec.prompt_tokens, salt=spec.request_id)
        stream_options: dict[str, Any] = {"include_usage": True}
        if self.continuous_usage:
            stream_options["continuous_usage_stats"] = True
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": spec.output_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": stream_options,
        }
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

    @staticmethod
    def new_record(spec: RequestSpec, warmup: bool | None = None) -> RequestRecord:
        return RequestRecord(
            request_id=spec.request_id,
            task=spec.task,
            slo=spec.slo,
            prompt_tokens=spec.prompt_tokens,
            max_tokens=spec.output_tokens,
            scheduled_s=spec.arrival_s,
            arrival_s=spec.arrival_s,
            warmup=spec.warmup if warmup is None else warmup,
            client_id=spec.client_id,
        )

    async def send(
        self,
        spec: RequestSpec,
        run_start: float,
        record: RequestRecord | None = None,
        *,
        ready_s: float | None = None,
    ) -> RequestRecord:
        """Send one request now and fill `record` (created from `spec` if not given).

        `run_start` is the time.perf_counter() value of the run's time zero. `ready_s` (run clock) is when
        the client was ready to send it, if it then waited for an in-flight slot: latency counts from there
        (see RequestRecord.arrival_s). On cancellation the record is marked CANCELLED and the CancelledError
        propagates.
        """
        if record is None:
            record = self.new_record(spec)
        body = self.request_body(spec)
        stream = _StreamState(self.continuous_usage)
        record.sent_s = time.perf_counter() - run_start
        record.arrival_s = record.sent_s if ready_s is None else ready_s
        try:
            async with asyncio.timeout(self.request_timeout_s):
                await self._stream(body, run_start, stream)
            record.status = Status.OK
        except _StreamFailure as failure:
            record.status = failure.status
            record.error = failure.message
        except TimeoutError:
            record.status = Status.TIMEOUT
            record.error = f"no complete response within {self.request_timeout_s:g} s"
        except httpx.TimeoutException as exc:
            record.status = Status.TIMEOUT
            record.error = f"{type(exc).__name__}: {exc or 'timed out'}"
        except TRANSPORT_ERRORS as exc:
            phase = "stream broken" if stream.chunk_times else "connection failed"
            record.status = Status.ERROR
            record.error = f"{phase}: {type(exc).__name__}: {exc}"
            if self.on_transport_error is not None:
                self.on_transport_error(exc)
        except httpx.HTTPError as exc:
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

    async def _stream(self, body: dict[str, Any], run_start: float, stream: _StreamState) -> None:
        async with self.http.stream("POST", self.url, json=body) as response:
            if response.status_code >= 400:
                raw = await response.aread()
                text = raw.decode("utf-8", errors="replace")
                raise _StreamFailure(Status.ERROR, f"HTTP {response.status_code}: {_snippet(text)}")
            async for line in response.aiter_lines():
                now = time.perf_counter() - run_start
                if not line.startswith("data:"):
                    continue  # blank separators, SSE comments and event/id fields carry no tokens
                payload = line[len("data:") :].strip()
                if payload == "[DONE]":
                    stream.done_s = now
                    return
                try:
                    data = json.loads(payload)
                except json.JSONDecodeError as exc:
                    raise _StreamFailure(Status.ERROR, f"malformed SSE JSON ({exc.msg}): {_snippet(payload)}") from None
                stream.add(data, now)
        if not stream.finished:
            raise _StreamFailure(Status.ERROR, "stream ended before [DONE] or a finish_reason")


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
        if usage.get("prompt_tokens") is not None:
            self.prompt_tokens = int(usage["prompt_tokens"])
        if not choices:
            # The closing usage chunk (choices == []) carries the totals.
            if usage.get("completion_tokens") is not None:
                self.final_completion_tokens = int(usage["completion_tokens"])
            return
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
        if usage.get("completion_tokens") is not None:
            self.usage_per_chunk = True
            cumulative = int(usage["completion_tokens"])
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


def _chunk_text(choice: dict[str, Any]) -> str:
    if "text" in choice:
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or ""
