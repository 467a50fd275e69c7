#!/usr/bin/env bash
# tcp:// vs ipc:// for speech-sized jobs on one host (docs/performance.md, "Big inputs and
# outputs, and speech"), in one run:
#
#   bash bench/ipc_ab.sh BUILD [ROUNDS=3] [JOBS=1000]
#
# Two fleets side by side (each: redis-server, ferry-broker, one ferry-worker serving head.pt),
# one with both broker sockets on tcp://127.0.0.1, one on ipc:// (Unix-domain sockets). Each
# round measures ferry-floor's two-hop libzmq floor over both transports, then ferry-bench's
# 960 KB int16 jobs (run.sh's audio flags: 32 in flight, 4 loaders, SUBMITs of 4) on both
# fleets: through the broker (--stored-input-bytes 0, the broker started with --no-journal) and
# by claim check (the default; the journal on). Orders alternate between rounds.
set -uo pipefail
. "$(dirname "$0")/lib.sh"  # free_port, stop_pids_and_remove
[ $# -ge 1 ] || { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
B=$(cd "$1" && pwd); ROUNDS=${2:-3}; JOBS=${3:-1000}
W=$(mktemp -d /tmp/ferry-ipcab-XXXXXX)
PIDS=()
trap 'stop_pids_and_remove "$W"' EXIT
"$B/gpu-worker/ferry-make-models" "$W/models" head >/dev/null || exit 1
declare -A FRONT REDIS
start() {  # NAME TRANSPORT JOURNAL(on|off)
  local name=$1 rport front back journal=()
  rport=$(free_port)
  if [ "$2" = ipc ]; then
    front="ipc://$W/$name-front.sock"; back="ipc://$W/$name-back.sock"
  else
    front="tcp://127.0.0.1:$(free_port)"; back="tcp://127.0.0.1:$(free_port)"
  fi
  [ "$3" = off ] && journal=(--no-journal)
  mkdir -p "$W/$name"
  redis-server --port "$rport" --bind 127.0.0.1 --dir "$W/$name" --save '' --appendonly no \
    >"$W/$name/redis.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
  "$B/broker/ferry-broker" --frontend "$front" --backend "$back" \
    --redis "redis://127.0.0.1:$rport" --log-level warn "${journal[@]}" >"$W/$name/broker.log" 2>&1 &
  PIDS+=($!)
  "$B/gpu-worker/ferry-worker" --model "head=$W/models/head.pt" --device cpu --max-batch 8 \
    --instances 1 --threads 1 --broker "$back" --redis "redis://127.0.0.1:$rport" \
    --log-level warn >"$W/$name/worker.log" 2>&1 &
  PIDS+=($!)
  FRONT[$name]=$front; REDIS[$name]="redis://127.0.0.1:$rport"
}
bench() {  # NAME EXTRA...: MB/s of input
  local name=$1; shift
  "$B/bench/ferry-bench" --frontend "${FRONT[$name]}" --redis "${REDIS[$name]}" --wait-workers 1 \
    --model head --shape 480000 --dtype int16 --concurrency 32 --loaders 4 --submit-batch 4 \
    --jobs "$JOBS" --json "$W/$name/run.json" "$@" >"$W/$name/bench.log" 2>&1 ||
    { echo "?"; return; }
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('%.0f' % (r['throughput']*0.96))" \
    "$W/$name/run.json"
}
floor() {  # TRANSPORT: two-hop MB/s
  "$B/bench/ferry-floor" --messages "$JOBS" --transport "$1" --json "$W/floor.json" >/dev/null 2>&1 ||
    { echo "?"; return; }
  python3 -c "import json; print('%.0f' % json.load(open('$W/floor.json'))['zmq_two_hops_mbps'])"
}
start tcp_nj tcp off; start ipc_nj ipc off; start tcp_cc tcp on; start ipc_cc ipc on
sleep 3
for f in tcp_nj ipc_nj; do bench $f --stored-input-bytes 0 >/dev/null; done  # warm-up
for f in tcp_cc ipc_cc; do bench $f >/dev/null; done
echo "# MB/s of 960 KB inputs; floor = bare libzmq producer -> relay -> consumer"
echo "# round  floor_tcp floor_ipc  through_broker_tcp through_broker_ipc  claim_check_tcp claim_check_ipc"
for i in $(seq "$ROUNDS"); do
  if [ $((i % 2)) = 1 ]; then
    ft=$(floor tcp); fi_=$(floor ipc)
    bt=$(bench tcp_nj --stored-input-bytes 0); bi=$(bench ipc_nj --stored-input-bytes 0)
    ct=$(bench tcp_cc); ci=$(bench ipc_cc)
  else
    fi_=$(floor ipc); ft=$(floor tcp)
    bi=$(bench ipc_nj --stored-input-bytes 0); bt=$(bench tcp_nj --stored-input-bytes 0)
    ci=$(bench ipc_cc); ct=$(bench tcp_cc)
  fi
  printf '%-7s %9s %9s  %18s %18s  %15s %15s\n' "$i" "$ft" "$fi_" "$bt" "$bi" "$ct" "$ci"
done
