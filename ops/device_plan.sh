#!/usr/bin/env bash
# One device call that works through a plan file: each line is a command run from the repo root
# with the wheels installed (as ops/gpu_check.sh installs them); a line "h200: CMD" runs only on
# an H200 (the issues' targets are set there; other cards skip it by name), "other: CMD" only on
# another card (what stands in for an H200 run that could not happen); blank lines and
# "#" lines are ignored. Each command gets what is left of BUDGET seconds (default 570, under
# the device's 600 s a call); the ones left over are named, not run; FROM=N starts at command N
# (a later call goes on where the last one's time ran out). Output: the last TAIL (15) lines of
# each to the terminal, the whole of command N in $OUT/NN.log.
#   bash ops/device_plan.sh plan.txt
#   FROM=5 bash ops/device_plan.sh ops/h200_owed.plan
set -uo pipefail
PLAN=${1:?usage: bash ops/device_plan.sh PLAN_FILE}
BUDGET=${BUDGET:-570}
OUT=${OUT:-/tmp/troupe-gpu}; mkdir -p "$OUT"
T0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/troupe
export PYTHONPATH=/tmp/pkg:/tmp/site PYTHONUNBUFFERED=1
CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $CARD; $(date -u)"
n=0
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in ''|'#'*) continue ;; esac
  n=$((n + 1))
  if [ "$n" -lt "${FROM:-1}" ]; then continue; fi
  cmd=$line
  if [ "${line#h200: }" != "$line" ]; then
    cmd=${line#h200: }
    case "$CARD" in *H200*) ;; *) echo "== $n skipped (not an H200): $cmd"; continue ;; esac
  elif [ "${line#other: }" != "$line" ]; then
    cmd=${line#other: }
    case "$CARD" in *H200*) echo "== $n skipped (an H200): $cmd"; continue ;; esac
  fi
  left=$((BUDGET - (SECONDS - T0)))
  if [ "$left" -lt 20 ]; then echo "== $n skipped (${left} s left): $cmd"; continue; fi
  log="$OUT/$(printf %02d "$n").log"
  echo "== $n ($left s left): $cmd"
  timeout "$left" bash -c "$cmd" >"$log" 2>&1
  rc=$?
  tail -n "${TAIL:-15}" "$log"
  echo "== $n rc $rc after $((SECONDS - T0)) s"
done <"$PLAN"
