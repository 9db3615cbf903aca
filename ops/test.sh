#!/usr/bin/env bash
# The whole test suite: install, lint (ruff), type-check (mypy; strict on messages/ and actors/),
# then pytest (GPU tests skip without CUDA). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/install.sh
if [ -f .ci/install-browser.sh ]; then bash .ci/install-browser.sh; fi
echo "== ruff"; .venv/bin/ruff check .
echo "== mypy"
TC=$(mktemp -d) && ln -s "$PWD" "$TC/troupe"
(cd "$TC" && "$OLDPWD/.venv/bin/mypy" --config-file "$OLDPWD/pyproject.toml" -p troupe)
echo "== pytest"; .venv/bin/python -m pytest "$@"
