#!/usr/bin/env bash
# The Python client against the C++ SDK on speech-sized values (docs/python.md, "Performance").
#
#   bash clients/python/bench/big_values.sh BUILD_DIR [ROUNDS=3] [JOBS=1000]
#
# Starts one fleet with `ferry up` (its own redis-server, broker and one CPU worker serving
# `head` and `expand` at --max-batch 8; the producers on Redis's TCP port), then, ROUNDS times,
# runs each load with `python3 -m ferry.bench` (this tree's client) and with the C++
# `ferry-bench`, in turn, with the same flags:
#   inputs   960 KB int16 inputs into head.pt (bench/run.sh's `audio`: stored by claim check)
#   outputs  16-float inputs into expand.pt, 960 KB float32 outputs, read once (`audio_out`)
# and prints each run's jobs/s, MB/s and the producer's CPU µs per job (its `bench_cpu_s`), then
# each round's Python / C++ ratio. BASELINE=DIR (a directory holding another `ferry` package,
# e.g. an older checkout's clients/python) runs that client too, before this tree's. Needs
# /usr/bin/python3 with numpy, msgpack and zmq, and BUILD_DIR with ferry, ferry-bench and
# ferry-make-models. Figures only: not a test.
set -uo pipefail
[ $# -ge 1 ] || { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
B=$(cd "$1" && pwd); ROUNDS=${2:-3}; JOBS=${3:-1000}
HERE=$(cd "$(dirname "$0")" && pwd); CLIENT=$(cd "$HERE/.." && pwd)
. "$HERE/../../../bench/lib.sh"  # stop_pids_and_remove
W=$(mktemp -d /tmp/ferry-big-values-XXXXXX)
PIDS=()
trap 'stop_pids_and_remove "$W"' EXIT
"$B/gpu-worker/ferry-make-models" "$W/models" head expand >/dev/null
"$B/producer-sdk/ferry" up --model "head=$W/models/head.pt" --model "expand=$W/models/expand.pt" \
  --cpu-workers 1 --max-batch 8 --worker-arg=--instances=1 --worker-arg=--threads=1 \
  --frontend-port 0 --backend-port 0 --env-file "$W/fleet.env" >"$W/up.log" 2>&1 & PIDS+=($!)
for _ in $(seq 300); do [ -s "$W/fleet.env" ] && break; sleep 0.1; done
[ -s "$W/fleet.env" ] || { echo "big_values.sh: ferry up did not start:" >&2; cat "$W/up.log" >&2; exit 1; }
set -a; . "$W/fleet.env"; set +a

declare -A FLAGS=(
  [inputs]="--model head --shape 480000 --dtype int16 --concurrency 32 --loaders 4 --submit-batch 4"
  [outputs]="--model expand --shape 16 --concurrency 16 --loaders 2 --consume")
CLIENTS=(); [ -n "${BASELINE:-}" ] && CLIENTS+=("baseline=$(cd "$BASELINE" && pwd)")
CLIENTS+=("python=$CLIENT" "cpp=")
# run NAME LOAD: one run; prints "jobs/s MB/s cpu_us_per_job" (MB/s of the load's big side).
run() {
  local name=${1%%=*} path=${1#*=}
  local json="$W/$name-$2.json"
  # shellcheck disable=SC2086
  if [ "$name" = cpp ]; then
    "$B/bench/ferry-bench" --frontend "$FERRY_FRONTEND" --redis "$FERRY_REDIS" --wait-workers 1 \
      ${FLAGS[$2]} --jobs "$JOBS" --json "$json" >"$W/last.log" 2>&1
  else
    PYTHONPATH="$path" /usr/bin/python3 -m ferry.bench ${FLAGS[$2]} --jobs "$JOBS" --warmup 32 \
      --json "$json" >"$W/last.log" 2>&1
  fi || { echo "big_values.sh: $name $2 failed:" >&2; tail -n 5 "$W/last.log" >&2; return 1; }
  python3 - "$json" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
mbps = d["input_mbps"] if sys.argv[2] == "inputs" else d["output_mbps"]
print("%.0f %.0f %.0f" % (d["throughput"], mbps, 1e6 * d["bench_cpu_s"] / d["jobs"]))
PY
}
printf '%-6s %-8s %-9s %9s %9s %13s\n' round load client 'jobs/s' 'MB/s' 'cpu us/job'
for r in $(seq "$ROUNDS"); do
  for load in inputs outputs; do
    declare -A MB=()
    for c in "${CLIENTS[@]}"; do
      read -r js mb cpu < <(run "$c" "$load") || exit 1
      MB[${c%%=*}]=$mb
      printf '%-6s %-8s %-9s %9s %9s %13s\n' "$r" "$load" "${c%%=*}" "$js" "$mb" "$cpu"
    done
    awk -v r="$r" -v l="$load" -v p="${MB[python]}" -v c="${MB[cpp]}" \
      'BEGIN { printf "%-6s %-8s python / cpp: %.0f %%\n", r, l, 100 * p / c }'
  done
done
