"""RequestRecord.from_spec builds a record positionally (it is on the simulator's per-request path): every
field of the record must come from its own argument or the spec's field, with the record's own defaults.

The signature is read from this checkout's core/records.py loaded as plain Python: a compiled install
(setup.py compiles core.records with mypyc) keeps no Python signature. The behaviour is the imported
module's, compiled or not, fed a value of each argument's own type (compiled code refuses any other)."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import sys
from types import ModuleType
from typing import Any

import numpy as np

from core.records import RequestRecord, RequestSLO, RequestSpec, Status
from tests.fakes import REPO

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


def _source_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_records_source", REPO / "core" / "records.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses looks its module up
    spec.loader.exec_module(module)
    return module


SOURCE = _source_module()


def _arguments() -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(SOURCE.RequestRecord.from_spec).parameters
    return {name: p for name, p in parameters.items() if name != "spec"}


def _distinct_values(names: list[str]) -> dict[str, Any]:
    """A value of each argument's annotated type, no two alike and none a default: a swapped position shows."""
    made = {
        "float": lambda i: 1000.0 + i,
        "int": lambda i: 1000 + i,
        "str": lambda i: f"value-{i}",
        "bool": lambda i: False,  # one bool argument (warmup); the spec's flag is True
        "Status": lambda i: Status.REJECTED,  # one Status argument
        "np.ndarray": lambda i: np.array([1000.0 + i]),
    }
    parameters = inspect.signature(SOURCE.RequestRecord.from_spec).parameters
    return {name: made[parameters[name].annotation.split(" |")[0]](i) for i, name in enumerate(names)}


def _same(a: Any, b: Any) -> bool:
    return np.array_equal(a, b) if isinstance(b, np.ndarray) else type(a) is type(b) and a == b


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
    assert fields == {f.name for f in dataclasses.fields(SOURCE.RequestRecord)}
    assert set(_arguments()) | set(FROM_SPEC) == fields
    assert not set(_arguments()) & set(FROM_SPEC)


def test_each_argument_lands_in_its_own_field() -> None:
    spec = _spec()
    values = _distinct_values(list(_arguments()))
    record = RequestRecord.from_spec(spec, **values)
    for name, value in values.items():
        assert _same(getattr(record, name), value), name
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
    values = _distinct_values([*names, "dispatched_s"])
    record = RequestRecord.served(spec, *values.values())
    expected = RequestRecord.from_spec(spec, status=Status.OK, output_tokens=spec.output_tokens, **values)
    for field in dataclasses.fields(RequestRecord):
        assert _same(getattr(record, field.name), getattr(expected, field.name)), field.name
    assert record.status is Status.OK and record.output_tokens == 13 and record.error is None
