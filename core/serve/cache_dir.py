"""Where slo-console keeps what it builds and learns between runs (models, probe results, server logs)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where slo-console keeps built models, vLLM venvs, probe results and server logs."""
    override = os.environ.get("SLO_CONSOLE_CACHE")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "slo-console"
