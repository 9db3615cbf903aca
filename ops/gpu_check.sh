#!/usr/bin/env bash
# One device call: GPU tests (kernels + model), then the offline benchmark through the engine.
# Run on the GPU machine from the repo root with .whl carried (see ../shared/tools/device-wheels.sh).
# Structured output needs these beyond the script's own list, and tests/gpu imports gguf:
#   ../shared/tools/device-wheels.sh xgrammar==0.2.8 apache-tvm-ffi pydantic pydantic-core \
#     annotated-types typing-inspection gguf pyyaml tqdm pillow
# Logs go to $OUT (or /tmp/troupe-gpu). The GPU tests alone take 290-430 s on the H200 (hosts
# differ): run them with SKIP_BENCH=1 TEST_TIMEOUT=560 in a call of their own, or in two calls
# (TESTS=tests/kernels, then TESTS=tests/gpu) when the device time left is short.
set -uo pipefail
OUT=${OUT:-/tmp/troupe-gpu}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/troupe
export PYTHONPATH=/tmp/pkg:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
TESTS=${TESTS:-tests/kernels tests/gpu}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TEST_TIMEOUT:-540}" python3 -P -m pytest -m gpu $TESTS -q -p no:cacheprovider \
    --durations=5 ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log" | grep -v "^$" | tail -30
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 -m troupe.ops.bench_offline ${BENCH_ARGS:-} 2>&1 \
    | tee "$OUT/bench_offline.log" | tail -40
fi
