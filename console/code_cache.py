"""A bytecode cache for the methods `dataclasses` generates and the string annotations `typing` compiles,
kept across runs like a `.pyc`.

Python 3.11's `@dataclass` writes each class's `__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__`
and `__delattr__` as source text and compiles it with `exec`, in every process, every time: the ~86
dataclasses a batch run creates (36 of them the project's, the rest pydantic's and annotated_types') made
366 such texts, 0.21 MB of source whose parsing and compiling was 8% of a one-request `--batch` run's
instructions (docs/speed-log.md, "Start-up: generated code"). The compiled code objects depend only on that
text and the interpreter, so this module keeps them in a marshal file beside the package's `.pyc` files and
hands `dataclasses` the cached code object instead of the text: `exec(code)` makes the same functions as
`exec(text)` (compiled here with the same filename and mode, and without inheriting this module's compiler
flags, as `exec` in `dataclasses` compiles them). The same for `typing.ForwardRef`, which compiles each
string annotation it meets (737 of them, most in pydantic_core's TypedDicts: 3% of the run), and for
`collections.namedtuple`, which `eval`s each class's `__new__` from text.

Like `.pyc` files: the cache is read whenever it is there, written only when something was missing and
`sys.dont_write_bytecode` is off, atomically, and any failure to read or write it just means compiling as
before. The file is keyed by the interpreter's cache tag and magic number, each entry by the full text.
"""

import builtins
import importlib.util
import marshal
import os
import sys
from pathlib import Path
from typing import Any

# The cache file's first bytes: a file written by another interpreter version is ignored.
_MAGIC = importlib.util.MAGIC_NUMBER
# A cache that grew past this many texts (dataclasses edited many times) is started afresh.
MAX_ENTRIES = 4000


class CodeCache:
    def __init__(self, path: Path, default_globals: dict[str, Any]) -> None:
        self.path = path
        # `exec(text, None, ns)` in `dataclasses` would run in its module's namespace (it always passes one).
        self.default_globals = default_globals
        self.codes: dict[tuple[str, str], Any] = {}  # (mode, source text) -> code
        self.missed = False
        try:
            data = path.read_bytes()
            if data.startswith(_MAGIC):
                codes = marshal.loads(data[len(_MAGIC) :])
                if isinstance(codes, dict):
                    self.codes = codes
        except (OSError, ValueError, EOFError, TypeError):
            pass

    def exec(self, source: Any, globals: Any = None, locals: Any = None) -> None:
        """`exec` as `dataclasses` calls it, with a text's compiled code looked up first."""
        if isinstance(source, str):
            source = self.compile(source, "<string>", "exec")
        builtins.exec(source, self.default_globals if globals is None else globals, locals)

    def compile(self, source: Any, filename: Any, mode: str, *args: Any, **kwargs: Any) -> Any:
        """`compile` as `typing.ForwardRef` calls it (`compile(text, "<string>", "eval")`), cached; any other
        call compiles as asked."""
        if args or kwargs or filename != "<string>" or not isinstance(source, str):
            return builtins.compile(source, filename, mode, *args, **kwargs)
        key = (mode, source)
        code = self.codes.get(key)
        if code is None:
            # A SyntaxError propagates as from `compile` itself, and nothing is cached.
            code = builtins.compile(source, filename, mode, dont_inherit=True)
            self.codes[key] = code
            self.missed = True
        return code

    def eval(self, source: Any, globals: Any = None, locals: Any = None) -> Any:
        """`eval` as `collections.namedtuple` calls it (`eval(text, namespace)`), with the text's code cached."""
        if isinstance(source, str):
            # `eval` strips a text's leading spaces and tabs before compiling it; `compile` does not.
            source = self.compile(source.lstrip(" \t"), "<string>", "eval")
        if globals is None:  # namedtuple always passes its namespace; otherwise evaluate where `eval` would
            caller = sys._getframe(1)
            return builtins.eval(source, caller.f_globals, caller.f_locals if locals is None else locals)
        return builtins.eval(source, globals, locals)

    def save(self) -> None:
        if not self.missed or sys.dont_write_bytecode:
            return
        codes = self.codes if len(self.codes) <= MAX_ENTRIES else {}
        partial = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(exist_ok=True)
            partial.write_bytes(_MAGIC + marshal.dumps(codes))
            os.replace(partial, self.path)
            self.missed = False
        except (OSError, ValueError):
            partial.unlink(missing_ok=True)


def install() -> CodeCache | None:
    """Route `dataclasses`' `exec`, `typing`'s `compile` and `collections`' `eval` through the cache (call
    before the imports that define dataclasses); returns the cache, whose `save()` the caller runs once the
    imports are done."""
    import collections
    import dataclasses
    import typing

    # Only where dataclasses compiles its methods through the module-level name `exec` (CPython 3.11,
    # the version this project runs on); anything else keeps compiling as before.
    if sys.version_info[:2] != (3, 11) or not hasattr(dataclasses, "_create_fn") or hasattr(typing, "compile"):
        return None
    if hasattr(collections, "eval"):
        return None
    cache_tag = sys.implementation.cache_tag
    if cache_tag is None:
        return None
    cache = CodeCache(Path(__file__).parent / "__pycache__" / f"generated-code.{cache_tag}.marshal", vars(dataclasses))
    dataclasses.exec = cache.exec  # type: ignore[attr-defined]
    # Each string annotation typing evaluates is compiled once per process as a ForwardRef: 737 of them (most
    # in pydantic_core's TypedDicts), 3% of the run.
    typing.compile = cache.compile  # type: ignore[attr-defined]
    # Each namedtuple's `__new__` is a lambda `eval`ed from text: 34 of them, 0.7% of the run.
    collections.eval = cache.eval  # type: ignore[attr-defined]
    return cache
