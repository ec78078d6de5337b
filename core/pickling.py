"""How the dataclasses of compiled modules pickle: by their fields, alike in the compiled and the pure build.

Every dataclass in a module of `core.COMPILED_MODULES` returns `reduce_by_fields(self)` from its `__reduce__`
(tests/test_compiled.py checks each has one). Why not the default pickling:
- such objects cross processes (`--workers`, Ray), and a Ray worker can run the pure sources of the driver's
  working directory while the driver runs the compiled install: mypyc's default pickling of a native class and
  Python's of a slots dataclass cannot read each other's (a pure RequestRecord loads into a compiled one with
  no field set);
- mypyc's own pickling restores through setattr, which a frozen dataclass refuses.
Both builds construct a dataclass alike from its fields in order, so that is what crosses.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any


def reduce_by_fields(obj: Any) -> tuple[Any, tuple[Any, ...]]:
    """`obj.__reduce__()` for a dataclass: its class and its field values in declaration order."""
    return (type(obj), tuple(getattr(obj, f.name) for f in fields(obj)))
