#!/usr/bin/env bash
# What float denormals cost a CPU worker, and what ferry-worker --flush-denormals buys
# (docs/performance.md, "Flushing float denormals").
#
#   bash bench/denormals.sh BUILD [ROUNDS=2] [STEPS=100,1000]
#
# Starts redis-server and ferry-broker on free ports, then per round two ferry-workers in turn
# (1 executor x 2 threads, without and with --flush-denormals) serving underflow.pt: STEPS
# chained tanh(y w) on 256x256 matrices whose values shrink into denormals after ~290 steps
# (ferry-make-models). One job per STEPS value goes through `ferry submit` / `ferry wait`; the
# line printed is the job's compute time from its result's timing.
set -uo pipefail
. "$(dirname "$0")/lib.sh"  # free_port, stop_pids_and_remove
[ $# -ge 1 ] || { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
BUILD=$(cd "$1" && pwd); ROUNDS=${2:-2}; STEPS=${3:-100,1000}
FERRY=$BUILD/producer-sdk/ferry
WORK=$(mktemp -d /tmp/ferry-denormals-XXXXXX)
PIDS=()
trap 'stop_pids_and_remove "$WORK"' EXIT
"$BUILD/gpu-worker/ferry-make-models" "$WORK/models" >/dev/null || exit 1
rport=$(free_port); fport=$(free_port); bport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --dir "$WORK" --save '' --appendonly no \
  >"$WORK/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis-cli -p "$rport" ping >/dev/null 2>&1 || { echo "denormals.sh: redis-server did not start" >&2; exit 1; }
"$BUILD/broker/ferry-broker" --frontend "tcp://127.0.0.1:$fport" --backend "tcp://127.0.0.1:$bport" \
  --redis "redis://127.0.0.1:$rport" --log-level warn >"$WORK/broker.log" 2>&1 &
PIDS+=($!)
CONN=(--frontend "tcp://127.0.0.1:$fport" --redis "redis://127.0.0.1:$rport")
for n in ${STEPS//,/ }; do  # a [1] float32 .npy holding n
  python3 -c '
import struct, sys
header = "{'"'"'descr'"'"': '"'"'<f4'"'"', '"'"'fortran_order'"'"': False, '"'"'shape'"'"': (1,), }"
header += " " * (-(10 + len(header) + 1) % 64) + "\n"  # data 64-byte aligned, as .npy wants
open(sys.argv[2], "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) +
                              header.encode() + struct.pack("<f", float(sys.argv[1])))
' "$n" "$WORK/steps-$n.npy"
done
echo "# underflow.pt through a fleet, 1 executor x 2 threads; compute ms per job"
for round in $(seq "$ROUNDS"); do
  for flag in "" --flush-denormals; do
    "$BUILD/gpu-worker/ferry-worker" --model "underflow=$WORK/models/underflow.pt" --device cpu \
      --instances 1 --threads 2 $flag --broker "tcp://127.0.0.1:$bport" \
      --redis "redis://127.0.0.1:$rport" --log-level warn >"$WORK/worker.log" 2>&1 &
    wp=$!
    PIDS+=("$wp")
    for _ in $(seq 100); do
      "$FERRY" status "${CONN[@]}" 2>/dev/null | grep -q underflow && break
      sleep 0.1
    done
    "$FERRY" status "${CONN[@]}" 2>/dev/null | grep -q underflow ||
      { echo "denormals.sh: no worker registered: $(tail -3 "$WORK/worker.log" "$WORK/broker.log")" >&2; exit 1; }
    for n in ${STEPS//,/ }; do
      id=$("$FERRY" submit "${CONN[@]}" --model underflow --input "$WORK/steps-$n.npy") || exit 1
      line=$("$FERRY" wait "${CONN[@]}" "$id" | grep timing_us)
      python3 - "$round" "${flag:-(none)}" "$n" "$line" <<'PY'
import re, sys
r, flag, n, line = sys.argv[1:]
t = {k: int(v) for k, v in re.findall(r"(\w+)=\+(\d+)", line)}
print("round %s  %-18s %5s steps  compute %9.1f ms" % (
    r, flag, n, (t["compute_end"] - t["compute_start"]) / 1000))
PY
    done
    kill -TERM "$wp"; wait "$wp"
    PIDS=("${PIDS[@]:0:2}")
  done
done
