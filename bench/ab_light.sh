#!/usr/bin/env bash
# Paired light-load comparison of two builds (docs/performance.md, "Running the suite").
#
#   bash bench/ab_light.sh BASE_BUILD NEW_BUILD [ROUNDS=8] [JOBS=3000] [CONCURRENCY=1]
#
# Starts two fleets side by side (each: redis-server, ferry-broker, one ferry-worker serving
# `tiny`, on free ports), then alternates `ferry-bench --concurrency 1` runs between them, so each
# pair of p50s is taken within the same few seconds of outside load. Prints every pair and the
# median of new/base. With CONCURRENCY > 1 it compares throughput (jobs/s) instead of p50. Each
# build needs ferry-bench, ferry-broker and ferry-worker; the models come from NEW_BUILD's
# ferry-make-models.
#
# PIN_BASE / PIN_NEW="B,R,W,C" pin that side's processes with taskset: ferry-broker to CPU list
# B, redis-server to R, ferry-worker (all its threads) to W, ferry-bench to C; e.g.
#   PIN_NEW=0,0,1,1 bash bench/ab_light.sh build-bench build-bench    # pinned vs not, one build
# (CPU lists as taskset -c takes them, separated by ':' for several: 0:1 = "0,1").
# BENCH_BASE / BENCH_NEW: extra ferry-bench flags for that side (e.g. BENCH_BASE=--no-push).
# BROKER_BASE / BROKER_NEW: extra ferry-broker flags for that side (e.g. BROKER_BASE=--no-journal).
# IPC_BASE=1 / IPC_NEW=1 connect that side's broker endpoints over ipc:// (Unix domain sockets in
# the work directory) instead of TCP loopback.
set -uo pipefail
. "$(dirname "$0")/lib.sh"  # free_port, stop_pids_and_remove
[ $# -ge 2 ] || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
BASE=$(cd "$1" && pwd); NEW=$(cd "$2" && pwd); ROUNDS=${3:-8}; JOBS=${4:-3000}; CONC=${5:-1}
WORK=$(mktemp -d /tmp/ferry-ab-XXXXXX)
PIDS=()
trap 'stop_pids_and_remove "$WORK"' EXIT
"$NEW/gpu-worker/ferry-make-models" "$WORK/models" >/dev/null
# pin NAME INDEX: the taskset prefix for part INDEX (1 broker, 2 redis, 3 worker, 4 bench) of
# side NAME, from PIN_BASE / PIN_NEW; nothing when unset.
pin() {
  local spec cpus
  if [ "$1" = base ]; then spec=${PIN_BASE:-}; else spec=${PIN_NEW:-}; fi
  [ -n "$spec" ] || return 0
  cpus=$(cut -d, -f"$2" <<<"$spec" | tr ':' ',')
  [ -n "$cpus" ] && echo "taskset -c $cpus"
}
# start_fleet BUILD NAME: sets FRONTEND_<NAME> and REDIS_<NAME>
start_fleet() {
  local build=$1 name=$2 rport fport bport
  rport=$(free_port); fport=$(free_port); bport=$(free_port)
  mkdir -p "$WORK/$name"
  local front="tcp://127.0.0.1:$fport" back="tcp://127.0.0.1:$bport" ipc
  if [ "$name" = base ]; then ipc=${IPC_BASE:-}; else ipc=${IPC_NEW:-}; fi
  if [ -n "$ipc" ]; then front="ipc://$WORK/$name/frontend.sock"; back="ipc://$WORK/$name/backend.sock"; fi
  $(pin "$name" 2) redis-server --port "$rport" --dir "$WORK/$name" --save '' --appendonly no >/dev/null 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
  local bflags
  if [ "$name" = base ]; then bflags=${BROKER_BASE:-}; else bflags=${BROKER_NEW:-}; fi
  # shellcheck disable=SC2086  # bflags holds several flags
  $(pin "$name" 1) "$build/broker/ferry-broker" --frontend "$front" --backend "$back" $bflags \
    --redis "redis://127.0.0.1:$rport" --log-level warn >"$WORK/$name/broker.log" 2>&1 &
  PIDS+=($!)
  $(pin "$name" 3) "$build/gpu-worker/ferry-worker" --model "tiny=$WORK/models/tiny.pt" --device cpu --max-batch 256 \
    --instances 1 --threads 1 --broker "$back" --redis "redis://127.0.0.1:$rport" \
    --log-level warn >"$WORK/$name/worker.log" 2>&1 &
  PIDS+=($!)
  printf -v "FRONTEND_$name" '%s' "$front"
  printf -v "REDIS_$name" '%s' "redis://127.0.0.1:$rport"
}
start_fleet "$BASE" base
start_fleet "$NEW" new
# measure BUILD FRONTEND REDIS NAME: p50 in ms at concurrency 1, else throughput in jobs/s
measure() {
  local extra
  if [ "$4" = base ]; then extra=${BENCH_BASE:-}; else extra=${BENCH_NEW:-}; fi
  # shellcheck disable=SC2086  # extra holds several flags
  $(pin "$4" 4) "$1/bench/ferry-bench" --frontend "$2" --redis "$3" --wait-workers 1 --model tiny --shape 8 $extra \
    --concurrency "$CONC" --jobs "$JOBS" 2>&1 | if [ "$CONC" = 1 ]; then
      sed -n 's/.*latency ms p50 \([0-9.]*\).*/\1/p'
    else
      sed -n 's/.* \([0-9][0-9]*\) jobs\/s.*/\1/p'
    fi
}
if [ "$CONC" = 1 ]; then WHAT=p50_ms; else WHAT=jobs_s; fi
echo "round  base_$WHAT  new_$WHAT  ratio"
: >"$WORK/pairs"
for r in $(seq "$ROUNDS"); do
  b=$(measure "$BASE" "$FRONTEND_base" "$REDIS_base" base)
  n=$(measure "$NEW" "$FRONTEND_new" "$REDIS_new" new)
  if [ -z "$b" ] || [ -z "$n" ]; then echo "ab_light.sh: a run failed (logs in $WORK)" >&2; trap - EXIT; exit 1; fi
  echo "$b $n" >>"$WORK/pairs"
  awk -v r="$r" -v b="$b" -v n="$n" 'BEGIN { printf "%5d  %11.3f  %10.3f  %5.2f\n", r, b, n, n / b }'
done
python3 - "$WORK/pairs" "$WHAT" <<'PY'
import statistics, sys
pairs = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
ratios = [n / b for b, n in pairs]
print("median %s: base %.3f, new %.3f; new/base per pair: median %.2f (%.2f-%.2f)" % (
    sys.argv[2], statistics.median(b for b, _ in pairs), statistics.median(n for _, n in pairs),
    statistics.median(ratios), min(ratios), max(ratios)))
PY
