"""Build hook: compile the simulator's hot modules with mypyc on a regular `pip install .`.

pyproject.toml keeps the metadata; this file only adds the extension modules. What is compiled and why:
benchmarks/mypyc_probe/README.md (fcfs runs ~1.65x faster, byte-identical stdout). The rules:

- Only a regular wheel build compiles (`pip install .`, `pip wheel .`, `python -m build`). Editable installs
  (`pip install -e .`) stay pure: a compiled `.so` beside its `.py` shadows every later edit of the `.py`.
- `SLO_CONSOLE_PURE=1` at install time skips compilation.
- Any failure (mypy/mypyc refusing the sources, no C compiler, gcc failing) installs the pure-Python package
  instead, with one warning line (pip shows it with -v; `slo-console --version` says which you got).
- `-ffp-contract=off`: gcc may otherwise fuse a*b+c into one rounding (FMA, the default on aarch64), and the
  simulator's float arithmetic must match the interpreter's bit for bit. Never add -ffast-math or -march.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# Commands that build the wheel a regular install uses; egg_info/dist_info (metadata) and editable_wheel
# (pip install -e) never compile.
_BUILD_COMMANDS = {"bdist_wheel", "build", "build_ext", "install"}
_PURE_COMMANDS = {"editable_wheel", "develop"}
# A mypyc build must use the exact mypy that build-system.requires pins (mypyc's generated C and its runtime
# library change between releases).


def _warn(reason: str) -> None:
    print(f"slo-console: WARNING: installing pure Python (no mypyc-compiled modules): {reason}", file=sys.stderr)


def _hot_modules() -> list[str]:
    """core.COMPILED_MODULES (one list, read without importing core: its dependencies may be absent here)."""
    tree = ast.parse((ROOT / "core" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COMPILED_MODULES" for t in node.targets):
            return [name.replace(".", "/") + ".py" for name in ast.literal_eval(node.value)]
    raise LookupError("core/__init__.py has no COMPILED_MODULES")


def _ext_modules() -> list:
    args = set(sys.argv[1:])
    if not args & _BUILD_COMMANDS or args & _PURE_COMMANDS:
        return []
    if os.environ.get("SLO_CONSOLE_PURE") == "1":
        _warn("SLO_CONSOLE_PURE=1")
        return []
    try:
        from mypyc.build import mypycify

        os.chdir(ROOT)  # mypyc names modules by their paths: relative to the project root
        # --follow-imports=silent: only the listed modules must type-check; --ignore-missing-imports: the
        # isolated build environment has mypy but not numpy or pydantic (their values are Any to mypyc, which
        # treats such objects as `object` either way).
        flags = ["--follow-imports=silent", "--ignore-missing-imports"]
        extensions = mypycify([*flags, *_hot_modules()], opt_level="3", group_name="slo_console")
    except BaseException as exc:  # mypyc reports type errors with SystemExit
        _warn(f"mypyc failed ({type(exc).__name__}: {exc})")
        return []
    for ext in extensions:
        ext.extra_compile_args = [*ext.extra_compile_args, "-ffp-contract=off"]
    return extensions


class BuildExtOrPure(build_ext):
    """build_ext that falls back to the pure package when the C compiler fails."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            _warn(f"C compilation failed ({type(exc).__name__}: {exc})")
            for output in self.get_outputs():  # a half-built set of extensions must not ship
                Path(output).unlink(missing_ok=True)
            self.extensions = []


class BuildPyPurged(build_py):
    """build_py that first removes extension modules an earlier build left in build/lib.

    pip builds in the source tree and the wheel takes all of build/lib: without this, a pure build after a
    compiled one would ship the old .so files (and they shadow the .py files). build_ext runs after build_py.
    """

    def run(self) -> None:
        build_lib = Path(self.build_lib)
        for stale in [*build_lib.glob("slo_console__mypyc*"), *build_lib.glob("core/**/*.so")]:
            stale.unlink()
        super().run()


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": BuildExtOrPure, "build_py": BuildPyPurged})
