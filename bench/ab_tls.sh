#!/usr/bin/env bash
# Paired Redis-over-TLS comparison (docs/security.md, "Redis over TLS").
#
#   bash bench/ab_tls.sh BUILD ROUNDS JOBS CONCURRENCY MODEL SHAPE DTYPE [FERRY_BENCH_FLAGS]
#   e.g. bash bench/ab_tls.sh build 8 20000 16 tiny 8 float32
#        MAXB=8 bash bench/ab_tls.sh build 4 400 32 head 480000 int16 "--loaders 4 --submit-batch 4"
#
# Starts two fleets side by side from BUILD, each redis-server + ferry-broker + one ferry-worker
# serving MODEL (from BUILD's ferry-make-models): "plain" on redis:// without a password, "tls"
# the way docs/security.md deploys it -- a TLS-only redis-server (client certificates required,
# made here with openssl) with the ACL users of deploy/redis/users.acl, every process as its user
# over rediss:// with --redis-password-file and --redis-tls-*. Then alternates ferry-bench runs
# between them (the order within a pair alternates too) and prints each pair -- p50 ms when
# CONCURRENCY is 1, else jobs/s -- the median tls/plain, and the CPU microseconds per job of
# Redis, the broker, the worker (from /proc/PID/task/*/schedstat) and the producer.
# Environment: MAXB, the worker's --max-batch (256); BUILD_PLAIN, another build for the plain
# side; MODE_PLAIN=tls puts that side on TLS too (two builds' TLS paths compared).
set -uo pipefail
[ $# -ge 7 ] || { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$1" && pwd); ROUNDS=$2; JOBS=$3; CONC=$4; MODEL=$5; SHAPE=$6; DTYPE=$7; EXTRA=${8:-}
. "$SRC/bench/lib.sh"  # free_port, cpu_ns, stop_pids_and_remove
WORK=$(mktemp -d /tmp/ferry-abtls-XXXXXX)
PIDS=()
trap 'stop_pids_and_remove "$WORK"' EXIT INT TERM
"$BUILD/gpu-worker/ferry-make-models" "$WORK/models" >/dev/null
C=$WORK/certs; mkdir -p "$C"; cd "$C" || exit 1
ossl() { openssl "$@" >/dev/null 2>&1 || { echo "openssl $1 failed" >&2; exit 1; }; }
ossl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout ca.key -subj /CN=ca -days 2 -out ca.crt
for n in server client; do
  ossl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout $n.key -subj /CN=$n -out $n.csr
  if [ $n = server ]; then echo "subjectAltName=IP:127.0.0.1" >$n.ext; else echo "extendedKeyUsage=clientAuth" >$n.ext; fi
  ossl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile $n.ext -out $n.crt
done
h() { echo -n "$1" | sha256sum | cut -d' ' -f1; }
sed -e "s/BROKER_PASSWORD_SHA256/$(h bpw)/" -e "s/WORKER_PASSWORD_SHA256/$(h wpw)/" \
  -e "s/PRODUCER_PASSWORD_SHA256/$(h ppw)/" "$SRC/deploy/redis/users.acl" >users.acl
echo "user admin on >apw ~* &* +@all" >>users.acl
for r in bpw wpw ppw; do echo $r >$r; chmod 600 $r; done
TLSF=(--redis-tls-ca "$C/ca.crt" --redis-tls-cert "$C/client.crt" --redis-tls-key "$C/client.key")
declare -A FRONT URLB URLW URLP RPID BPID WPID
declare -A MODE=([plain]=${MODE_PLAIN:-plain} [tls]=tls) BLD=([plain]=$(cd "${BUILD_PLAIN:-$BUILD}" && pwd) [tls]=$BUILD)
start() {  # NAME
  local name=$1 rport fport bport
  rport=$(free_port); fport=$(free_port); bport=$(free_port)
  mkdir -p "$WORK/$name"
  local bargs=() wargs=()
  if [ "${MODE[$name]}" = tls ]; then
    redis-server --port 0 --tls-port "$rport" --bind 127.0.0.1 --dir "$WORK/$name" --save '' --appendonly no \
      --tls-cert-file "$C/server.crt" --tls-key-file "$C/server.key" --tls-ca-cert-file "$C/ca.crt" \
      --tls-auth-clients yes --aclfile "$C/users.acl" >"$WORK/$name/redis.log" 2>&1 &
    PIDS+=($!); RPID[$name]=$!
    URLB[$name]="rediss://ferry-broker@127.0.0.1:$rport"; URLW[$name]="rediss://ferry-worker@127.0.0.1:$rport"
    URLP[$name]="rediss://ferry-producer@127.0.0.1:$rport"
    bargs=(--redis-password-file "$C/bpw" "${TLSF[@]}"); wargs=(--redis-password-file "$C/wpw" "${TLSF[@]}")
    sleep 1
  else
    redis-server --port "$rport" --bind 127.0.0.1 --dir "$WORK/$name" --save '' --appendonly no \
      >"$WORK/$name/redis.log" 2>&1 &
    PIDS+=($!); RPID[$name]=$!
    URLB[$name]="redis://127.0.0.1:$rport"; URLW[$name]=${URLB[$name]}; URLP[$name]=${URLB[$name]}
    for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
  fi
  "${BLD[$name]}/broker/ferry-broker" --frontend "tcp://127.0.0.1:$fport" --backend "tcp://127.0.0.1:$bport" \
    --redis "${URLB[$name]}" "${bargs[@]}" --log-level warn >"$WORK/$name/broker.log" 2>&1 &
  PIDS+=($!); BPID[$name]=$!
  "${BLD[$name]}/gpu-worker/ferry-worker" --model "$MODEL=$WORK/models/$MODEL.pt" --device cpu --max-batch "${MAXB:-256}" \
    --instances 1 --threads 1 --broker "tcp://127.0.0.1:$bport" --redis "${URLW[$name]}" "${wargs[@]}" \
    --log-level warn >"$WORK/$name/worker.log" 2>&1 &
  PIDS+=($!); WPID[$name]=$!
  FRONT[$name]="tcp://127.0.0.1:$fport"
}
start plain; start tls
sleep 2
measure() {  # NAME
  local name=$1 pargs=()
  [ "${MODE[$name]}" = tls ] && pargs=(--redis-password-file "$C/ppw" "${TLSF[@]}")
  local r0 b0 w0
  r0=$(cpu_ns "${RPID[$name]}"); b0=$(cpu_ns "${BPID[$name]}"); w0=$(cpu_ns "${WPID[$name]}")
  # shellcheck disable=SC2086
  "${BLD[$name]}/bench/ferry-bench" --json "$WORK/$name/run.json" --frontend "${FRONT[$name]}" --redis "${URLP[$name]}" "${pargs[@]}" \
    --wait-workers 1 --model "$MODEL" --shape "$SHAPE" --dtype "$DTYPE" $EXTRA \
    --concurrency "$CONC" --jobs "$JOBS" >"$WORK/$name/bench.out" 2>&1
  python3 - "$WORK/$name/run.json" $(( $(cpu_ns "${RPID[$name]}") - r0 )) $(( $(cpu_ns "${BPID[$name]}") - b0 )) $(( $(cpu_ns "${WPID[$name]}") - w0 )) >>"$WORK/cpu.$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); n = r["jobs"]
print("%.0f %.0f %.0f %.0f" % (int(sys.argv[2]) / 1e3 / n, int(sys.argv[3]) / 1e3 / n, int(sys.argv[4]) / 1e3 / n, r["bench_cpu_s"] / n * 1e6))
PY
  if [ "$CONC" = 1 ]; then sed -n 's/.*latency ms p50 \([0-9.]*\).*/\1/p' "$WORK/$name/bench.out"
  else sed -n 's/.* \([0-9][0-9.]*\) jobs\/s.*/\1/p' "$WORK/$name/bench.out" | head -1; fi
}
if [ "$CONC" = 1 ]; then WHAT=p50_ms; else WHAT=jobs_s; fi
echo "# $MODEL [$SHAPE] $DTYPE, C=$CONC, $JOBS jobs per run $EXTRA; round  plain_$WHAT  tls_$WHAT  tls/plain"
: >"$WORK/pairs"
measure plain >/dev/null; measure tls >/dev/null; rm -f "$WORK/cpu.plain" "$WORK/cpu.tls"  # warm-up pair
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then p=$(measure plain); t=$(measure tls); else t=$(measure tls); p=$(measure plain); fi
  if [ -z "$p" ] || [ -z "$t" ]; then echo "a run failed: $(tail -n 3 "$WORK"/*/bench.out "$WORK"/*/*.log)" >&2; exit 1; fi
  echo "$p $t" >>"$WORK/pairs"
  awk -v r="$r" -v b="$p" -v n="$t" 'BEGIN { printf "%5d  %10.3f  %10.3f  %5.2f\n", r, b, n, n / b }'
done
for n in plain tls; do
  awk -v n=$n '{r+=$1; b+=$2; w+=$3; p+=$4; c++} END {printf "%-5s CPU us/job (mean of runs): redis %.0f  broker %.0f  worker %.0f  bench %.0f\n", n, r/c, b/c, w/c, p/c}' "$WORK/cpu.$n"
done
python3 - "$WORK/pairs" "$WHAT" <<'PY'
import statistics, sys
pairs = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
ratios = [n / b for b, n in pairs]
print("median %s: plain %.3f, tls %.3f; tls/plain per pair: median %.2f (%.2f-%.2f)" % (
    sys.argv[2], statistics.median(b for b, _ in pairs), statistics.median(n for _, n in pairs),
    statistics.median(ratios), min(ratios), max(ratios)))
PY
