"""Facts about the machine and the software that ran: GPUs from NVML, CPU from /proc, versions, git.

Every probe degrades to "unknown" with its reason; building a factsheet must never fail on a missing tool.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from core.energy.nvml import load_nvml
from core.factsheet.model import GpuInfo, HostInfo

# core/factsheet/host.py -> the checkout root.
REPO_ROOT = Path(__file__).resolve().parents[2]
GIT_TIMEOUT_S = 2.0


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def detect_gpus(nvml: ModuleType | Any | None = None) -> tuple[list[GpuInfo], str | None, str]:
    """(GPUs, driver version, source): source is "NVML" or why GPU facts are missing."""
    if nvml is None:
        nvml, reason = load_nvml()
        if nvml is None:
            return [], None, f"unavailable: {reason}"
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return [], None, f"unavailable: NVML could not start ({exc})"
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                GpuInfo(
                    index=index,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_total_mib=int(memory.total) // (1024 * 1024),
                )
            )
        return gpus, driver, "NVML"
    except Exception as exc:
        return [], None, f"unavailable: NVML query failed ({exc})"
    finally:
        # A failed shutdown changes none of the facts already read.
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _proc_field(path: Path, key: str) -> str | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == key:
                return value.strip()
    except OSError:
        return None
    return None


def detect_cpu(proc: Path = Path("/proc")) -> tuple[str | None, int | None, float | None]:
    """(CPU model, logical cores, memory GiB) from /proc, falling back to the platform module."""
    model = _proc_field(proc / "cpuinfo", "model name") or platform.processor() or None
    cores = os.cpu_count()
    memory_gib = None
    mem_total = _proc_field(proc / "meminfo", "MemTotal")
    if mem_total and mem_total.endswith("kB"):
        memory_gib = round(int(mem_total.split()[0]) / (1024 * 1024), 1)
    return model, cores, memory_gib


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def slo_console_version() -> str:
    """core.__version__, else the installed distribution's version.

    With a setuptools editable install, `core` imported from outside the checkout is a namespace package
    without `__version__`, so the attribute alone is not enough.
    """
    import core

    version = getattr(core, "__version__", None) or _version("slo-console")
    return version or "unknown"


def software_versions() -> dict[str, str]:
    versions = {
        "python": platform.python_version(),
        "slo-console": slo_console_version(),
    }
    for distribution in ("numpy", "scipy", "pydantic", "httpx", "nvidia-ml-py"):
        version = _version(distribution)
        if version is not None:
            versions[distribution] = version
    return versions


def detect_host(nvml: ModuleType | Any | None = None) -> HostInfo:
    gpus, driver, gpu_source = detect_gpus(nvml)
    cpu_model, cores, memory_gib = detect_cpu()
    return HostInfo(
        gpus=gpus,
        gpu_count=len(gpus),
        gpu_driver_version=driver,
        gpu_source=gpu_source,
        cpu_model=cpu_model,
        cpu_logical_cores=cores,
        memory_total_gib=memory_gib,
        operating_system=f"{platform.system()} {platform.release()}".strip() or sys.platform,
        software=software_versions(),
    )


def git_revision(repo: Path = REPO_ROOT) -> str:
    """The checkout's commit, with "+dirty" when tracked files changed; "unknown" without git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if status else head or "unknown"
