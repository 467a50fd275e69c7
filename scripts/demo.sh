#!/usr/bin/env bash
# `make demo`: a whole local fleet started by `ferry up` -- redis-server, ferry-broker, two CPU
# ferry-workers (one per GPU on a GPU machine) on free ports -- a few thousand jobs through the
# SDK, some results, a throughput/latency line, a cancelled job, and a clean drain.
set -euo pipefail
BUILD=${1:-build}
JOBS=${JOBS:-3000}
WORK=$(mktemp -d /tmp/ferry-demo-XXXXXX)
FERRY="$BUILD/producer-sdk/ferry"
UP_PID=""

cleanup() {
  # `ferry up` drains on SIGTERM: workers first, then the broker, then redis-server.
  if [ -n "$UP_PID" ]; then
    kill -TERM "$UP_PID" 2>/dev/null || true
    wait "$UP_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "demo: models -> $WORK/models"
"$BUILD/gpu-worker/ferry-make-models" "$WORK/models" >/dev/null

GPU_FLAGS=(--cpu-workers 2)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then GPU_FLAGS=(); fi
"$FERRY" up --bin-dir "$BUILD" --model "tiny=$WORK/models/tiny.pt" --model "slow=$WORK/models/slow.pt" \
  "${GPU_FLAGS[@]}" --frontend-port 0 --backend-port 0 --worker-arg=--threads=1 \
  --env-file "$WORK/fleet.env" --log-dir "$WORK/logs" &
UP_PID=$!
for _ in $(seq 1200); do [ -f "$WORK/fleet.env" ] && break; sleep 0.1; done
[ -f "$WORK/fleet.env" ] || { echo "demo: the fleet did not come up"; exit 1; }
# shellcheck disable=SC1091
source "$WORK/fleet.env"

echo "demo: submitting $JOBS jobs (model tiny: y = x @ W + b on 8 floats) through the SDK"
"$BUILD/bench/ferry-bench" --frontend "$FERRY_FRONTEND" --redis "$FERRY_REDIS" \
  --model tiny --shape 8 --dtype float32 --jobs "$JOBS" --concurrency 32 --print-results 5

echo "demo: one job from the CLI, and a cancelled one"
/usr/bin/python3 - "$WORK/x.npy" <<'EOF'
import sys
import numpy as np
np.save(sys.argv[1], np.arange(8, dtype=np.float32))
np.save(sys.argv[1].replace("x.npy", "spin.npy"), np.array([3000], dtype=np.float32))
EOF
"$FERRY" submit --frontend "$FERRY_FRONTEND" --redis "$FERRY_REDIS" --model tiny \
  --input "$WORK/x.npy" --wait
for i in 1 2 3; do
  "$FERRY" submit --frontend "$FERRY_FRONTEND" --redis "$FERRY_REDIS" --model slow \
    --input "$WORK/spin.npy" --id "demo-slow-$i" >/dev/null
done
"$FERRY" cancel --frontend "$FERRY_FRONTEND" --redis "$FERRY_REDIS" demo-slow-1 demo-slow-2 demo-slow-3 || true

echo "demo: fleet status:"
"$FERRY" status --frontend "$FERRY_FRONTEND" || true
echo "demo: shutting down (ferry up drains workers, then the broker, then redis)"
