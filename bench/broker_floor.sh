#!/usr/bin/env bash
# The broker's CPU per 960 KB claim-check job at the `audio` load, beside what a bare libzmq relay
# (ferry-floor's zmq_proxy, no Ferry code) spends per message at the same message rate, in one
# run (docs/performance.md, "What limits what"):
#
#   bash bench/broker_floor.sh BUILD_DIR [JOBS=3000] [ROUNDS=3]
#
# Each round: `thread_profile.sh` with the `audio` shape (durable, claim check, SUBMITs of 4 jobs
# from 4 loaders, C = 32, batches of up to 8) gives the jobs/s, the mean batch and the broker's
# CPU per job (its thread and its libzmq I/O thread, from schedstat). Per job the broker takes a
# SUBMIT and answers it (ACCEPTED) every 4 jobs, and sends a CHUNK and takes its DONE every
# batch: one message in and one out, as a relay forwards one, (1/4 + 1/batch) times a job. Then
# `ferry-floor --rate` paces a bare relay at that many messages a second (512 bytes, about a
# SUBMIT of 4 claim-check jobs) and gives its CPU per message. The relay's CPU per message times
# (1/4 + 1/batch) is what forwarding the broker's messages costs per job with no Ferry code at
# all: the floor under the broker's CPU per job at this load. The last column is the broker
# over that floor. BUILD_DIR needs what thread_profile.sh needs and bench/ferry-floor.
set -uo pipefail
[ $# -ge 1 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
B=$(cd "$1" && pwd); JOBS=${2:-3000}; ROUNDS=${3:-3}
SUBMIT_BATCH=4
here=$(dirname "$0")
printf '%-6s %8s %6s %14s %12s %18s %16s %8s\n' round jobs/s batch broker_us/job msgs/s \
  relay_us/message floor_us/job ratio
for round in $(seq "$ROUNDS"); do
  profile=$(MODEL=head SHAPE=480000 DTYPE=int16 CONCURRENCY=32 MAX_BATCH=8 \
    BENCH_FLAGS="--loaders 4 --submit-batch $SUBMIT_BATCH" bash "$here/thread_profile.sh" "$B" "$JOBS") || {
    echo "broker_floor.sh: thread_profile.sh failed" >&2; exit 1; }
  # "head: 3000 jobs, 0 failed, 2.91 s: 1031 jobs/s; latency ... mean batch 8.0"
  rate=$(sed -n 's/.* \([0-9.]*\) jobs\/s;.*/\1/p' <<<"$profile" | head -1)
  batch=$(sed -n 's/.*mean batch \([0-9.]*\).*/\1/p' <<<"$profile" | head -1)
  # The broker's rows: its process id is the one of the thread named ferry-broker.
  broker=$(awk '$2 == "ferry-broker" { split($1, id, "/"); pid = id[1] }
    { split($1, id, "/"); cpu[id[1]] += $3 }
    END { if (pid != "") printf "%.1f", cpu[pid] }' <<<"$profile")
  if [ -z "$rate" ] || [ -z "$batch" ] || [ -z "$broker" ]; then
    echo "broker_floor.sh: could not read the profile:" >&2; echo "$profile" >&2; exit 1
  fi
  msgs=$(awk -v r="$rate" -v s="$SUBMIT_BATCH" -v b="$batch" 'BEGIN { printf "%d", r * (1 / s + 1 / b) + 0.5 }')
  floor=$("$B/bench/ferry-floor" --bytes 512 --messages 3000 --rate "$msgs") || {
    echo "broker_floor.sh: ferry-floor failed" >&2; exit 1; }
  relay=$(sed -n 's/.*relay \([0-9.]*\),.*/\1/p' <<<"$floor" | head -1)
  awk -v round="$round" -v r="$rate" -v b="$batch" -v cpu="$broker" -v m="$msgs" -v relay="$relay" \
    -v s="$SUBMIT_BATCH" 'BEGIN {
      f = relay * (1 / s + 1 / b)
      printf "%-6s %8.0f %6.1f %14.1f %12d %18.0f %16.1f %8.2f\n", round, r, b, cpu, m, relay, f, cpu / f }'
done
