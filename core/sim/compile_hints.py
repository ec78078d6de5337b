"""mypyc's class decorator, or a no-op where mypy_extensions is not installed.

`@mypyc_attr(allow_interpreted_subclasses=True)` only informs mypyc (setup.py compiles the hot modules on a
regular install): plain Python needs nothing from it, so a pure install does not need mypy_extensions. mypy
resolves the name through this module to `mypy_extensions.mypyc_attr`, which is what mypyc looks for.
"""

from __future__ import annotations

from typing import Any

try:
    from mypy_extensions import mypyc_attr
except ImportError:  # pure Python without mypy_extensions: the decorator changes nothing at run time

    def mypyc_attr(*_args: Any, **_kwargs: Any) -> Any:  # type: ignore[no-redef]
        return lambda cls: cls


__all__ = ["mypyc_attr"]
