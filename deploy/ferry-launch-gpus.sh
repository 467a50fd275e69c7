#!/usr/bin/env bash
# ferry-launch-gpus.sh: starts one ferry-worker per visible GPU (or MIG slice), in parallel, each
# its own process that sees exactly one device (CUDA_VISIBLE_DEVICES=<that device>, --device
# cuda:0), so no two model loads share CUDA state. Without a GPU it starts --cpu-workers N CPU
# workers. Every other argument goes to each ferry-worker unchanged (but --name NAME becomes
# NAME-gpuK and --metrics-port P becomes P+K for the K-th worker; 0, metrics off, stays 0).
# SIGINT/SIGTERM are forwarded to every worker (which drain: finish and report held jobs, then
# leave), and the launcher waits for all of them; it exits non-zero when any worker did. A
# worker that ends on its own (a crash) stops the others too, and the launcher exits 1, for its
# supervisor to restart it.
#
#   deploy/ferry-launch-gpus.sh [launcher options] [--] ferry-worker arguments...
#
# Launcher options:
#   --worker-bin PATH   the ferry-worker binary (default: $FERRY_WORKER, then ferry-worker on
#                       PATH, then build/gpu-worker/ferry-worker next to this script)
#   --cpu-workers N     workers to start when no GPU is visible (default 1)
#   --gpus LIST         comma-separated devices to use instead of discovering them (indices,
#                       GPU-... or MIG-... UUIDs)
#   --dry-run           print the commands instead of running them
#   -h, --help          this text
#
# Devices: CUDA_VISIBLE_DEVICES when set (its entries, in order, up to a negative one);
# otherwise `nvidia-smi -L`, where a GPU split into MIG slices contributes its MIG UUIDs instead
# of itself. CPU threads: unless --threads is given, each worker gets
# max(1, cores / (workers x instances)) intra-op threads so the workers together do not
# oversubscribe the host.
set -uo pipefail
if [ "${BASH_VERSINFO[0]}" -lt 5 ] || { [ "${BASH_VERSINFO[0]}" -eq 5 ] && [ "${BASH_VERSINFO[1]}" -lt 1 ]; }; then
  echo "ferry-launch-gpus: needs bash >= 5.1 (wait -n -p), this is $BASH_VERSION" >&2
  exit 2
fi

usage() { sed -n '2,/^set -uo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

worker_bin="${FERRY_WORKER:-}"
cpu_workers=1
gpus=""
dry_run=0
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --worker-bin) worker_bin="$2"; shift 2 ;;
    --worker-bin=*) worker_bin="${1#*=}"; shift ;;
    --cpu-workers) cpu_workers="$2"; shift 2 ;;
    --cpu-workers=*) cpu_workers="${1#*=}"; shift ;;
    --gpus) gpus="$2"; shift 2 ;;
    --gpus=*) gpus="${1#*=}"; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; args+=("$@"); break ;;
    *) args+=("$1"); shift ;;
  esac
done
if ! [[ "$cpu_workers" =~ ^[1-9][0-9]*$ ]]; then
  echo "ferry-launch-gpus: --cpu-workers wants a positive number, got '$cpu_workers'" >&2
  exit 2
fi
if [ -z "$worker_bin" ]; then
  if command -v ferry-worker > /dev/null 2>&1; then
    worker_bin="$(command -v ferry-worker)"
  else
    worker_bin="$(cd "$(dirname "$0")/.." && pwd)/build/gpu-worker/ferry-worker"
  fi
fi
if [ "$dry_run" -eq 0 ] && [ ! -x "$worker_bin" ]; then
  echo "ferry-launch-gpus: no ferry-worker at '$worker_bin' (use --worker-bin)" >&2
  exit 2
fi

# The visible devices, one per line.
discover() {
  if [ -n "$gpus" ]; then
    tr ',' '\n' <<< "$gpus" | sed -e 's/^ *//' -e 's/ *$//' -e '/^$/d'
  elif [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    # Set (even to "" or -1, which hide every GPU): its entries are the devices, up to the first
    # negative one, which hides itself and every entry after it (as CUDA reads it).
    tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | sed -e 's/^ *//' -e 's/ *$//' -e '/^$/d' -e '/^-/,$d'
  elif command -v nvidia-smi > /dev/null 2>&1; then
    # "GPU 0: NVIDIA H100 (UUID: GPU-...)" then, for a MIG-enabled GPU,
    # "  MIG 1g.10gb     Device  0: (UUID: MIG-...)": a GPU with slices yields its slices.
    nvidia-smi -L 2>/dev/null | awk '
      /^GPU [0-9]+:/ { if (gpu != "" && !mig) print gpu; gpu = $2; sub(":", "", gpu); mig = 0; next }
      /MIG/ && /UUID: MIG-/ { u = $0; sub(/.*UUID: /, "", u); sub(/\).*/, "", u); print u; mig = 1 }
      END { if (gpu != "" && !mig) print gpu }'
  fi
}
mapfile -t devices < <(discover)

# Forwarded flags the launcher must adjust: --device (always cuda:0 for a GPU worker), --name
# (made unique per worker), --metrics-port (one port per worker), --instances and --threads
# (for the CPU thread rule).
fwd=()
name=""
metrics_port=""
instances=1
threads=""
i=0
while [ $i -lt ${#args[@]} ]; do
  a="${args[$i]}"
  case "$a" in
    --device) i=$((i + 2)); continue ;;
    --device=*) i=$((i + 1)); continue ;;
    --name) name="${args[$((i + 1))]:-}"; i=$((i + 2)); continue ;;
    --name=*) name="${a#*=}"; i=$((i + 1)); continue ;;
    --metrics-port) metrics_port="${args[$((i + 1))]:-}"; i=$((i + 2)); continue ;;
    --metrics-port=*) metrics_port="${a#*=}"; i=$((i + 1)); continue ;;
    --instances) instances="${args[$((i + 1))]:-1}" ;;
    --instances=*) instances="${a#*=}" ;;
    --threads) threads="${args[$((i + 1))]:-}" ;;
    --threads=*) threads="${a#*=}" ;;
  esac
  fwd+=("$a")
  i=$((i + 1))
done

if [ -n "$metrics_port" ] && ! [[ "$metrics_port" =~ ^[0-9]+$ ]]; then
  echo "ferry-launch-gpus: --metrics-port wants a number, got '$metrics_port'" >&2
  exit 2
fi

if [ ${#devices[@]} -gt 0 ]; then
  count=${#devices[@]}
else
  count=$cpu_workers
fi
if [ -z "$threads" ]; then
  cores=$(nproc 2>/dev/null || echo 1)
  [[ "$instances" =~ ^[1-9][0-9]*$ ]] || instances=1
  per=$((cores / (count * instances)))
  [ "$per" -lt 1 ] && per=1
  fwd+=(--threads "$per")
fi

pids=()
labels=()
started=0
start_worker() {  # label, CUDA_VISIBLE_DEVICES value ("" for a CPU worker), device
  local label="$1" visible="$2" device="$3"
  local cmd=("$worker_bin" --device "$device" "${fwd[@]}")
  [ -n "$name" ] && cmd+=(--name "$name-$label")
  # P+K for the K-th worker; 0 (no metrics) stays 0.
  if [ -n "$metrics_port" ]; then
    if [ "$metrics_port" -eq 0 ]; then
      cmd+=(--metrics-port 0)
    else
      cmd+=(--metrics-port "$((metrics_port + started))")
    fi
  fi
  started=$((started + 1))
  if [ "$dry_run" -eq 1 ]; then
    if [ -n "$visible" ]; then echo "CUDA_VISIBLE_DEVICES=$visible ${cmd[*]}"; else echo "${cmd[*]}"; fi
    return
  fi
  # setsid: a worker in its own session does not get the terminal's Ctrl-C directly (it would
  # count ours as a second signal and skip the drain); the prefixing sed ignores it, so that
  # the worker's last log lines still have somewhere to go.
  setsid env CUDA_VISIBLE_DEVICES="$visible" "${cmd[@]}" \
    > >(trap '' INT TERM; exec sed -u "s/^/[$label] /") 2>&1 &
  pids+=($!)
  labels+=("$label")
  echo "ferry-launch-gpus: started $label (pid $!${visible:+, CUDA_VISIBLE_DEVICES=$visible})" >&2
}

if [ ${#devices[@]} -gt 0 ]; then
  for k in "${!devices[@]}"; do start_worker "gpu$k" "${devices[$k]}" "cuda:0"; done
else
  echo "ferry-launch-gpus: no GPU visible; starting $cpu_workers CPU worker(s)" >&2
  for ((k = 0; k < cpu_workers; k++)); do start_worker "cpu$k" "" "cpu"; done
fi
[ "$dry_run" -eq 1 ] && exit 0

draining=0
own_drain=0
forward() {  # a signal: pass it to every worker still running (a second one stops them now)
  # A supervisor's SIGTERM while a drain we began runs (a worker crashed) is not passed on: a
  # second TERM would stop the draining workers at once.
  if [ "$draining" -eq 1 ] && [ "$1" = TERM ] && [ "$own_drain" -eq 1 ]; then return; fi
  draining=1
  echo "ferry-launch-gpus: SIG$1: forwarding to ${#running[@]} worker(s)" >&2
  for p in "${running[@]}"; do kill -s "$1" "$p" 2>/dev/null; done
}
trap 'forward TERM' TERM
trap 'forward INT' INT

# Waits for the workers as they end. One that ends on its own (crashed, OOM-killed) while the
# others run stops them all (drained, as on SIGTERM) and the launcher exits 1: its supervisor
# (docker's restart policy, systemd, Kubernetes) then starts it again, and no GPU stays idle
# behind a launcher that is still alive.
declare -A label_of
for k in "${!pids[@]}"; do label_of[${pids[$k]}]=${labels[$k]}; done
running=("${pids[@]}")
status=0
while [ ${#running[@]} -gt 0 ]; do
  gone=""
  wait -n -p gone "${running[@]}"
  rc=$?
  if [ -z "${gone:-}" ]; then
    [ "$rc" -gt 128 ] && continue  # a trapped signal ended the wait, not a worker
    echo "ferry-launch-gpus: wait failed ($rc); stopping" >&2
    forward TERM
    exit 1
  fi
  echo "ferry-launch-gpus: ${label_of[$gone]} (pid $gone) exited with $rc" >&2
  [ "$rc" -ne 0 ] && status=1
  left=()
  for p in "${running[@]}"; do [ "$p" != "$gone" ] && left+=("$p"); done
  running=("${left[@]}")
  if [ "$draining" -eq 0 ] && [ ${#running[@]} -gt 0 ]; then
    echo "ferry-launch-gpus: ${label_of[$gone]} stopped on its own; stopping the others so" \
      "that the launcher exits and is restarted" >&2
    status=1
    forward TERM
    own_drain=1
  fi
done
exit $status
