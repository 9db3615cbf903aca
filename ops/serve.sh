#!/usr/bin/env bash
# Install, then serve the default model (SmolLM2-135M-Instruct) on http://127.0.0.1:8000.
# Extra arguments go to `troupe serve` (e.g. --port 9000, --model PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ops/install.sh
exec .venv/bin/troupe serve "$@"
