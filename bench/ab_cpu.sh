#!/usr/bin/env bash
# Paired CPU-per-job comparison of two builds on big jobs (docs/performance.md, "Running the suite").
#
#   bash bench/ab_cpu.sh BASE_BUILD NEW_BUILD [ROUNDS=4] [JOBS=400] [MODEL=null]
#
# Starts two fleets side by side (each: redis-server, ferry-broker, one ferry-worker serving
# MODEL from NEW_BUILD's ferry-make-models, on free ports), then alternates closed-loop
# ferry-bench runs between them (concurrency C, 2 loaders, SUBMITs of 8 jobs). Each line is one
# pair: jobs/s and the CPU microseconds per job of the broker, Redis, the worker (from
# /proc/PID/stat around the run) and the producer (ferry-bench's bench_cpu_s), and the mean
# batch the worker ran. The default, the null model on [3,224,224] float32 inputs (602 KB), is
# run.sh's `bytes` scenario. The order within a pair alternates (base first in odd rounds, new
# first in even ones); CPU time is read in nanoseconds from /proc/PID/task/*/schedstat.
# Environment: SHAPE (3,224,224), DTYPE (float32), C (16), INSTANCES (1), THREADS (1) for the
# worker's --instances/--threads, PERF=1 to also print each run's producer page faults and
# task-clock from `perf stat`. ENV_BASE / ENV_NEW: environment assignments for that side's
# broker and worker (e.g. ENV_NEW="MALLOC_ARENA_MAX=2"), to compare settings with one build.
# REDIS_ENV_BASE / REDIS_ENV_NEW and REDIS_ARGS_BASE / REDIS_ARGS_NEW: the same for that side's
# redis-server, environment and extra arguments (e.g. transparent huge pages:
# REDIS_ENV_NEW="MALLOC_CONF=thp:always,metadata_thp:always" REDIS_ARGS_NEW="--disable-thp no").
# BROKER_BASE / BROKER_NEW and BENCH_BASE / BENCH_NEW: extra ferry-broker and ferry-bench flags
# for that side (e.g. BROKER_NEW=--no-journal, BENCH_NEW="--stored-input-bytes 0"); WORKER_BASE /
# WORKER_NEW the same for ferry-worker. MAX_BATCH (8): the worker's --max-batch.
# CURVE on one side: see bench/curve_ab.sh.
set -uo pipefail
. "$(dirname "$0")/lib.sh"  # free_port, cpu_ns, stop_pids_and_remove
[ $# -ge 2 ] || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
BASE=$(cd "$1" && pwd); NEW=$(cd "$2" && pwd)
ROUNDS=${3:-4}; JOBS=${4:-400}; MODEL=${5:-null}
SHAPE=${SHAPE:-3,224,224}; DTYPE=${DTYPE:-float32}; C=${C:-16}
WORK=$(mktemp -d /tmp/ferry-abcpu-XXXXXX)
PIDS=()
trap 'stop_pids_and_remove "$WORK"' EXIT
"$NEW/gpu-worker/ferry-make-models" "$WORK/models" >/dev/null || exit 1
declare -A FRONT REDIS REDIS_PID BROKER_PID WORKER_PID BUILD
start() {  # NAME BUILD ENV REDIS_ENV REDIS_ARGS BROKER_ARGS WORKER_ARGS
  local name=$1 build=$2 rport fport bport env=(env) redis_env=(env) redis_args broker_args worker_args
  read -r -a extra <<<"${3:-}"
  env+=("${extra[@]}")
  read -r -a extra <<<"${4:-}"
  redis_env+=("${extra[@]}")
  read -r -a redis_args <<<"${5:-}"
  read -r -a broker_args <<<"${6:-}"
  read -r -a worker_args <<<"${7:-}"
  rport=$(free_port); fport=$(free_port); bport=$(free_port)
  mkdir -p "$WORK/$name"
  "${redis_env[@]}" redis-server --port "$rport" --bind 127.0.0.1 --dir "$WORK/$name" --save '' \
    --appendonly no "${redis_args[@]}" >"$WORK/$name/redis.log" 2>&1 &
  REDIS_PID[$name]=$!; PIDS+=($!)
  for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
  redis-cli -p "$rport" ping >/dev/null 2>&1 || { echo "ab_cpu.sh: redis-server did not start" >&2; exit 1; }
  "${env[@]}" "$build/broker/ferry-broker" --frontend "tcp://127.0.0.1:$fport" \
    --backend "tcp://127.0.0.1:$bport" --redis "redis://127.0.0.1:$rport" --log-level warn \
    "${broker_args[@]}" >"$WORK/$name/broker.log" 2>&1 &
  BROKER_PID[$name]=$!; PIDS+=($!)
  "${env[@]}" "$build/gpu-worker/ferry-worker" --model "$MODEL=$WORK/models/$MODEL.pt" --device cpu \
    --max-batch "${MAX_BATCH:-8}" --instances "${INSTANCES:-1}" --threads "${THREADS:-1}" \
    --broker "tcp://127.0.0.1:$bport" --redis "redis://127.0.0.1:$rport" --log-level warn \
    "${worker_args[@]}" >"$WORK/$name/worker.log" 2>&1 &
  WORKER_PID[$name]=$!; PIDS+=($!)  # env and the worker's re-exec keep the PID
  FRONT[$name]="tcp://127.0.0.1:$fport"; REDIS[$name]="redis://127.0.0.1:$rport"
  BUILD[$name]=$build
}
start base "$BASE" "${ENV_BASE:-}" "${REDIS_ENV_BASE:-}" "${REDIS_ARGS_BASE:-}" "${BROKER_BASE:-}" \
  "${WORKER_BASE:-}"
start new "$NEW" "${ENV_NEW:-}" "${REDIS_ENV_NEW:-}" "${REDIS_ARGS_NEW:-}" "${BROKER_NEW:-}" \
  "${WORKER_NEW:-}"
declare -A BENCH_EXTRA=([base]="${BENCH_BASE:-}" [new]="${BENCH_NEW:-}")
sleep 3
for name in base new; do
  kill -0 "${BROKER_PID[$name]}" "${WORKER_PID[$name]}" 2>/dev/null ||
    { echo "ab_cpu.sh: the $name fleet did not start: $(tail -3 "$WORK/$name/"*.log)" >&2; exit 1; }
done
run() {  # NAME: one measured run, printed as one field group
  local name=$1 r0 b0 w0 r1 b1 w1 perf=() extra
  read -r -a extra <<<"${BENCH_EXTRA[$name]}"
  # shellcheck disable=SC2054  # the comma separates perf's events, not array elements
  [ "${PERF:-0}" = 1 ] && perf=(perf stat -e page-faults,task-clock -o "$WORK/$name/perf.txt")
  r0=$(cpu_ns "${REDIS_PID[$name]}"); b0=$(cpu_ns "${BROKER_PID[$name]}")
  w0=$(cpu_ns "${WORKER_PID[$name]}")
  "${perf[@]}" "${BUILD[$name]}/bench/ferry-bench" --frontend "${FRONT[$name]}" \
    --redis "${REDIS[$name]}" --wait-workers 1 --model "$MODEL" --shape "$SHAPE" --dtype "$DTYPE" \
    --concurrency "$C" --loaders 2 --submit-batch 8 --jobs "$JOBS" --json "$WORK/$name/run.json" \
    "${extra[@]}" \
    >"$WORK/$name/bench.log" 2>&1 ||
    { echo "ferry-bench failed: $(tail -3 "$WORK/$name/bench.log")"; return; }
  r1=$(cpu_ns "${REDIS_PID[$name]}"); b1=$(cpu_ns "${BROKER_PID[$name]}")
  w1=$(cpu_ns "${WORKER_PID[$name]}")
  python3 - "$WORK/$name" "$((b1 - b0))" "$((r1 - r0))" "$((w1 - w0))" <<'PY'
import json, os, re, sys
d, broker, redis, worker = sys.argv[1], *map(int, sys.argv[2:])
r = json.load(open(os.path.join(d, "run.json")))
per_job = lambda ns: ns / 1e3 / r["jobs"]
out = "%7.1f jobs/s  broker %5.0f  redis %5.0f  worker %6.0f  bench %5.0f  batch %4.1f" % (
    r["throughput"], per_job(broker), per_job(redis), per_job(worker),
    r["bench_cpu_s"] / r["jobs"] * 1e6, r.get("batch_size_mean", 0))
perf = os.path.join(d, "perf.txt")
if os.path.exists(perf):
    text = open(perf).read()
    faults = re.search(r"([\d,]+)\s+page-faults", text)
    clock = re.search(r"([\d.,]+)\s+msec task-clock", text)
    out += "  (bench faults %s, task-clock %s ms)" % (
        faults.group(1) if faults else "?", clock.group(1) if clock else "?")
print(out, end="")
PY
}
echo "# ${JOBS} jobs of $MODEL [$SHAPE] $DTYPE per run, C=$C; CPU us per job"
run base >/dev/null; run new >/dev/null  # warm-up pair, not shown
for i in $(seq "$ROUNDS"); do
  if [ $((i % 2)) = 1 ]; then
    b=$(run base); n=$(run new)
  else
    n=$(run new); b=$(run base)
  fi
  echo "round $i  base $b"
  echo "        new  $n"
done
