#!/usr/bin/env bash
# One device call: issue #9's serving workload (Qwen3-0.6B shape, random bf16 weights, 300
# requests per rate, input U[128, 1024], output U[64, 512], temperature 0.6, ignore_eos) through
# HTTP (`troupe serve`, one server for every rate) and through Engine.generate (--engine).
# Run from the repo root with .whl carried; results (JSON per run, logs) go to $OUT.
#   RATES="8 24 40 inf" ENGINE_RATES="40 inf" SERVE_ARGS="" bash ops/serve_gpu.sh
# A rate named again runs again with fresh prompts (issue 9's burst, cold then warmed):
#   RATES="inf inf inf" ENGINE_RATES="inf" bash ops/serve_gpu.sh
# HTTP runs report the server's CPU (gateway and engine child apart). The engine in the
# server's own process instead (issue 9 point 3's comparison; the engine flags of SERVE_ARGS
# also go to --engine runs, which know no --no-engine-process):
#   RATES="40 inf" ENGINE_RATES="" SERVE_ARGS="--no-engine-process" bash ops/serve_gpu.sh
# BENCH_ARGS go to every bench run, e.g. issue 11 over HTTP (each request its own JSON schema):
#   RATES="inf" ENGINE_RATES="" BENCH_ARGS="--structured-output-ratio 1" bash ops/serve_gpu.sh
set -uo pipefail
OUT=${OUT:-/tmp/troupe-gpu}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/troupe
export PYTHONPATH=/tmp/pkg:/tmp/site PYTHONUNBUFFERED=1
MODEL=/tmp/qwen3-random
[ -f $MODEL/model.safetensors ] || python3 -c "
from pathlib import Path
from troupe.gpu.weights import qwen3_0_6b_config
from troupe.ops.bench_offline import write_model_folder
p = Path('$MODEL'); p.mkdir(exist_ok=True); write_model_folder(p, qwen3_0_6b_config())"
TROUPE="python3 -m troupe.ops.cli"
LOAD="--num-prompts ${NUM_PROMPTS:-300} --min-input-len 128 --max-input-len 1024 --min-output-len 64
  --max-output-len 512 --temperature 0.6 --goodput ttft:200 tpot:20 --no-progress ${BENCH_ARGS:-}"
PORT=8011
$TROUPE serve --model $MODEL --device cuda --port $PORT ${SERVE_ARGS:-} > "$OUT/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 240); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health')" \
    2> /dev/null && break
  sleep 0.5
done
declare -A seen=()
for rate in ${RATES-8 24 40 inf}; do
  # a seed per run: the server's prefix cache must not see a run's prompts again. A rate named
  # again (RATES="inf inf inf": the burst on a warmed server) gets the next seed and file.
  k=${seen[$rate]:-0}; seen[$rate]=$((k + 1))
  seed=$(( ${rate/inf/999} + 1000 * k )); name=$rate; [ "$k" -gt 0 ] && name=${rate}_$k
  echo "== http rate $rate (seed $seed)"
  $TROUPE bench serve --base-url http://127.0.0.1:$PORT --server-pid $SERVER --request-rate $rate \
    --seed $seed $LOAD --result-file "$OUT/http_$name.json" 2>&1 | tail -${TAIL:-24}
done
# Issue #15: the live view's cost. Off and on alternate with the same seed (the same requests),
# so drift in the server shows up on both sides: run it on a server without prefix caching,
#   RATES="" ENGINE_RATES="" POLL_RATES=24 SERVE_ARGS="--no-enable-prefix-caching" ...
for rate in ${POLL_RATES:-}; do
  case "${SERVE_ARGS:-}" in *--no-enable-prefix-caching*) ;;
    *) echo "POLL_RATES needs SERVE_ARGS=--no-enable-prefix-caching (same prompts each run)"; break;; esac
  for i in 1 2 3 4 5 6; do
    poll=""; [ $((i % 2)) = 0 ] && poll="--poll-engine-stats 1"
    echo "== http rate $rate run $i ${poll:-no poll}"
    $TROUPE bench serve --base-url http://127.0.0.1:$PORT --request-rate $rate --seed 7001 \
      $LOAD $poll --result-file "$OUT/poll_${rate}_$i.json" 2>&1 | tail -${TAIL:-22}
  done
done
kill -TERM $SERVER; wait $SERVER
for rate in ${ENGINE_RATES-40 inf}; do
  echo "== engine rate $rate"
  $TROUPE bench serve --engine --model $MODEL --device cuda ${SERVE_ARGS:-} --request-rate $rate \
    --seed ${rate/inf/999} $LOAD --result-file "$OUT/engine_$rate.json" 2>&1 | tail -${TAIL:-22}
done
