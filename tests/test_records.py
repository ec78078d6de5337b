"""RequestRecord.from_spec builds a record positionally (it is on the simulator's per-request path): every
field of the record must come from its own argument or the spec's field, with the record's own defaults."""

from __future__ import annotations

import dataclasses
import inspect

from core.records import RequestRecord, RequestSLO, RequestSpec, Status

# Record field <- spec field.
FROM_SPEC = {
    "request_id": "request_id",
    "task": "task",
    "slo": "slo",
    "prompt_tokens": "prompt_tokens",
    "max_tokens": "output_tokens",
    "scheduled_s": "arrival_s",
    "client_id": "client_id",
}
# Arguments that default to the spec's value rather than the record's default.
SPEC_DEFAULTED = {"arrival_s": "arrival_s", "warmup": "warmup"}


def _arguments() -> dict[str, inspect.Parameter]:
    return {name: p for name, p in inspect.signature(RequestRecord.from_spec).parameters.items() if name != "spec"}


def _spec() -> RequestSpec:
    return RequestSpec(
        request_id=7,
        prompt_tokens=11,
        output_tokens=13,
        arrival_s=1.5,
        task="t",
        slo=RequestSLO(e2e_s=2.0),
        warmup=True,
        client_id=3,
    )


def test_every_record_field_is_an_argument_or_the_specs() -> None:
    fields = {f.name for f in dataclasses.fields(RequestRecord)}
    assert set(_arguments()) | set(FROM_SPEC) == fields
    assert not set(_arguments()) & set(FROM_SPEC)


def test_each_argument_lands_in_its_own_field() -> None:
    spec = _spec()
    values = {name: object() for name in _arguments()}  # distinct sentinels: a swapped position shows
    record = RequestRecord.from_spec(spec, **values)
    for name, value in values.items():
        assert getattr(record, name) is value, name
    for field, spec_field in FROM_SPEC.items():
        assert getattr(record, field) == getattr(spec, spec_field), field


def test_defaults_are_the_records_own_or_the_specs() -> None:
    spec = _spec()
    record = RequestRecord.from_spec(spec)
    defaults = {f.name: f.default for f in dataclasses.fields(RequestRecord) if f.default is not dataclasses.MISSING}
    for name, parameter in _arguments().items():
        if name in SPEC_DEFAULTED:
            assert getattr(record, name) == getattr(spec, SPEC_DEFAULTED[name]), name
        else:
            assert parameter.default == defaults[name], name
            assert getattr(record, name) == defaults[name], name


def test_served_is_from_spec_of_a_served_request() -> None:
    spec = _spec()
    names = ("arrival_s", "sent_s", "end_s", "chunk_times", "chunk_tokens", "preemptions", "tier", "replica")
    values = {name: object() for name in (*names, "dispatched_s")}  # distinct sentinels: a swapped position shows
    record = RequestRecord.served(spec, *values.values())
    expected = RequestRecord.from_spec(spec, status=Status.OK, output_tokens=spec.output_tokens, **values)
    for field in dataclasses.fields(RequestRecord):
        assert getattr(record, field.name) == getattr(expected, field.name), field.name
    assert record.status is Status.OK and record.output_tokens == 13 and record.error is None
