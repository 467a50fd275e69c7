#!/usr/bin/env bash
# Instructions per job in the broker and in the producer SDK, by function (docs/performance.md,
# "Instructions per job (callgrind)").
#
#   bash bench/callgrind.sh BUILD_DIR [JOBS=2000] [CONCURRENCY=1] [TOP=25]
#
# Broker: runs two whole lifetimes of ferry-broker under `valgrind --tool=callgrind`, each with a
# fresh redis-server and ferry-worker serving `tiny` (free ports): one serves a 300-job warm-up,
# the other the same warm-up and then JOBS more. The difference of the two profiles, per
# function, divided by JOBS is the broker's work per job (all threads); start-up, warm-up and
# shutdown cancel out. (Zeroing or dumping callgrind's counters while the broker runs gives
# garbage: its main loop never returns.)
# SDK: the measured runs use ferry-bench-sdk (ferry-bench without libtorch, whose dependencies
# valgrind cannot run) under callgrind, collecting only inside `ferry::client::Client::Run`: the
# SDK's work on the caller's thread (encode, send, wait, decode), `--run --concurrency C`.
# Prints instructions per job and the TOP functions by their own (exclusive) instructions per job;
# keeps the callgrind.out files in $CALLGRIND_OUT (${TMPDIR:-/tmp}/ferry-bench-results/callgrind-<date>).
# Everything runs ~50x slower under valgrind: latencies mean nothing here, counts do. Use a
# Release build with ferry-bench-sdk, ferry-broker, ferry-worker and ferry-make-models.
# BENCH_FLAGS: ferry-bench-sdk flags used instead of --run (e.g. "--loaders 4 --submit-batch 64
# --stored-input-bytes 1", the claim-check shape; the SDK table then counts nothing, as it counts
# only inside `Run`); MAX_BATCH: the worker's --max-batch (256).
set -uo pipefail
[ $# -ge 1 ] || { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
command -v valgrind >/dev/null || { echo "callgrind.sh: needs valgrind (apt-get install valgrind)" >&2; exit 2; }
B=$(cd "$1" && pwd); JOBS=${2:-2000}; CONC=${3:-1}; TOP=${4:-25}; WARMUP=300
OUT=${CALLGRIND_OUT:-${TMPDIR:-/tmp}/ferry-bench-results/callgrind-$(date -u +%Y-%m-%d)}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d /tmp/ferry-callgrind-XXXXXX)
PIDS=()
stop_all() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  PIDS=()
}
trap 'stop_all; rm -rf "$W"' EXIT
. "$(dirname "$0")/lib.sh"  # free_port
"$B/gpu-worker/ferry-make-models" "$W/models" >/dev/null

# lifetime NAME MEASURED_JOBS: one fleet with the broker under callgrind; warm-up, then
# MEASURED_JOBS jobs (ferry-bench-sdk under callgrind too, when > 0); the broker then exits.
lifetime() {
  local name=$1 jobs=$2 R F K BP
  R=$(free_port); F=$(free_port); K=$(free_port)
  redis-server --port "$R" --dir "$W" --save '' --appendonly no >/dev/null 2>&1 & PIDS+=($!)
  for _ in $(seq 100); do redis-cli -p "$R" ping >/dev/null 2>&1 && break; sleep 0.05; done
  valgrind --tool=callgrind --callgrind-out-file="$OUT/broker-$name.callgrind.out" \
    "$B/broker/ferry-broker" --frontend "tcp://127.0.0.1:$F" --backend "tcp://127.0.0.1:$K" \
    --redis "redis://127.0.0.1:$R" --log-level warn >"$W/broker-$name.log" 2>&1 &
  BP=$!
  "$B/gpu-worker/ferry-worker" --model "tiny=$W/models/tiny.pt" --device cpu --max-batch "${MAX_BATCH:-256}" \
    --instances 1 --threads 1 --broker "tcp://127.0.0.1:$K" --redis "redis://127.0.0.1:$R" \
    --log-level warn >"$W/worker-$name.log" 2>&1 & PIDS+=($!)
  local args=(--frontend "tcp://127.0.0.1:$F" --redis "redis://127.0.0.1:$R" --model tiny
              --shape 8 --concurrency "$CONC" --timeout-ms 60000 ${BENCH_FLAGS:---run})
  "$B/bench/ferry-bench-sdk" "${args[@]}" --wait-workers 1 --jobs "$WARMUP" >"$W/warmup-$name.log" 2>&1 ||
    { echo "callgrind.sh: warm-up failed (logs in $W)" >&2; trap - EXIT; stop_all; exit 1; }
  if [ "$jobs" -gt 0 ]; then
    valgrind --tool=callgrind --callgrind-out-file="$OUT/sdk.callgrind.out" --collect-atstart=no \
      --toggle-collect='ferry::client::Client::Run(*' \
      "$B/bench/ferry-bench-sdk" "${args[@]}" --jobs "$jobs" --warmup 0 2>"$W/bench.err" |
      grep -E 'latency' || { echo "callgrind.sh: measured run failed" >&2; cat "$W/bench.err" >&2; }
  fi
  kill -TERM "$BP"; wait "$BP" 2>/dev/null
  stop_all
}
lifetime base 0
lifetime measured "$JOBS"

# Exclusive instructions per function of a callgrind file: "IR<TAB>function<TAB>object" lines
# (callgrind_annotate leaves the object out on some lines).
functions() {
  callgrind_annotate --threshold=100 --auto=no "$1" 2>/dev/null |
    awk '/PROGRAM TOTALS/ { next }
      match($0, /^ *[0-9,]+ +\( *[0-9.]+%\) +/) {
        ir = $1; gsub(",", "", ir); fn = substr($0, RLENGTH + 1); obj = ""
        if (match(fn, / \[[^]]*\]$/)) { obj = substr(fn, RSTART + 2, RLENGTH - 3); fn = substr(fn, 1, RSTART - 1) }
        print ir "\t" fn "\t" obj }'
}
functions "$OUT/broker-base.callgrind.out" >"$W/base.txt"
functions "$OUT/broker-measured.callgrind.out" >"$W/measured.txt"
functions "$OUT/sdk.callgrind.out" >"$W/sdk.txt"
python3 - "$W" "$JOBS" "$TOP" <<'EOF'
import sys
w, jobs, top = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
objects = {}
def load(name):
    out = {}
    for line in open(f"{w}/{name}.txt"):
        ir, fn, obj = line.rstrip("\n").split("\t")
        out[fn] = out.get(fn, 0) + int(ir)
        if obj: objects[fn] = obj
    return out
def group(fn):
    obj = objects.get(fn, "")
    if any(k in fn for k in ("malloc", "arena.c", "operator new", "operator delete")):
        return "allocation (malloc, free, new, delete)"
    if "msgpack" in fn: return "msgpack"
    if "libzmq" in obj or "zmq_" in fn or "zmq::" in fn: return "libzmq and cppzmq"
    if "hiredis" in obj or fn.startswith("???:sds"): return "hiredis"
    if any(k in fn for k in ("memmove", "memcpy", "memcmp", "memset", "strlen")): return "libc mem*/str*"
    if any(k in fn for k in ("printf", "libio", "stdio")): return "libc printf family"
    if "ferry::" in fn: return "Ferry's own functions"
    if "pthread" in fn or "nptl" in fn: return "pthread"
    if "std::" in fn: return "libstdc++ (containers, strings, hashing)"
    return "other"
def show(title, per_fn):
    total = sum(per_fn.values())
    if total <= 0:
        print(f"== {title}: nothing counted"); return
    print(f"== {title}: {total / jobs:,.0f} instructions per job")
    groups = {}
    for fn, ir in per_fn.items(): groups[group(fn)] = groups.get(group(fn), 0) + ir
    print("  by kind:")
    for g, ir in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"{ir / jobs:9,.0f}  {100 * ir / total:5.1f}%  {g}")
    print(f"  top {top} functions (exclusive):")
    for fn, ir in sorted(per_fn.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{ir / jobs:9,.0f}  {100 * ir / total:5.1f}%  {fn[:150]}")
base, measured = load("base"), load("measured")
show("broker, all threads (measured lifetime minus base lifetime)",
     {fn: measured.get(fn, 0) - base.get(fn, 0) for fn in set(base) | set(measured)})
show("producer SDK, inside Client::Run (caller's thread)", load("sdk"))
EOF
echo "(callgrind files in $OUT)"
