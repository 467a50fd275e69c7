#!/usr/bin/env bash
# The Ferry benchmark suite (issue 5; see docs/performance.md).
#
#   bash bench/run.sh BUILD_DIR [--quick] [--out DIR] [--only NAME[,NAME...]] [--perf]
#
# Starts redis-server on a free port, makes the benchmark models, and for every scenario starts
# a fresh ferry-broker and ferry-workers on free ports, runs ferry-bench, and stops them. Writes
# one JSON file per run into DIR (default, outside the repository:
# ${TMPDIR:-/tmp}/ferry-bench-results/<date>-<device>[-quick][-half]) -- each with the exact
# ferry-bench command, the fleet's command lines, the machine, and the CPU seconds every process
# spent during the run -- plus machine.json and summary.txt.
# Scenarios: tiny_closed tiny_light tiny_light_run tiny_light_no_push tiny_light_pinned encoder
# resnet whisper seed ceiling bytes audio (audio, audio_unix, audio_attached, audio_no_journal)
# audio_out. It prints one table. The full
# suite takes ~10 min on a 2-core machine; --quick is a ~1 minute smoke run (small job counts;
# numbers not meaningful).
# --perf also samples the whole machine (perf record -a) during each measured run and writes
# NAME.perf.txt: a flat profile by process, library and symbol.
# On a shared machine the numbers move with other load: each JSON records `foreign_cpu_s`, the
# CPU seconds used by processes outside the run, and fleet-vs-raw pairs are run in alternating
# rounds so that their ratio is taken under the same conditions.
# Environment: FERRY_BENCH_DEVICE (cpu; cuda:0 on a GPU machine: docs/gpu.md) is the workers' and
# --raw's device; ROUNDS (3; --quick 1) the fleet-vs-raw and audio rounds; AUDIO_JOBS (1000) the
# audio runs' jobs; WHISPER_SAMPLES (80000: 5 s clips), WHISPER_BATCHES ("8 16 32": the --raw
# batch sizes tried), WHISPER_BATCH (16: the fleet-vs-raw pair's) and WHISPER_JOBS (jobs per
# whisper run; default 8 batches for --raw, 160 for the pair). WHISPER_BATCH=best: the --raw
# batch size that did best; WHISPER_HALF=1 (CUDA): whisper in float16 on both sides, --raw --half
# and the model repository's `half = true`. FERRY_BROKER_FLAGS and FERRY_REDIS_FLAGS: extra flags
# for every broker and for redis-server.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
BUILD=$(cd "$1" && pwd); shift
QUICK=0; OUT=""; ONLY=""; PERF=0
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --out) OUT=$2; shift ;;
    --only) ONLY=$2; shift ;;
    --perf) PERF=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
# The names --only takes (`audio` runs audio, audio_unix, audio_attached and audio_no_journal: one
# round of them).
SCENARIOS="tiny_closed tiny_light tiny_light_run tiny_light_no_push tiny_light_pinned encoder resnet \
seed ceiling bytes audio audio_out whisper"
for name in ${ONLY//,/ }; do
  [[ " $SCENARIOS " == *" $name "* ]] ||
    { echo "run.sh: no scenario $name (--only takes: $SCENARIOS)" >&2; exit 2; }
done
HERE=$(cd "$(dirname "$0")" && pwd)
DEVICE=${FERRY_BENCH_DEVICE:-cpu}
BENCH=$BUILD/bench/ferry-bench
BROKER=$BUILD/broker/ferry-broker
WORKER=$BUILD/gpu-worker/ferry-worker
MAKE_MODELS=$BUILD/gpu-worker/ferry-make-models
FLOOR=$BUILD/bench/ferry-floor  # optional: the audio scenarios' floor
for b in "$BENCH" "$BROKER" "$WORKER" "$MAKE_MODELS"; do
  [ -x "$b" ] || { echo "run.sh: missing $b (build ferry-bench ferry-broker ferry-worker ferry-make-models)" >&2; exit 1; }
done
if { [ -z "$ONLY" ] || [[ ",$ONLY," == *,audio* ]]; } && [ ! -x "$FLOOR" ]; then
  echo "run.sh: no $FLOOR (build ferry-floor): the audio runs get no floor and no share of it" >&2
fi
command -v redis-server >/dev/null || { echo "run.sh: redis-server not installed" >&2; exit 1; }
if [ -z "$OUT" ]; then
  OUT=${TMPDIR:-/tmp}/ferry-bench-results/$(date +%Y-%m-%d)-${DEVICE//:/}$([ $QUICK = 1 ] && echo -quick || true)$([ "${WHISPER_HALF:-0}" = 1 ] && echo -half || true)
fi
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/ferry-bench-XXXXXX)
FLEET_PIDS=()
REDIS_PID=""
FAILED=()

. "$HERE/lib.sh"  # free_port, cpu_ns, reap
stop_fleet() {
  # Workers first (they drain and say BYE), then the broker.
  local pids=("${FLEET_PIDS[@]}") i rc
  for ((i=${#pids[@]}-1; i>=0; i--)); do kill -TERM "${pids[$i]}" 2>/dev/null || true; done
  # Each drains and exits 0; any other status (a crash at exit, say) fails the suite. One that
  # is still there after 20 s (a hang in its teardown) is killed, and fails it too.
  for ((i=0; i<${#pids[@]}; i++)); do
    rc=0; reap "${pids[$i]}" 20 || rc=$?
    [ "$rc" = 0 ] || FAILED+=("${LAST_RUN:-fleet}:$([ "$i" = 0 ] && echo broker || echo worker)-exit-$rc")
  done
  FLEET_PIDS=()
  FLEET_CMD=""
}
cleanup() {
  stop_fleet
  [ -n "$REDIS_PID" ] && { kill -TERM "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; }
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# CPU seconds the whole machine has been busy (all cores, everything but idle and iowait).
busy_cpu() {
  awk -v hz="$(getconf CLK_TCK)" '/^cpu / { print ($2 + $3 + $4 + $7 + $8 + $9) / hz }' /proc/stat
}
# CPU seconds (user + system) a process has used so far, to the nanosecond (lib.sh's cpu_ns;
# /proc/PID/stat's 10 ms ticks are a step of 10 µs per job in a 1,000-job run).
cpu_of() { awk -v ns="$(cpu_ns "$1")" 'BEGIN { printf "%.9f\n", ns / 1e9 }'; }

# ---- machine ----------------------------------------------------------------------------------
TORCH_VERSION=$(dpkg-query -W -f '${Version}' libtorch-dev 2>/dev/null || true)
BLAS=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | awk '/^Value:/ {print $2}' || true)
OMP_ENV=$(env | grep -E '^(OMP_|GOMP_|OPENBLAS_|MKL_)' | sort | tr '\n' ' ' || true)
if [ "$DEVICE" != cpu ]; then  # a GPU machine: its card, and the libtorch of its PyTorch
  TORCH_VERSION=${TORCH_VERSION:-$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || true)}
  GPU_INDEX=${DEVICE#cuda}; GPU_INDEX=${GPU_INDEX#:}
  GPU=$({ nvidia-smi -i "${GPU_INDEX:-0}" --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true; } | head -1)
  OMP_ENV="device $DEVICE: ${GPU:-?}${OMP_ENV:+; $OMP_ENV}"
fi
MACHINE="nproc=$(nproc); $(lscpu | grep 'Model name' | sed 's/  */ /g'); libtorch ${TORCH_VERSION:-?}; BLAS ${BLAS:-?}; $(uname -sr)${OMP_ENV:+; env: $OMP_ENV}${FERRY_REDIS_FLAGS:+; redis-server $FERRY_REDIS_FLAGS}"
GIT=$(cd "$HERE/.." && git rev-parse --short HEAD 2>/dev/null || echo ?)$(cd "$HERE/.." && git diff --quiet HEAD 2>/dev/null || echo +dirty)
python3 - "$OUT/machine.json" "$MACHINE" "$GIT" "$QUICK" <<'PY'
import json, sys
json.dump({"machine": sys.argv[2], "git": sys.argv[3], "quick": sys.argv[4] == "1"},
          open(sys.argv[1], "w"), indent=1)
PY
echo "run.sh: $MACHINE; git $GIT"
echo "run.sh: results -> $OUT"

# ---- models and redis -------------------------------------------------------------------------
"$MAKE_MODELS" "$WORK/models" >/dev/null
REDIS_PORT=$(free_port)
# shellcheck disable=SC2086  # FERRY_REDIS_FLAGS: extra redis-server flags, e.g. --io-threads 2
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$WORK" --save '' --appendonly no \
  --unixsocket "$WORK/redis.sock" --unixsocketperm 700 ${FERRY_REDIS_FLAGS:-} >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 100); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
  echo "run.sh: redis-server did not start (FERRY_REDIS_FLAGS=${FERRY_REDIS_FLAGS:-}):" >&2
  cat "$WORK/redis.log" >&2
  exit 1
fi
REDIS="redis://127.0.0.1:$REDIS_PORT"
REDIS_UNIX="unix://$WORK/redis.sock"  # the same Redis over its Unix-domain socket (audio_unix)

# start_fleet N WORKER_FLAGS...: a fresh broker and N workers (each given WORKER_FLAGS).
start_fleet() {
  local n=$1; shift
  FRONT="tcp://127.0.0.1:$(free_port)"; BACK="tcp://127.0.0.1:$(free_port)"
  redis-cli -p "$REDIS_PORT" flushall >/dev/null
  # shellcheck disable=SC2086  # FERRY_BROKER_FLAGS: extra broker flags, e.g. --no-journal
  "$BROKER" --frontend "$FRONT" --backend "$BACK" --redis "$REDIS" --log-level warn \
    ${FERRY_BROKER_FLAGS:-} >>"$WORK/broker.log" 2>&1 &
  FLEET_PIDS=($!)
  FLEET_CMD="ferry-broker --frontend $FRONT --backend $BACK --redis $REDIS ${FERRY_BROKER_FLAGS:-}; $n x ferry-worker $*"
  for ((i=0; i<n; i++)); do
    "$WORKER" --broker "$BACK" --redis "$REDIS" --log-level warn "$@" >>"$WORK/worker.log" 2>&1 &
    FLEET_PIDS+=($!)
  done
}

# bench NAME JOBS WARMUP FERRY_BENCH_FLAGS...: runs ferry-bench against the fleet (or --raw) and
# writes $OUT/NAME.json with the command, the fleet, the machine and per-process CPU seconds.
# Against a fleet the warmup is a separate ferry-bench run first (closed loop), so that the CPU
# seconds sampled around the measured run cover it alone.
bench() {
  local name=$1 jobs=$2 warmup=$3; shift 3
  local json=$OUT/$name.json
  LAST_RUN=$name
  rm -f "$json"  # a failed run leaves none (not an older day's, in the same folder)
  if [[ " $* " == *" --raw "* ]]; then
    set -- "$@" --jobs "$jobs" --warmup "$warmup"
  else
    "$BENCH" "$@" --jobs "$warmup" --rate 0 >"$WORK/$name.warmup" 2>&1 || cat "$WORK/$name.warmup"
    set -- "$@" --jobs "$jobs"
  fi
  local broker_pid=${FLEET_PIDS[0]:-}
  local c_redis c_broker c_workers=0 pid
  c_redis=$(cpu_of "$REDIS_PID"); c_broker=$([ -n "$broker_pid" ] && cpu_of "$broker_pid" || echo 0)
  for pid in "${FLEET_PIDS[@]:1}"; do c_workers=$(echo "$c_workers + $(cpu_of "$pid")" | bc -l); done
  local rc=0 perf_pid="" c_busy
  if [ $PERF = 1 ]; then
    perf record -a -F 999 -e cpu-clock -o "$WORK/$name.perf" >/dev/null 2>&1 &
    perf_pid=$!
    sleep 0.5
  fi
  c_busy=$(busy_cpu)
  local t0; t0=$(date +%s.%N)
  redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
  "$BENCH" --json "$json.tmp" --label "$name" "$@" >"$WORK/$name.out" 2>&1 || rc=$?
  local d_busy wall
  d_busy=$(echo "$(busy_cpu) - $c_busy" | bc -l)
  wall=$(echo "$(date +%s.%N) - $t0" | bc -l)
  redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' | grep '^cmdstat_' >"$WORK/$name.redis" || true
  if [ -n "$perf_pid" ]; then
    kill -INT "$perf_pid"; wait "$perf_pid" 2>/dev/null || true
    perf script -i "$WORK/$name.perf" -F comm,pid,tid,ip,sym,dso 2>/dev/null |
      python3 "$HERE/perf_summary.py" >"$OUT/$name.perf.txt" || true
    rm -f "$WORK/$name.perf"
  fi
  local d_redis d_broker d_workers=0
  d_redis=$(echo "$(cpu_of "$REDIS_PID") - $c_redis" | bc -l)
  d_broker=$([ -n "$broker_pid" ] && echo "$(cpu_of "$broker_pid") - $c_broker" | bc -l || echo 0)
  for pid in "${FLEET_PIDS[@]:1}"; do d_workers=$(echo "$d_workers + $(cpu_of "$pid")" | bc -l); done
  d_workers=$(echo "$d_workers - $c_workers" | bc -l)
  cat "$WORK/$name.out"
  [ "$rc" = 0 ] || FAILED+=("$name")
  if [ ! -s "$json.tmp" ]; then echo "run.sh: $name failed (rc $rc)" >&2; return 0; fi
  python3 - "$json.tmp" "$json" "$OUT/machine.json" "$BENCH $*" "${FLEET_CMD:-}" \
      "$d_redis" "$d_broker" "$d_workers" "$rc" "$d_busy" "$(cat /proc/loadavg)" "$WORK/$name.redis" "$wall" <<'PY'
import json, sys
src, dst, machine, cmd, fleet, redis, broker, workers, rc, busy, loadavg, redis_stats, wall = sys.argv[1:]
r = json.load(open(src))
m = json.load(open(machine))
r["command"] = cmd
r["fleet"] = fleet
r["machine"] = m["machine"]
r["git"] = m["git"]
r["exit_code"] = int(rc)
r["loadavg_after"] = loadavg
ours = r.get("process_cpu_s", 0.0)
if r.get("mode") != "raw":
    ours += float(redis) + float(broker) + float(workers)
r["machine_busy_cpu_s"] = round(float(busy), 2)
r["bench_wall_s"] = round(float(wall), 2)  # ferry-bench's whole run, startup included
# CPU used by processes outside this run (other users of a shared machine), and per wall second
r["foreign_cpu_s"] = round(max(0.0, float(busy) - ours), 2)
r["foreign_cores"] = round(r["foreign_cpu_s"] / max(float(wall), 1e-9), 2)
if r.get("mode") != "raw":
    cpu = {"redis": float(redis), "broker": float(broker), "workers": float(workers),
           "bench": r.get("bench_cpu_s", 0.0)}
    r["cpu_s"] = cpu
    jobs = max(1, r["jobs"])
    r["cpu_us_per_job"] = {k: round(v * 1e6 / jobs, 2) for k, v in cpu.items()}
    # Redis commands per job (warmup excluded), e.g. {"get": 1.4, "set": 1.0}
    calls = {}
    for line in open(redis_stats):
        name, fields = line.strip()[len("cmdstat_"):].split(":", 1)
        kv = dict(f.split("=", 1) for f in fields.split(","))
        if name.split("|")[0] not in ("config", "info", "ping", "flushall"):
            calls[name] = round(int(kv["calls"]) / jobs, 3)
    r["redis_calls_per_job"] = calls
json.dump(r, open(dst, "w"), indent=1)
PY
  rm -f "$json.tmp"
}

want() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }
q() { [ $QUICK = 1 ] && echo "$1" || echo "$2"; }   # q QUICK_VALUE FULL_VALUE
M=$WORK/models

# ---- tiny: Ferry's own overhead -----------------------------------------------------------------
TINY_WORKER=(--model "tiny=$M/tiny.pt" --device "$DEVICE" --max-batch 256 --instances 1 --threads 1)
if want tiny_closed; then
  echo "== tiny, closed loop, concurrency 1024: throughput"
  start_fleet 1 "${TINY_WORKER[@]}"
  bench tiny_closed "$(q 20000 300000)" "$(q 2000 20000)" --frontend "$FRONT" --redis "$REDIS" \
    --wait-workers 1 --model tiny --shape 8 --concurrency 1024 --loaders 4
  stop_fleet
fi
if want tiny_light || want tiny_light_run || want tiny_light_no_push; then
  echo "== tiny, concurrency 1: light-load latency (Submit + Wait, Run, and without notices)"
  start_fleet 1 "${TINY_WORKER[@]}"
  if want tiny_light; then
    bench tiny_light "$(q 1000 10000)" 500 --frontend "$FRONT" --redis "$REDIS" \
      --wait-workers 1 --model tiny --shape 8 --concurrency 1
  fi
  # The same fleet through Client::Run: no ACCEPTED per job (docs/performance.md, "Client::Run").
  if want tiny_light_run; then
    bench tiny_light_run "$(q 1000 10000)" 500 --frontend "$FRONT" --redis "$REDIS" \
      --wait-workers 1 --model tiny --shape 8 --concurrency 1 --run
  fi
  # The same fleet, broker FINISHED notices only: what the workers' notices save (docs/performance.md, "Result notices straight from the worker").
  if want tiny_light_no_push; then
    bench tiny_light_no_push "$(q 1000 10000)" 500 --frontend "$FRONT" --redis "$REDIS" \
      --wait-workers 1 --model tiny --shape 8 --concurrency 1 --no-push
  fi
  stop_fleet
fi

# tiny_light with each process held to one CPU, as a deployment gets with CPUAffinity= or taskset
# (docs/performance.md, "Pinning processes to CPUs"): broker and ferry-bench on CPU 0, redis and the worker on CPU 1.
if want tiny_light_pinned && taskset -c 0,1 true 2>/dev/null; then
  echo "== tiny, concurrency 1, processes pinned: broker and bench on CPU 0, redis and worker on CPU 1"
  start_fleet 1 "${TINY_WORKER[@]}"
  ALL_CPUS=$(taskset -p $$ | sed 's/.*: //')  # this shell's mask, to restore
  taskset -a -p -c 0 "${FLEET_PIDS[0]}" >/dev/null
  taskset -a -p -c 1 "${FLEET_PIDS[1]}" >/dev/null
  taskset -a -p -c 1 "$REDIS_PID" >/dev/null
  taskset -p -c 0 $$ >/dev/null  # ferry-bench inherits it
  FLEET_CMD="$FLEET_CMD; pinned with taskset: broker 0, redis 1, worker 1, ferry-bench 0"
  bench tiny_light_pinned "$(q 1000 10000)" 500 --frontend "$FRONT" --redis "$REDIS" \
    --wait-workers 1 --model tiny --shape 8 --concurrency 1
  taskset -p "$ALL_CPUS" $$ >/dev/null
  taskset -a -p "$ALL_CPUS" "$REDIS_PID" >/dev/null
  stop_fleet
fi

# ---- encoder and resnet: fleet vs the model alone, same batch size, same 2-thread budget -------
# Alternating rounds (raw, fleet, fleet, raw, ...) so each fleet/raw ratio is taken under the same
# outside load. Two fleet layouts with the same budget: one executor with 2 intra-op threads
# (fleet, what --raw --threads 2 does) and two executors with 1 thread each (fleet_i2).
ROUNDS=${ROUNDS:-$(q 1 3)}
ENC_T=64
RES=224
# pair NAME MODEL FILE SHAPE DTYPE JOBS WARMUP [BATCH]: BATCH (default 8) is --raw's batch and the
# fleet's --max-batch; the producers keep 3 (one executor) or 4 (two) batches' worth in flight.
# PAIR_RAW_FLAGS: more --raw flags; PAIR_MODELS: a model repository file the workers load MODEL
# from instead of FILE (both for WHISPER_HALF).
pair() {
  local name=$1 model=$2 file=$3 shape=$4 dtype=$5 jobs=$6 warm=$7 b=${8:-8} r
  local serve=(--model "$model=$file")
  [ -z "${PAIR_MODELS:-}" ] || serve=(--models "$PAIR_MODELS")
  for r in $(seq "$ROUNDS"); do
    # shellcheck disable=SC2086  # PAIR_RAW_FLAGS: words
    bench "${name}_raw_r$r" "$jobs" "$warm" --raw "$file" --batch "$b" --device "$DEVICE" --threads 2 \
      --shape "$shape" --dtype "$dtype" ${PAIR_RAW_FLAGS:-}
    start_fleet 1 "${serve[@]}" --device "$DEVICE" --max-batch "$b" --instances 1 --threads 2
    bench "${name}_fleet_r$r" "$jobs" "$warm" --frontend "$FRONT" --redis "$REDIS" --wait-workers 1 \
      --model "$model" --shape "$shape" --dtype "$dtype" --concurrency $((3 * b)) --loaders 3 \
      --submit-batch 8
    stop_fleet
    start_fleet 1 "${serve[@]}" --device "$DEVICE" --max-batch "$b" --instances 2 --threads 1
    bench "${name}_fleet_i2_r$r" "$jobs" "$warm" --frontend "$FRONT" --redis "$REDIS" --wait-workers 1 \
      --model "$model" --shape "$shape" --dtype "$dtype" --concurrency $((4 * b)) --loaders 4 \
      --submit-batch 8
    stop_fleet
  done
}
if want encoder; then
  echo "== encoder [${ENC_T},384]: fleet vs --raw at batch 8, 2 threads, $ROUNDS round(s)"
  pair encoder encoder "$M/encoder.pt" "$ENC_T,384" float32 "$(q 160 480)" 48
fi
if want resnet; then
  echo "== resnet-18 [3,${RES},${RES}]: fleet vs --raw at batch 8, 2 threads, $ROUNDS round(s)"
  pair resnet resnet "$M/resnet.pt" "3,$RES,$RES" float32 "$(q 16 160)" 16
  echo "== resnet-18, uint8 input [3,${RES},${RES}] converted in the model (4x fewer bytes per job)"
  pair resnet_u8 resnet_u8 "$M/resnet_u8.pt" "3,$RES,$RES" uint8 "$(q 16 160)" 16
fi

# ---- whisper: the Whisper-shaped pipeline (whisper.pt), fleet vs the model alone ---------------
# 5 s clips of int16 PCM ([80000], 160 KB: stored in Redis by the SDK's claim check), decoded to
# 24 tokens. First --raw at batch 8, 16 and 32 (the best batch size), then fleet vs --raw at 16
# in alternating rounds. table.py adds audio seconds transcribed per second.
WHISPER_SAMPLES=${WHISPER_SAMPLES:-80000}
WHISPER_BATCHES=${WHISPER_BATCHES:-8 16 32}
WHISPER_BATCH=${WHISPER_BATCH:-16}
if want whisper; then
  HALF_RAW="" HALF_MODELS=""  # WHISPER_HALF=1: --raw --half, and the workers' `half = true`
  if [ "${WHISPER_HALF:-0}" = 1 ]; then
    HALF_RAW=--half HALF_MODELS=$WORK/whisper_half.toml
    printf '[models.whisper]\npath = "%s"\nhalf = true\n' "$M/whisper.pt" >"$HALF_MODELS"
  fi
  echo "== whisper: [${WHISPER_SAMPLES}] int16 clips, --raw at batch ${WHISPER_BATCHES// /, }${HALF_RAW:+, float16}"
  for b in $WHISPER_BATCHES; do
    # shellcheck disable=SC2086  # HALF_RAW: no word or one
    bench "whisper_raw_b$b" "${WHISPER_JOBS:-$(q $((2 * b)) $((8 * b)))}" "$b" --raw "$M/whisper.pt" \
      --batch "$b" --device "$DEVICE" --threads 2 --shape "$WHISPER_SAMPLES" --dtype int16 $HALF_RAW
  done
  if [ "$WHISPER_BATCH" = best ]; then  # the --raw batch size of the highest throughput
    WHISPER_BATCH=$(python3 - "$OUT" $WHISPER_BATCHES <<'PY'
import json, sys
def rate(b):
    try:
        return json.load(open(f"{sys.argv[1]}/whisper_raw_b{b}.json"))["throughput"]
    except (OSError, ValueError, KeyError):
        return 0
print(max(sys.argv[2:] or ["16"], key=rate))
PY
)
  fi
  echo "== whisper: fleet vs --raw at batch $WHISPER_BATCH, 2 threads, $ROUNDS round(s)"
  PAIR_RAW_FLAGS=$HALF_RAW PAIR_MODELS=$HALF_MODELS pair whisper whisper "$M/whisper.pt" \
    "$WHISPER_SAMPLES" int16 "${WHISPER_JOBS:-$(q 32 160)}" $((2 * WHISPER_BATCH)) "$WHISPER_BATCH"
fi

# ---- the seed scenario: 250 jobs/s open loop on the encoder, batching vs none -------------------
# T=16: on 2 cores the encoder does ~500 jobs/s at batch 16 but ~220 at batch 1, so 250 jobs/s is
# within reach only with batching (at T=64 even batch 16 tops out near 130 jobs/s).
SEED_T=16
if want seed; then
  for mb in 16 1; do
    echo "== seed: encoder [${SEED_T},384], open loop 250 jobs/s, --max-batch $mb"
    start_fleet 1 --model "encoder=$M/encoder.pt" --device "$DEVICE" --max-batch "$mb" --instances 1 --threads 2
    bench "seed_maxbatch$mb" "$(q 500 2500)" 50 --frontend "$FRONT" --redis "$REDIS" --wait-workers 1 \
      --model encoder --shape "$SEED_T,384" --rate 250 --concurrency 8
    stop_fleet
  done
fi

# ---- broker dispatch ceiling: workers that compute nothing -------------------------------------
if want ceiling; then
  for n in 1 2 4 8; do
    echo "== dispatch ceiling: null model, $n worker(s)"
    start_fleet "$n" --model "null=$M/null.pt" --device "$DEVICE" --max-batch 64 --instances 1 --threads 1
    bench "ceiling_w$n" "$(q 10000 150000)" "$(q 1000 10000)" --frontend "$FRONT" --redis "$REDIS" \
      --wait-workers "$n" --model null --shape 1 --concurrency 1024 --loaders 4
    stop_fleet
  done
fi

# ---- bytes: what a big job costs the broker (null model: no compute, 602 KB float32 inputs) ----
# Read cpu us/job of the broker: it receives, queues and forwards every input byte
# (--stored-input-bytes 0: not the SDK's claim check, which would keep the bytes off the broker).
if want bytes; then
  echo "== bytes: null model, [3,224,224] float32 jobs (602 KB each): broker CPU per job"
  start_fleet 1 --model "null=$M/null.pt" --device "$DEVICE" --max-batch 8 --instances 1 --threads 1
  bench bytes "$(q 100 400)" 16 --frontend "$FRONT" --redis "$REDIS" --wait-workers 1 \
    --model null --shape 3,224,224 --concurrency 16 --loaders 2 --submit-batch 8 \
    --stored-input-bytes 0
  stop_fleet
fi

# ---- audio: speech-sized jobs, beside the floor ------------------------------------------------
# 960 KB per job, 30 s of 16 kHz int16 PCM ([480000]), into head.pt (it reads 4 values and returns
# 16 bytes): the input path, with the broker's journal on (durable) and off. audio_out: 64 bytes
# in, 960 KB out (expand.pt): the result path, the producer consuming each result as it reads it
# (--consume: GETDEL, so that Redis reuses the memory instead of keeping every result). The floor
# (ferry-floor: bare libzmq, producer -> relay -> consumer and producer -> consumer, and Redis SET
# / GET of 960 KB values, no Ferry code) is measured in every round, before and after that round's
# runs, and table.py gives each run's MB/s as a share of the mean of its round's two two-hop floors.
# Durable (the journal on), big inputs go to Redis (the SDK's default claim check: the broker
# journals only their dtype and shape). Without the journal they go through the broker
# (--stored-input-bytes 0): the two hops of the floor, producer -> broker -> worker, with Redis
# out of the input path (the durable claim check moved as many bytes: docs/performance.md).
# audio_unix: durable as `audio`, the broker, the worker and the producer reaching Redis over its
# Unix-domain socket (unix://, for members on Redis's host); its rounds also measure the floor
# over ipc:// before and after (floor_rN_ipc[_end].json, with Redis's SET and GET over the
# socket), the like-for-like local floor, beside the TCP one the targets name. audio_attached:
# durable, the bytes through the broker as attached inputs and into its journal (no_journal
# changes two things; this one, one). The four run under `--only audio`.
AUDIO_WORKER=(--device "$DEVICE" --max-batch 8 --instances 1 --threads 1)
# audio_bench NAME FERRY_BENCH_FLAGS...: against the fleet start_fleet just started. Inputs: 32
# in flight over 4 producer threads; outputs: 16 over 2 (each thread reads its results one at a
# time; more threads only add allocator contention in the producer, measured 1,250 vs 1,650 MB/s).
AUDIO_JOBS=${AUDIO_JOBS:-$(q 100 1000)}  # jobs per run, and messages of the floor
audio_bench() {
  local name=$1; shift
  bench "$name" "$AUDIO_JOBS" 32 --frontend "$FRONT" --redis "$REDIS" --wait-workers 1 "$@"
}
AUDIO_IN=(--concurrency 32 --loaders 4 --submit-batch 4)
AUDIO_OUT=(--concurrency 16 --loaders 2 --submit-batch 4)
if want audio || want audio_out; then
  for r in $(seq "$ROUNDS"); do
    if [ -x "$FLOOR" ]; then
      echo "== floor, round $r: bare libzmq and Redis, 960 KB messages"
      "$FLOOR" --bytes 960000 --messages "$(( AUDIO_JOBS > 300 ? AUDIO_JOBS : 300 ))" --redis "$REDIS" \
        --json "$OUT/floor_r$r.json" || FAILED+=("floor_r$r")
      if want audio; then
        echo "== floor over ipc://, round $r (Redis over its Unix-domain socket)"
        "$FLOOR" --bytes 960000 --messages "$(( AUDIO_JOBS > 300 ? AUDIO_JOBS : 300 ))" \
          --transport ipc --redis "$REDIS_UNIX" --json "$OUT/floor_r${r}_ipc.json" ||
          FAILED+=("floor_r${r}_ipc")
      fi
    fi
    if want audio; then
      for variant in durable unix attached no_journal; do
        name=audio_r$r; flags=""; producer=(); redis=$REDIS
        case $variant in
          unix) name=audio_unix_r$r; redis=$REDIS_UNIX ;;
          # attached: durable, the bytes through the broker (and into its journal), to set beside
          # no_journal, which changes both
          attached) name=audio_attached_r$r; producer=(--stored-input-bytes 0) ;;
          no_journal) name=audio_no_journal_r$r; flags=--no-journal; producer=(--stored-input-bytes 0) ;;
        esac
        echo "== $name: head model, [480000] int16 jobs (960 KB each), $variant, Redis at $redis"
        REDIS=$redis FERRY_BROKER_FLAGS="$flags" start_fleet 1 --model "head=$M/head.pt" \
          "${AUDIO_WORKER[@]}"
        REDIS=$redis audio_bench "$name" "${AUDIO_IN[@]}" --model head --shape 480000 \
          --dtype int16 "${producer[@]}"
        stop_fleet
      done
    fi
    if want audio_out; then
      echo "== audio_out_r$r: expand model, [16] float32 in, [240000] float32 (960 KB) out"
      start_fleet 1 --model "expand=$M/expand.pt" "${AUDIO_WORKER[@]}"
      audio_bench "audio_out_r$r" "${AUDIO_OUT[@]}" --model expand --shape 16 --consume
      stop_fleet
    fi
    if [ -x "$FLOOR" ]; then
      echo "== floor, end of round $r"
      "$FLOOR" --bytes 960000 --messages "$(( AUDIO_JOBS > 300 ? AUDIO_JOBS : 300 ))" --redis "$REDIS" \
        --json "$OUT/floor_r${r}_end.json" || FAILED+=("floor_r${r}_end")
      if want audio; then
        "$FLOOR" --bytes 960000 --messages "$(( AUDIO_JOBS > 300 ? AUDIO_JOBS : 300 ))" \
          --transport ipc --redis "$REDIS_UNIX" --json "$OUT/floor_r${r}_ipc_end.json" ||
          FAILED+=("floor_r${r}_ipc_end")
      fi
    fi
  done
fi

# ---- the table ----------------------------------------------------------------------------------
python3 "$HERE/table.py" "$OUT" | tee "$OUT/summary.txt"
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "run.sh: failed runs: ${FAILED[*]} (logs: rerun with --only)" >&2
  exit 1
fi
