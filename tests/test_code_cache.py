"""console/code_cache.py: cached generated code behaves as freshly compiled code, and the cache round-trips."""

import dataclasses
import marshal
import sys
from pathlib import Path

import pytest

from console import code_cache
from console.code_cache import CodeCache


def _make_class(cache: CodeCache) -> type:
    original = getattr(dataclasses, "exec", None)
    # dataclasses looks `exec` up as a module global; routed through the cache only while the class is made.
    dataclasses.exec = cache.exec  # type: ignore[attr-defined]
    try:

        @dataclasses.dataclass(frozen=True)
        class Point:
            x: int
            y: float = 0.5
            tags: list[str] = dataclasses.field(default_factory=list)

    finally:
        if original is None:
            del dataclasses.exec  # type: ignore[attr-defined]
        else:
            dataclasses.exec = original  # type: ignore[attr-defined]
    return Point


def test_cached_dataclass_methods_behave_as_compiled_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # written like a .pyc: not where that is off
    path = tmp_path / "generated-code.marshal"
    first = CodeCache(path, vars(dataclasses))
    Point = _make_class(first)
    assert first.missed and first.codes
    first.save()
    assert path.read_bytes().startswith(code_cache._MAGIC)

    second = CodeCache(path, vars(dataclasses))
    assert second.codes.keys() == first.codes.keys()
    Cached = _make_class(second)
    assert not second.missed  # every text was found
    for cls in (Point, Cached):
        p = cls(1)
        assert repr(p).endswith("Point(x=1, y=0.5, tags=[])")
        assert p == cls(1, 0.5, []) and p != cls(2)
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.x = 3  # type: ignore[misc]
        with pytest.raises(TypeError):
            cls()  # type: ignore[call-arg]
        assert cls.__init__.__annotations__ == {"x": int, "y": float, "tags": list[str], "return": None}


def test_forward_ref_compile_is_cached_and_errors_unchanged(tmp_path: Path) -> None:
    cache = CodeCache(tmp_path / "c.marshal", {})
    code = cache.compile("list[int]", "<string>", "eval")
    assert code is cache.compile("list[int]", "<string>", "eval")
    assert eval(code) == list[int]
    with pytest.raises(SyntaxError):
        cache.compile("list[", "<string>", "eval")
    assert ("eval", "list[") not in cache.codes


def test_unreadable_or_foreign_cache_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "c.marshal"
    path.write_bytes(b"not a cache")
    assert CodeCache(path, {}).codes == {}
    path.write_bytes(b"\0\0\0\0" + marshal.dumps({("exec", "x = 1"): compile("x = 1", "<string>", "exec")}))
    assert CodeCache(path, {}).codes == {}


def test_namedtuple_eval_is_cached(tmp_path: Path) -> None:
    cache = CodeCache(tmp_path / "c.marshal", {})
    namespace = {"_tuple_new": tuple.__new__, "__builtins__": {}, "__name__": "namedtuple_P"}
    new = cache.eval("lambda _cls, a, b: _tuple_new(_cls, (a, b))", namespace)
    assert new(tuple, 1, 2) == (1, 2) and new.__name__ == "<lambda>"
    assert ("eval", "lambda _cls, a, b: _tuple_new(_cls, (a, b))") in cache.codes
    assert cache.eval("  1 + 1", {}) == 2  # leading blanks stripped, as `eval` does
