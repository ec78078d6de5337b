"""What the admission gateway reads from and writes to the wire, defined once for the gateway and the client.

A request tells the gateway its task and SLO in either of two ways (both optional; the gateway removes them
before forwarding, so the upstream server never sees them):
- headers: `x-task: NAME`, `x-slo-e2e-s: SECONDS`, `x-slo-ttft-s: SECONDS`, `x-slo-tpot-s: SECONDS`,
  `x-request-id: ID` (the caller's own id, echoed in the gateway's events), `x-slo-sent-at: UNIX_SECONDS`
  (when the client sent it: its SLO counts from there, see `sent_before_s`);
- a JSON field in the body: `"slo": {"task": NAME, "e2e_s": S, "ttft_s": S, "tpot_s": S, "request_id": ID}`.
Header values win over body fields. What neither gives comes from the profile: the task's SLO, else the
profile's SLO. The number of output tokens the policy plans for is the body's `max_tokens` (or
`max_completion_tokens`), else `DEFAULT_MAX_TOKENS`.

The gateway's own answers are OpenAI-style error bodies, `{"error": {"type", "message", "code"}}`:
- 429, type `rejected`: the mode refused the request (the reason is the message);
- 503, type `deferred`: held in a mode's queue and never served before the gateway stopped or the run ended;
- 502, type `upstream_error`: the upstream server could not be reached or broke the stream;
- 400, type `invalid_request`: the body or an SLO field could not be read.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.profile import Profile
from core.records import RequestSLO, RequestSpec

SLO_BODY_FIELD = "slo"
HEADER_TASK = "x-task"
HEADER_REQUEST_ID = "x-request-id"
HEADER_SENT_AT = "x-slo-sent-at"
SLO_HEADERS = {"e2e_s": "x-slo-e2e-s", "ttft_s": "x-slo-ttft-s", "tpot_s": "x-slo-tpot-s"}
GATEWAY_HEADERS = frozenset({HEADER_TASK, HEADER_REQUEST_ID, HEADER_SENT_AT, *SLO_HEADERS.values()})

# max_tokens the policy plans for when a request does not say (the OpenAI completions API's default is 16;
# chat has no fixed default). A request that sets max_tokens gets exactly that.
DEFAULT_MAX_TOKENS = 256
# Characters per prompt token when the gateway estimates a text prompt's length (no tokenizer here).
CHARS_PER_TOKEN = 4.0

ERROR_REJECTED = "rejected"
ERROR_DEFERRED = "deferred"
ERROR_UPSTREAM = "upstream_error"
ERROR_INVALID = "invalid_request"


class BadGatewayRequest(ValueError):
    """A request the gateway cannot read (HTTP 400); the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """What the gateway learned about one request before asking the policy."""

    task: str
    slo: RequestSLO
    max_tokens: int
    prompt_tokens: int
    stream: bool
    client_request_id: str | None
    sent_unix_s: float | None = None  # the client's `x-slo-sent-at`, when it gave one


def sent_before_s(meta: RequestMeta, now_unix_s: float) -> float:
    """How long before it reached the gateway the client sent this request (its `x-slo-sent-at`): the request's
    deadline counts from the client's send, as the user's clock does (SABER's deadline is the user's, paper 001
    sec. IV-C step 1), not from the moment the gateway got to read it. On a busy machine that gap was 0.5-1 s
    at the median (client and gateway sharing starved cores, 2026-11-24), most of a 2 s SLO. The client's clock
    must agree with the gateway's (one machine, or synchronised clocks): the gap is kept within 0 and the
    request's e2e SLO, so a skewed clock can neither add time nor make more than this request look late."""
    if meta.sent_unix_s is None:
        return 0.0
    gap = now_unix_s - meta.sent_unix_s
    bound = meta.slo.e2e_s if meta.slo.e2e_s is not None else 0.0
    return min(max(0.0, gap), bound)


def error_body(kind: str, message: str, code: int) -> dict[str, Any]:
    return {"error": {"type": kind, "message": message, "code": code}}


def slo_fields(spec: RequestSpec) -> dict[str, Any]:
    """The body field a load client adds so the gateway knows the request's task, SLO and id."""
    fields: dict[str, Any] = {"task": spec.task, "request_id": spec.request_id}
    for name in ("e2e_s", "ttft_s", "tpot_s"):
        value = getattr(spec.slo, name)
        if value is not None:
            fields[name] = value
    return {SLO_BODY_FIELD: fields}


def _seconds(value: Any, where: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise BadGatewayRequest(f"{where} must be a number of seconds (got {value!r})") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise BadGatewayRequest(f"{where} must be positive seconds (got {value!r})")
    return seconds


def profile_slo(profile: Profile | None, task: str) -> RequestSLO:
    """The SLO a request of `task` gets when it names none: the task's, else the profile's."""
    if profile is None:
        return RequestSLO()
    spec = next((t.slo for t in profile.workload.tasks if t.name == task and t.slo is not None), profile.slo)
    return RequestSLO(e2e_s=spec.e2e_s, ttft_s=spec.ttft_s, tpot_s=spec.tpot_s)


def default_task(profile: Profile | None) -> str:
    """A request that names no task belongs to the profile's only task, else to "default"."""
    if profile is not None and len(profile.workload.tasks) == 1:
        return profile.workload.tasks[0].name
    return "default"


def _prompt_tokens(body: Mapping[str, Any]) -> int:
    prompt = body.get("prompt")
    if prompt is None and isinstance(body.get("messages"), list):
        prompt = " ".join(str(m.get("content", "")) for m in body["messages"] if isinstance(m, dict))
    if isinstance(prompt, list):  # token ids, or a batch of prompts
        return len(prompt) if all(isinstance(t, int) for t in prompt) else sum(len(str(p)) for p in prompt) // 4
    return max(1, math.ceil(len(str(prompt or "")) / CHARS_PER_TOKEN))


def read_request_meta(headers: Mapping[str, str], body: dict[str, Any], profile: Profile | None) -> RequestMeta:
    """Task, SLO, token counts and id of one request; removes the gateway's body field from `body`."""
    fields = body.pop(SLO_BODY_FIELD, None)
    if fields is None:
        fields = {}
    if not isinstance(fields, dict):
        raise BadGatewayRequest(f'"{SLO_BODY_FIELD}" must be an object like {{"task": "chat", "e2e_s": 2.0}}')
    task = str(headers.get(HEADER_TASK) or fields.get("task") or default_task(profile))
    fallback = profile_slo(profile, task)
    values: dict[str, float | None] = {}
    for name, header in SLO_HEADERS.items():
        if header in headers:
            values[name] = _seconds(headers[header], f"header {header}")
        elif fields.get(name) is not None:
            values[name] = _seconds(fields[name], f'"{SLO_BODY_FIELD}.{name}"')
        else:
            values[name] = getattr(fallback, name)
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    elif not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadGatewayRequest(f"max_tokens must be a positive integer (got {max_tokens!r})")
    client_id = headers.get(HEADER_REQUEST_ID) or fields.get("request_id")
    sent_at = headers.get(HEADER_SENT_AT)
    return RequestMeta(
        task=task,
        slo=RequestSLO(**values),
        max_tokens=max_tokens,
        prompt_tokens=_prompt_tokens(body),
        stream=bool(body.get("stream", False)),
        client_request_id=None if client_id is None else str(client_id),
        sent_unix_s=None if sent_at is None else _seconds(sent_at, f"header {HEADER_SENT_AT}"),
    )


# What the counter reads from each streamed event, found by a byte scan instead of parsing the event. Inside a
# JSON string every quote is escaped (\"), so `"key"` followed by a colon only ever matches a real key, never
# text the model wrote. The patterns accept compact (vLLM's) and spaced (json.dumps) separators.
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_TEXT = re.compile(rb'"(?:text|content)"\s*:\s*"[^"]')  # a non-empty text or delta content
_FINISH_REASON = re.compile(rb'"finish_reason"\s*:\s*(?!null\b)\S')  # finish_reason other than null
_ERROR_KEY = b'"error"'


class SSETokenCounter:
    """Counts output tokens in an OpenAI-style SSE stream fed chunk by chunk, as they pass through.

    With vLLM's per-chunk usage (`continuous_usage_stats`) the count is the cumulative completion_tokens;
    otherwise one token per event that carries text. A closing usage chunk's total wins. `finished` is True
    once the stream sent `[DONE]` or a finish_reason; `done` once it sent `[DONE]`, the last event of an
    OpenAI stream; `error` holds an in-stream error object.

    Events are scanned as bytes (`scan_event`), not parsed: the gateway relays every chunk of every stream,
    and JSON-decoding each one cost more than all its other per-chunk work. An event that is not a JSON
    object, or that has an "error" key, is parsed in full (`parse_event`); a test holds the two to the same
    answers.
    """

    def __init__(self) -> None:
        self._partial = b""
        self.tokens = 0
        self.finished = False
        self.done = False
        self.error: str | None = None

    @property
    def at_event_boundary(self) -> bool:
        """True when everything fed so far ended with a complete line (no event cut in two)."""
        return not self._partial

    def feed(self, data: bytes) -> None:
        if self._partial:
            data = self._partial + data
        cut = data.rfind(b"\n") + 1  # everything before `cut` is complete lines
        self._partial = data[cut:]
        if cut and (data.find(_ERROR_KEY, 0, cut) >= 0 or not self._feed_from_the_end(data, cut)):
            for line in data[:cut].split(b"\n"):
                if line.startswith(b"data:"):
                    self._event(line[5:].strip())

    def _feed_from_the_end(self, data: bytes, cut: int) -> bool:
        """Read the complete lines `data[:cut]` (no "error" key among them) from the last event backwards,
        stopping as soon as the earlier events cannot change the answer: a usage count supersedes every
        count before it, and `finished` and `done` only ever become true. When several events arrive in
        one read (a stream that got ahead of the gateway) this scans one or two of them instead of all.
        Returns False, having changed nothing, at an event that is not a JSON object (the caller then
        reads the lines in order, as `_event` does)."""
        usage_tokens: int | None = None
        text_events = 0  # events with text after the last usage count
        finished, done = self.finished, self.done
        end = cut - 1  # the newline that ends the last complete line
        while end >= 0:
            start = data.rfind(b"\n", 0, end) + 1
            line = data[start:end]
            end = start - 1
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                finished = done = True
                continue
            if payload[:1] != b"{":
                return False
            if usage_tokens is None:
                usage, has_text, event_finished = scan_event(payload)
                if usage is not None:
                    usage_tokens = usage
                elif has_text:
                    text_events += 1
                finished = finished or event_finished
            elif not finished:
                finished = _FINISH_REASON.search(payload) is not None
            if usage_tokens is not None and finished and (done or data.rfind(b"[DONE]", 0, end + 1) < 0):
                break  # nothing earlier can change the count, finished or done
        self.tokens = (self.tokens if usage_tokens is None else usage_tokens) + text_events
        self.finished, self.done = finished, done
        return True

    def _event(self, payload: bytes) -> None:
        if payload == b"[DONE]":
            self.finished = self.done = True
            return
        if payload[:1] == b"{" and _ERROR_KEY not in payload:
            usage_tokens, has_text, finished = scan_event(payload)
        else:
            read = parse_event(payload)
            if read is None:
                return  # not ours to judge: the client sees the same bytes
            if isinstance(read, str):
                self.error = read
                return
            usage_tokens, has_text, finished = read
        if usage_tokens is not None:
            self.tokens = usage_tokens
        elif has_text:
            self.tokens += 1
        if finished:
            self.finished = True


EventFacts = tuple[int | None, bool, bool]  # usage completion_tokens, carries text, has a finish_reason


def scan_event(payload: bytes) -> EventFacts:
    """What one event (a JSON object without an "error" key) says, read by byte patterns."""
    usage = _COMPLETION_TOKENS.search(payload)
    return (
        None if usage is None else int(usage[1]),
        usage is None and _TEXT.search(payload) is not None,
        _FINISH_REASON.search(payload) is not None,
    )


def parse_event(payload: bytes) -> EventFacts | str | None:
    """What one event says, parsed as JSON: its facts, its error (one line), or None when it is no object.
    Fields of the wrong type count as absent, as the byte scan reads them (a count is a whole number >= 0)."""
    try:
        event = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    if "error" in event:
        return " ".join(str(event["error"]).split())[:200]
    usage = event.get("usage")
    choices = event.get("choices")
    choices = choices if isinstance(choices, list) else []
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    usage_tokens = count if isinstance(count, int) and not isinstance(count, bool) and count >= 0 else None
    has_text = False
    if usage_tokens is None and choices and isinstance(choices[0], dict):
        choice = choices[0]
        delta = choice.get("delta")
        has_text = bool(choice.get("text") or (isinstance(delta, dict) and delta.get("content")))
    finished = any(isinstance(c, dict) and c.get("finish_reason") is not None for c in choices)
    return usage_tokens, has_text, finished


def completion_tokens(body: bytes) -> int:
    """Output tokens of a non-streamed completion (its usage), 0 when it does not say."""
    try:
        usage = json.loads(body).get("usage") or {}
        return int(usage.get("completion_tokens") or 0)
    except (ValueError, AttributeError, TypeError):
        return 0
