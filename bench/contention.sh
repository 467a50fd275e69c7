#!/usr/bin/env bash
# What a co-located single-threaded load costs the model run alone, by thread layout
# (docs/performance.md, "CPU workers: two executors of one thread").
#
#   bash bench/contention.sh BUILD [ROUNDS=2] [JOBS=960] [MODEL=encoder] [SHAPE=64,384]
#
# For each load (none, then a process that spins BUSY µs of every 5 ms: 10 % and 20 % of one
# core, i.e. 5 % and 10 % of a 2-core machine) it runs `ferry-bench --raw` at batch 8 three ways:
# one process with 2 intra-op threads and libgomp's default wait policy (spin ~300k, what --raw
# measures), the same with OMP_WAIT_POLICY=PASSIVE (what ferry-worker runs with), and two
# processes with 1 thread each at once (the `--instances 2 --threads 1` layout; jobs/s summed).
# The load stands in for the rest of a fleet on the same cores (Redis, broker, producer).
set -uo pipefail
. "$(dirname "$0")/lib.sh"  # free_port, stop_pids_and_remove
[ $# -ge 1 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
BUILD=$(cd "$1" && pwd); ROUNDS=${2:-2}; JOBS=${3:-960}; MODEL=${4:-encoder}; SHAPE=${5:-64,384}
WORK=$(mktemp -d /tmp/ferry-contention-XXXXXX)
PIDS=()
trap 'stop_pids_and_remove "$WORK"' EXIT
"$BUILD/gpu-worker/ferry-make-models" "$WORK/models" >/dev/null || exit 1
gcc -O2 -o "$WORK/burn" -x c - <<'C' || exit 1
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static long now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000L + t.tv_nsec / 1000; }
int main(int argc, char **argv) {  /* burn BUSY_US PERIOD_US: spin BUSY_US of every PERIOD_US */
  long busy = atol(argv[1]), period = atol(argv[2]); volatile unsigned long x = 0;
  (void)argc;
  for (;;) { long s = now_us(); while (now_us() - s < busy) x++; long left = period - (now_us() - s); if (left > 0) usleep(left); }
}
C
raw() {  # OUT_JSON FLAGS...: one --raw run, prints jobs/s
  "$BUILD/bench/ferry-bench" --raw "$WORK/models/$MODEL.pt" --batch 8 --device cpu --shape "$SHAPE" \
    --dtype float32 --jobs "$JOBS" --warmup 48 --json "$1" "${@:2}" >/dev/null 2>&1 || { echo fail; return; }
  python3 -c "import json,sys; print('%.1f' % json.load(open(sys.argv[1]))['throughput'])" "$1"
}
echo "# $MODEL [$SHAPE] --raw at batch 8, $JOBS jobs; jobs/s"
printf '%-6s %-14s %10s %14s %12s\n' round load "2 threads" "2 thr passive" "2 x 1 thread"
for round in $(seq "$ROUNDS"); do
  for busy in 0 500 1000; do
    bp=""
    if [ "$busy" != 0 ]; then "$WORK/burn" "$busy" 5000 & bp=$!; PIDS+=("$bp"); sleep 0.3; fi
    t2=$(raw "$WORK/t2.json" --threads 2)
    t2p=$(OMP_WAIT_POLICY=PASSIVE raw "$WORK/t2p.json" --threads 2)
    raw "$WORK/a.json" --threads 1 >"$WORK/a.out" & pa=$!
    raw "$WORK/b.json" --threads 1 >"$WORK/b.out" & pb=$!
    wait "$pa" "$pb"
    t11=$(python3 -c "import sys; print('%.1f' % (float(sys.argv[1]) + float(sys.argv[2])))" \
      "$(cat "$WORK/a.out")" "$(cat "$WORK/b.out")")
    [ -n "$bp" ] && { kill "$bp"; wait "$bp" 2>/dev/null; PIDS=(); }
    load=none; [ "$busy" != 0 ] && load="${busy}us/5ms"
    printf '%-6s %-14s %10s %14s %12s\n' "$round" "$load" "$t2" "$t2p" "$t11"
  done
done
