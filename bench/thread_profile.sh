#!/usr/bin/env bash
# Per-thread cost of one light-load job (docs/performance.md, "Running the suite").
#
#   bash bench/thread_profile.sh BUILD_DIR [JOBS=4000] [-- EXTRA_WORKER_FLAGS...]
#
# Starts redis-server, ferry-broker and one ferry-worker (on free ports), warms up (WARMUP jobs,
# 500), then runs `ferry-bench --jobs JOBS` -- `tiny` at concurrency 1 unless told otherwise --
# and prints, for every thread of redis, the broker and the worker that did work (one row per
# thread id), its CPU time and voluntary context switches (wake-ups) per job, read from /proc
# before and after the run. The worker's threads carry their role in their names (ferry-link,
# ferry-fetch, ferry-exec-N, ferry-results; an executor's OpenMP threads inherit its name, so
# with --threads > 1 a ferry-exec-N appears more than once). BUILD_DIR needs
# ferry-bench, ferry-broker, ferry-worker and ferry-make-models. BENCH_FLAGS: extra ferry-bench
# flags (e.g. --run); BROKER_FLAGS: extra ferry-broker flags (e.g. --no-journal). Another
# workload through the environment: MODEL (a ferry-make-models model: tiny, whisper, head, ...),
# SHAPE, DTYPE, CONCURRENCY, MAX_BATCH, INSTANCES, HALF=1 (float16 weights, CUDA only) and
# FERRY_BENCH_DEVICE (cpu, cuda:0). STACKS=N: afterwards, a second run while gdb samples the
# executors' stacks N times (see the end). On a GPU it also prints how busy nvidia-smi saw the
# device during the measured run. CPU time is read in nanoseconds (schedstat). 30-s clips into
# the Whisper-shaped pipeline on a GPU, for one:
#   MODEL=whisper SHAPE=480000 DTYPE=int16 CONCURRENCY=256 MAX_BATCH=128 \
#     FERRY_BENCH_DEVICE=cuda:0 bash bench/thread_profile.sh build-gpu 2000
set -uo pipefail
[ $# -ge 1 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
B=$(cd "$1" && pwd); JOBS=${2:-4000}; shift $(( $# >= 2 ? 2 : 1 )); [ "${1:-}" = "--" ] && shift
W=$(mktemp -d /tmp/ferry-threads-XXXXXX)
PIDS=()
KEEP_W=0  # 1: leave the logs in $W (a failed run)
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ "$KEEP_W" = 1 ] || rm -rf "$W"
}
trap cleanup EXIT
. "$(dirname "$0")/lib.sh"  # free_port, running
R=$(free_port); F=$(free_port); K=$(free_port)
"$B/gpu-worker/ferry-make-models" "$W/models" >/dev/null
redis-server --port "$R" --dir "$W" --save '' --appendonly no >/dev/null 2>&1 & PIDS+=($!)
RP=$!
for _ in $(seq 100); do redis-cli -p "$R" ping >/dev/null 2>&1 && break; sleep 0.05; done
"$B/broker/ferry-broker" --frontend "tcp://127.0.0.1:$F" --backend "tcp://127.0.0.1:$K" \
  --redis "redis://127.0.0.1:$R" --log-level warn ${BROKER_FLAGS:-} >"$W/broker.log" 2>&1 & PIDS+=($!)
BP=$!
# The worker re-executes itself once (allocator settings): find it by its command line.
MODEL=${MODEL:-tiny} SHAPE=${SHAPE:-8} DTYPE=${DTYPE:-float32} CONCURRENCY=${CONCURRENCY:-1}
DEVICE=${FERRY_BENCH_DEVICE:-cpu}
# A model repository file, for HALF=1 (`half = true`: float16 weights, CUDA only).
printf '[models.%s]\npath = "%s"\nhalf = %s\n' "$MODEL" "$W/models/$MODEL.pt" \
  "$([ "${HALF:-0}" = 1 ] && echo true || echo false)" >"$W/models.toml"
"$B/gpu-worker/ferry-worker" --models "$W/models.toml" --device "$DEVICE" \
  --max-batch "${MAX_BATCH:-256}" --instances "${INSTANCES:-1}" --threads 1 \
  --broker "tcp://127.0.0.1:$K" --redis "redis://127.0.0.1:$R" --log-level warn "$@" >"$W/worker.log" 2>&1 & PIDS+=($!)
bench() {
  "$B/bench/ferry-bench" --frontend "tcp://127.0.0.1:$F" --redis "redis://127.0.0.1:$R" \
    --wait-workers 1 --model "$MODEL" --shape "$SHAPE" --dtype "$DTYPE" \
    --concurrency "$CONCURRENCY" --jobs "$1" ${BENCH_FLAGS:-}
}
bench "${WARMUP:-500}" >/dev/null 2>&1 || {
  echo "thread_profile.sh: warm-up run failed (logs in $W)" >&2; tail -n 5 "$W"/*.log >&2
  KEEP_W=1; exit 1; }
WP=$(pgrep -f "ferry-worker.*127.0.0.1:$K" | head -1)
snapshot() {
  for p in $RP $BP $WP; do
    for t in /proc/"$p"/task/*; do
      # CPU time in nanoseconds (schedstat's first field), not stat's 10 ms ticks.
      printf '%s/%s %s %s %s\n' "$p" "${t##*/}" "$(tr ' ' _ <"$t/comm")" \
        "$(cut -d' ' -f1 "$t/schedstat")" \
        "$(awk '/^voluntary_ctxt_switches/ { print $2 }' "$t/status")"
    done
  done | sort
}
# On a GPU, nvidia-smi's utilization.gpu (the share of each sample period in which a kernel ran)
# every 100 ms through the measured run: whether the device or the host sets the pace.
GPU_UTIL=0
if [[ "$DEVICE" == cuda* ]] && command -v nvidia-smi >/dev/null; then
  GPU_INDEX=${DEVICE#cuda}; GPU_INDEX=${GPU_INDEX#:}
  nvidia-smi -i "${GPU_INDEX:-0}" --query-gpu=utilization.gpu --format=csv,noheader,nounits \
    -lms 100 >"$W/util" 2>/dev/null &
  GPU_UTIL=$!; PIDS+=("$GPU_UTIL")
fi
snapshot >"$W/before"
bench "$JOBS" 2>&1 | grep -E 'latency|time share'
snapshot >"$W/after"
if [ "$GPU_UTIL" != 0 ]; then
  kill "$GPU_UTIL" 2>/dev/null; wait "$GPU_UTIL" 2>/dev/null
  awk '/^[0-9]+$/ { n++; s += $1; if ($1 >= 90) hi++ }
    END { if (n) printf "GPU busy (nvidia-smi utilization.gpu every 100 ms): mean %.0f%% over %d samples, %d%% of them >= 90%%\n", s / n, n, 100 * hi / n }' "$W/util"
fi
echo "process/thread        name            cpu_us/job  wakeups/job"
join "$W/before" "$W/after" | awk -v jobs="$JOBS" '{
  cpu = ($6 - $3) / 1e3 / jobs; cs = ($7 - $4) / jobs
  if (cpu > 0.5 || cs > 0.05) printf "%-21s %-15s %10.1f  %11.2f\n", $1, $2, cpu, cs }'
# STACKS=N: then a second run (STACKS_JOBS jobs, 3 x JOBS; not measured above) while gdb samples
# the worker's executor threads N times, spread over it: where an executor's time goes -- on a
# GPU, launching kernels (libtorch's dispatch, libcuda's launch) or waiting for the device
# (libcuda spinning, or a futex with blocking sync) -- as the share of samples whose innermost
# frames are each function, "func@library" for a library without symbols. gdb (or cuda-gdb, the
# GPU machine's only debugger) reads the symbols of libc, libcudart and libcuda alone: reading
# libtorch's would make each attach take many seconds, so its frames read "??@libtorch_*.so".
[ "${STACKS:-0}" -gt 0 ] || exit 0
GDB=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
[ -n "$GDB" ] || { echo "STACKS needs gdb" >&2; exit 0; }
bench "${STACKS_JOBS:-$((3 * JOBS))}" >/dev/null 2>&1 &
SB=$!
sleep 1
for _ in $(seq "$STACKS"); do
  running "$SB" || break
  timeout 15 "$GDB" -p "$WP" -batch -nx -iex 'set auto-solib-add off' -ex 'set pagination off' \
    -ex 'sharedlibrary libc\.so\|libcudart\|libcuda\.so' -ex 'thread apply all bt 4' >>"$W/stacks" 2>/dev/null
  sleep 0.2
done
wait "$SB" 2>/dev/null
awk '
  /^Thread .*"ferry-exec-/ { on = 1; depth = 0; next }
  /^Thread / { on = 0 }
  on && /^#[0-9]/ {
    f = $0; sub(/^#[0-9]+ +(0x[0-9a-f]+ in )?/, "", f)
    lib = ""; if (match(f, / from [^ ]+$/)) { lib = substr(f, RSTART + 6); sub(/.*\//, "", lib) }
    sub(/ \(.*$/, "", f); if (lib != "") f = f "@" lib
    if (depth == 0) { top[f]++; n++ } else if (depth == 1) pair[chain " < " f]++
    chain = f; depth++
  }
  END {
    if (n == 0) { print "no executor stacks sampled"; exit }
    printf "executor stacks: %d thread samples; innermost frame (share of samples)\n", n
    for (f in top) printf "%5.1f%%  %s\n", 100 * top[f] / n, f | "sort -rn | head -12"
    close("sort -rn | head -12")
    print "innermost two frames"
    for (p in pair) printf "%5.1f%%  %s\n", 100 * pair[p] / n, p | "sort -rn | head -12"
  }' "$W/stacks"
