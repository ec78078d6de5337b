"""Property-based tests of the parsers that read a server's answers (issue 25, item 3): the gateway's SSE token
counter, the load client's SSE reader, the gateway's request reader and the /metrics parser.

The property: whatever an upstream or a client sends, each parser gives a valid result or its one documented
failure (the client's `_StreamFailure` with a one-line cause, `BadGatewayRequest`, `ValueError` for
/metrics) -- never another exception, which would end a gateway handler with a traceback and a request
counted under the wrong cause, or a live run's metrics sampler. Settings: tests/test_parsers_fuzz.py.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from core.backends.http_client import _read_line, _StreamFailure, _StreamState
from core.gateway.protocol import (
    BadGatewayRequest,
    SSETokenCounter,
    completion_tokens,
    parse_event,
    read_request_meta,
)
from core.records import RequestRecord, RequestSpec
from core.serve.prom import KNOWN_SAMPLE_NAMES, VllmMetrics, parse_metrics
from tests.test_parsers_fuzz import fuzz, values

# ---------------------------------------------------------------- stream events

numbers = st.one_of(st.integers(-3, 10**6), st.floats(allow_nan=False), st.just(2**64), st.sampled_from(["7", "x"]))
odd = st.one_of(values, numbers)
usage = st.one_of(
    st.none(),
    st.fixed_dictionaries({}, optional={"completion_tokens": odd, "prompt_tokens": odd, "total_tokens": odd}),
    odd,
)
choice = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "text": st.one_of(st.text(max_size=5), odd),
            "delta": st.one_of(st.fixed_dictionaries({}, optional={"content": odd, "reasoning_content": odd}), odd),
            "finish_reason": st.one_of(st.none(), st.sampled_from(["length", "stop"]), odd),
            "index": odd,
        },
    ),
    odd,
)
event_objects = st.fixed_dictionaries(
    {},
    optional={
        "choices": st.one_of(st.lists(choice, max_size=2), odd),
        "usage": usage,
        "error": st.one_of(st.fixed_dictionaries({"message": st.text(max_size=8)}), odd),
        "meta": st.fixed_dictionaries({}, optional={"error": odd}),  # an "error" key that is not the event's
        "id": st.text(max_size=4),
    },
)


@st.composite
def sse_lines(draw: st.DrawFn) -> list[bytes]:
    """Lines of an SSE stream: events shaped like an OpenAI stream's (with odd types anywhere), [DONE],
    comments, and bytes that are no event at all."""
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["event", "event", "event", "done", "json", "raw", "blank", "comment"]))
        if kind == "event":
            separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
            lines.append(b"data: " + json.dumps(draw(event_objects), separators=separators).encode())
        elif kind == "done":
            lines.append(b"data: [DONE]")
        elif kind == "json":
            lines.append(b"data:" + json.dumps(draw(values)).encode())
        elif kind == "raw":
            lines.append(b"data: " + draw(st.binary(max_size=12)).replace(b"\n", b""))
        elif kind == "blank":
            lines.append(b"")
        else:
            lines.append(b": keep-alive")
    return lines


@fuzz(300)
@given(st.one_of(st.binary(max_size=30), event_objects.map(lambda e: json.dumps(e).encode())))
def test_parse_event_reads_any_payload(payload: bytes) -> None:
    read = parse_event(payload)
    if isinstance(read, tuple):
        usage_tokens, has_text, finished = read
        assert usage_tokens is None or (isinstance(usage_tokens, int) and usage_tokens >= 0)
        assert isinstance(has_text, bool) and isinstance(finished, bool)
    else:
        assert read is None or isinstance(read, str)


@fuzz(300)
@given(sse_lines(), st.sampled_from([b"\n", b"\r\n"]), st.lists(st.integers(1, 400), max_size=6))
def test_the_gateways_counter_reads_any_stream_however_it_is_cut(
    lines: list[bytes], end: bytes, cuts: list[int]
) -> None:
    stream = b"".join(line + end + end for line in lines)
    whole = SSETokenCounter()
    whole.feed(stream)
    pieces = SSETokenCounter()
    positions = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    for start, stop in itertools.pairwise(positions):
        pieces.feed(stream[start:stop])
    state = (whole.tokens, whole.finished, whole.done, whole.error)
    assert state == (pieces.tokens, pieces.finished, pieces.done, pieces.error)
    assert isinstance(whole.tokens, int) and whole.tokens >= 0
    assert whole.error is None or len(whole.error.splitlines()) <= 1


@fuzz(300)
@given(sse_lines())
def test_the_clients_stream_reader_fails_a_bad_stream_in_one_line(lines: list[bytes]) -> None:
    stream = _StreamState(continuous_usage=True)
    record = RequestRecord.from_spec(RequestSpec(0, 8, 4, arrival_s=0.0))
    try:
        for now, line in enumerate(lines):
            _read_line(line, float(now), stream)
    except _StreamFailure as failure:
        assert len(failure.message.splitlines()) == 1 and failure.message
    stream.fill(record, float(len(lines)))
    assert isinstance(record.output_tokens, int) and record.output_tokens >= 0
    assert len(record.chunk_times) == len(stream.chunk_tokens)


@fuzz(100)
@given(st.one_of(st.binary(max_size=40), values.map(lambda v: json.dumps(v).encode())))
def test_a_non_streamed_answer_has_a_token_count(body: bytes) -> None:
    assert completion_tokens(body) >= 0


# ---------------------------------------------------------------- a client's request to the gateway

header_values = st.one_of(st.sampled_from(["1.5", "0", "-1", "nan", "inf", "1e400", "", "chat"]), st.text(max_size=6))
headers = st.dictionaries(
    st.sampled_from(["x-task", "x-request-id", "x-slo-sent-at", "x-slo-e2e-s", "x-slo-ttft-s", "x-slo-tpot-s"]),
    header_values,
)
bodies = st.fixed_dictionaries(
    {},
    optional={
        "prompt": odd,
        "messages": st.one_of(st.lists(st.one_of(st.fixed_dictionaries({"content": odd}), odd), max_size=3), odd),
        "max_tokens": odd,
        "max_completion_tokens": odd,
        "stream": odd,
        "slo": st.one_of(
            st.fixed_dictionaries(
                {}, optional={"task": odd, "e2e_s": odd, "ttft_s": odd, "tpot_s": odd, "request_id": odd}
            ),
            odd,
        ),
    },
)


@fuzz(300)
@given(headers, bodies)
def test_the_gateway_reads_any_request_or_answers_400(head: dict[str, str], body: dict[str, Any]) -> None:
    try:
        meta = read_request_meta(head, body, None)
    except BadGatewayRequest as exc:
        assert len(str(exc).splitlines()) == 1
        return
    assert meta.max_tokens >= 1 and meta.prompt_tokens >= 0
    for objective in (meta.slo.e2e_s, meta.slo.ttft_s, meta.slo.tpot_s):
        assert objective is None or (math.isfinite(objective) and objective > 0)


# ---------------------------------------------------------------- /metrics

sample_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "0", "3", "abc", ""]),
)
label_values = st.one_of(st.sampled_from(["0.1", "1", "+Inf", "NaN", "-1", "abc", ""]), st.text(max_size=4))


@st.composite
def metrics_texts(draw: st.DrawFn) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 10))):
        name = draw(st.sampled_from(sorted(KNOWN_SAMPLE_NAMES)))
        labels = draw(st.dictionaries(st.sampled_from(["le", "model_name", "engine"]), label_values, max_size=2))
        rendered = ",".join(f'{k}="{json.dumps(v)[1:-1]}"' for k, v in labels.items())
        lines.append(f"{name}{{{rendered}}} {draw(sample_values)}" if labels else f"{name} {draw(sample_values)}")
    if draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), draw(st.text(max_size=20)).replace("\n", " "))
    return "\n".join(lines) + "\n"


@fuzz(150)
@given(metrics_texts())
def test_metrics_parse_or_raise_value_error_and_the_snapshot_is_usable(text: str) -> None:
    try:
        metrics = parse_metrics(text)
    except ValueError:
        return
    assert isinstance(metrics, VllmMetrics)
    metrics.to_engine_sample(1.0)
    metrics.since(metrics)
    for histogram in (metrics.e2e_latency_s, metrics.ttft_s, metrics.inter_token_latency_s):
        if histogram is not None:
            histogram.quantile(0.99)
            histogram.bucket_of(1.0)
