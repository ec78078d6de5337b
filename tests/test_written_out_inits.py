"""The compiled modules' dataclasses that write their __init__ out (admission.py's NATIVE_INIT: mypyc calls a
class's own __init__ natively, the generated one through the interpreter) keep the generated one's contract:
the same parameters in field order, the same defaults, a fresh container where a field has a default factory,
and every field set. A field added to such a class without its parameter fails here, not in a run.

Each module is read from this checkout's source as plain Python: a compiled install keeps no Python signature
for its native classes (tests/test_records.py does the same)."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import math
import sys
from types import ModuleType
from typing import Any

import pytest

from core import COMPILED_MODULES
from core.control.slos_serve.virtual import round_half_even
from tests.fakes import REPO


def _source(name: str) -> ModuleType:
    alias = "_source_" + name.replace(".", "_")
    spec = importlib.util.spec_from_file_location(alias, REPO / (name.replace(".", "/") + ".py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module  # dataclasses looks its module up
    spec.loader.exec_module(module)
    return module


def _written_out() -> list[type]:
    found = []
    for name in COMPILED_MODULES:
        module = _source(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and value.__module__ == module.__name__
                and dataclasses.is_dataclass(value)
                and "__init__" in value.__dict__
                # the generated __init__ is compiled from a string; a written-out one from the module's file
                and value.__init__.__code__.co_filename == module.__file__
            ):
                found.append(value)
    return found


WRITTEN_OUT = _written_out()


def test_the_simulators_per_request_classes_write_their_init_out() -> None:
    names = {cls.__name__ for cls in WRITTEN_OUT}
    assert {"RequestRecord", "SimRequest", "StepRequest", "PlanRequest", "StepBatch"} <= names


def _required(field: dataclasses.Field[Any]) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


@pytest.mark.parametrize(
    "cls", WRITTEN_OUT, ids=lambda cls: f"{cls.__module__.removeprefix('_source_')}.{cls.__name__}"
)
def test_a_written_out_init_matches_the_dataclass_fields(cls: type) -> None:
    fields = [f for f in dataclasses.fields(cls) if f.init]
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, field in zip(parameters, fields, strict=True):
        if _required(field):
            assert parameter.default is inspect.Parameter.empty, field.name
        elif field.default_factory is not dataclasses.MISSING:
            assert parameter.default is None, f"{field.name}: None stands for a fresh {field.default_factory}"
        else:
            assert parameter.default == field.default or (
                isinstance(field.default, float) and math.isnan(field.default) and math.isnan(parameter.default)
            ), field.name
    # Built from its required arguments alone: every field set, each default as the dataclass gives it, and a
    # fresh container per instance where the field has a factory.
    required = {f.name: object() for f in fields if _required(f)}
    first, second = cls(**required), cls(**required)
    for field in dataclasses.fields(cls):
        value = getattr(first, field.name)
        if field.name in required:
            assert value is required[field.name]
        elif field.default_factory is not dataclasses.MISSING:
            assert value == field.default_factory() and value is not getattr(second, field.name), field.name
        else:
            assert value == field.default or value is field.default, field.name


@pytest.mark.parametrize(
    "x",
    [
        0.0,
        -0.0,
        0.5,
        -0.5,
        1.5,
        -1.5,
        2.5,
        -2.5,
        0.49999999999999994,
        -0.49999999999999994,
        1e-300,
        3.4999,
        2.0**52 + 1,
        2.0**53,
        -(2.0**53) - 2,
        1e300,
        123456.5,
        123457.5,
        7.0,
    ],
)
def test_round_half_even_is_round(x: float) -> None:
    assert round_half_even(x) == round(x) and type(round_half_even(x)) is int


@pytest.mark.parametrize("x", [math.nan, math.inf, -math.inf])
def test_round_half_even_refuses_what_round_refuses(x: float) -> None:
    with pytest.raises(type(_error_of(round, x))):
        round_half_even(x)


def _error_of(function: Any, x: float) -> BaseException:
    try:
        function(x)
    except (ValueError, OverflowError) as exc:
        return exc
    raise AssertionError("round accepted it")
