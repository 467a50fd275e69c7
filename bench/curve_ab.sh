#!/usr/bin/env bash
# CurveZMQ on and off, in one run on one build (docs/security.md, "What security costs"):
#
#   bash bench/curve_ab.sh BUILD [ROUNDS=4]
#
# Makes keys with BUILD's `ferry keygen` (a broker, a worker and a producer; the broker lists the
# other two), then runs bench/ab_cpu.sh with both sides on BUILD: "base" plaintext, "new" with
# CURVE on both broker sockets (ferry-broker --curve-secret --allow-*, ferry-worker and ferry-bench
# --curve-server-public --curve-secret). Two scenarios, as bench/run.sh runs them: `tiny`
# (closed loop, 1024 in flight, 4 loaders, --max-batch 256) and `audio` (960 KB int16 jobs into
# head.pt, 32 in flight, inputs by claim check, journal on). Prints ab_cpu.sh's pairs.
set -uo pipefail
[ $# -ge 1 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
BUILD=$(cd "$1" && pwd); ROUNDS=${2:-4}
HERE=$(cd "$(dirname "$0")" && pwd)
K=$(mktemp -d /tmp/ferry-curveab-XXXXXX)
trap 'rm -rf "$K"' EXIT
mkdir -p "$K/producers" "$K/workers"
for name in broker worker producer; do "$BUILD/producer-sdk/ferry" keygen "$K" "$name" >/dev/null || exit 1; done
cp "$K/worker.key" "$K/workers/"; cp "$K/producer.key" "$K/producers/"
export BROKER_NEW="--curve-secret $K/broker.key_secret --allow-producers $K/producers --allow-workers $K/workers"
export WORKER_NEW="--curve-server-public $K/broker.key --curve-secret $K/worker.key_secret"
CLIENT="--curve-server-public $K/broker.key --curve-secret $K/producer.key_secret"

echo "== tiny: plaintext (base) vs CURVE (new)"
C=1024 SHAPE=8 MAX_BATCH=256 BENCH_BASE="--loaders 4" \
  BENCH_NEW="--loaders 4 $CLIENT" \
  bash "$HERE/ab_cpu.sh" "$BUILD" "$BUILD" "$ROUNDS" 100000 tiny
echo "== audio: plaintext (base) vs CURVE (new)"
C=32 SHAPE=480000 DTYPE=int16 BENCH_BASE="--loaders 4 --submit-batch 4" \
  BENCH_NEW="--loaders 4 --submit-batch 4 $CLIENT" \
  bash "$HERE/ab_cpu.sh" "$BUILD" "$BUILD" "$ROUNDS" 1000 head
