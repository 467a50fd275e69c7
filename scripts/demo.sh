#!/usr/bin/env bash
# `make demo`: a whole local fleet on free ports -- redis-server, ferry-broker, two ferry-workers
# -- a few thousand jobs through the SDK, some results, a throughput/latency line, clean shutdown.
set -euo pipefail
BUILD=${1:-build}
JOBS=${JOBS:-3000}
WORK=$(mktemp -d /tmp/ferry-demo-XXXXXX)
PIDS=()

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
cleanup() {
  # Workers and broker drain on SIGTERM; redis last.
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  [ -n "${REDIS_PID:-}" ] && { kill -TERM "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; }
  rm -rf "$WORK"
}
trap cleanup EXIT

REDIS_PORT=$(free_port); FRONT_PORT=$(free_port); BACK_PORT=$(free_port)
echo "demo: models -> $WORK/models"
"$BUILD/gpu-worker/ferry-make-models" "$WORK/models" >/dev/null

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$WORK" --save '' --appendonly no \
  >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
REDIS="redis://127.0.0.1:$REDIS_PORT"

"$BUILD/broker/ferry-broker" --frontend "tcp://127.0.0.1:$FRONT_PORT" \
  --backend "tcp://127.0.0.1:$BACK_PORT" --redis "$REDIS" >"$WORK/broker.log" 2>&1 &
PIDS+=($!)
for i in 1 2; do
  "$BUILD/gpu-worker/ferry-worker" --broker "tcp://127.0.0.1:$BACK_PORT" --redis "$REDIS" \
    --model "tiny=$WORK/models/tiny.pt" --device cpu --max-batch 32 --threads 1 \
    >"$WORK/worker$i.log" 2>&1 &
  PIDS+=($!)
done
echo "demo: redis :$REDIS_PORT, broker :$FRONT_PORT/:$BACK_PORT, 2 workers; waiting for them"
for _ in $(seq 200); do
  n=$("$BUILD/producer-sdk/ferry" stats --frontend "tcp://127.0.0.1:$FRONT_PORT" 2>/dev/null |
      grep -o '"device"' | wc -l || true)
  [ "${n:-0}" -ge 2 ] && break
  sleep 0.1
done
echo "demo: submitting $JOBS jobs (model tiny: y = x @ W + b on 8 floats) through the SDK"
"$BUILD/bench/ferry-bench" --frontend "tcp://127.0.0.1:$FRONT_PORT" --redis "$REDIS" \
  --model tiny --shape 8 --dtype float32 --jobs "$JOBS" --concurrency 32 --print-results 5
echo "demo: fleet stats:"
"$BUILD/producer-sdk/ferry" stats --frontend "tcp://127.0.0.1:$FRONT_PORT"
echo "demo: shutting down"
