#!/usr/bin/env bash
# make-keys.sh: makes the fleet's CURVE key pairs with `ferry keygen` and stores them as
# Secrets (docs/security.md), each holding only what its pods need:
#   ferry-broker-keys      broker.key_secret                 the broker's own secret
#   ferry-allow-producers  producer.key (+ --producer NAMEs)  public keys, --allow-producers
#   ferry-allow-workers    worker.key                        public keys, --allow-workers
#   ferry-worker-keys      worker.key_secret, broker.key     every worker pod
#   ferry-producer-keys    producer.key_secret, broker.key   your producers' pods (mount it, and
#                          pass --curve-server-public/--curve-secret or curve_server_public/...)
#
#   deploy/kubernetes/make-keys.sh [-n NAMESPACE] [--producer NAME]... [--out DIR] [--print]
#
#   -n NAMESPACE     where the Secrets go (default ferry; created by `kubectl apply -k` too)
#   --producer NAME  one more producer key pair, NAME.key in ferry-allow-producers and the pair
#                    in the Secret ferry-producer-NAME (repeatable)
#   --out DIR        keep the key files in DIR (default: a temp dir, removed at the end)
#   --print          print the Secrets as YAML (for `kubectl apply -f -` or GitOps) instead of
#                    applying them; nothing is sent to a cluster
#
# Running it again makes new keys and replaces the Secrets: a rotation. Then restart the fleet
# (kubectl -n ferry rollout restart deploy/ferry-broker deploy/ferry-worker) and the producers.
# Adding only a producer: put its public NAME.key into ferry-allow-producers and SIGHUP the
# broker (kubectl -n ferry exec deploy/ferry-broker -- sh -c 'kill -HUP 1').
# `ferry` comes from $FERRY, else PATH.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
ns=ferry
out=""
print=0
producers=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--namespace) ns="$2"; shift 2 ;;
    --producer) producers+=("$2"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --print) print=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "make-keys: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
ferry="${FERRY:-ferry}"
command -v "$ferry" > /dev/null || { echo "make-keys: no ferry binary (set FERRY)" >&2; exit 2; }
command -v kubectl > /dev/null || { echo "make-keys: kubectl not found" >&2; exit 2; }
for p in "${producers[@]}"; do
  [[ "$p" =~ ^[A-Za-z0-9._-]{1,64}$ ]] && [ "$p" != producer ] ||
    { echo "make-keys: bad producer name '$p'" >&2; exit 2; }
done

if [ -z "$out" ]; then
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
fi
umask 077
mkdir -p "$out"
[ -z "$(ls -A "$out")" ] || { echo "make-keys: $out is not empty" >&2; exit 2; }
for name in broker worker producer "${producers[@]}"; do
  "$ferry" keygen "$out" "$name" > /dev/null
done

secret() {  # NAME FILE... : one Secret as YAML
  local name="$1"; shift
  local args=()
  for f in "$@"; do args+=("--from-file=$(basename "$f")=$f"); done
  kubectl create secret generic "$name" --namespace "$ns" "${args[@]}" \
    --dry-run=client -o yaml | sed '/creationTimestamp: null/d'
  echo "---"
}
allow_producers=("$out/producer.key")
for p in "${producers[@]}"; do allow_producers+=("$out/$p.key"); done
{
  secret ferry-broker-keys "$out/broker.key_secret"
  secret ferry-allow-producers "${allow_producers[@]}"
  secret ferry-allow-workers "$out/worker.key"
  secret ferry-worker-keys "$out/worker.key_secret" "$out/broker.key"
  secret ferry-producer-keys "$out/producer.key_secret" "$out/broker.key"
  for p in "${producers[@]}"; do
    secret "ferry-producer-$p" "$out/$p.key_secret" "$out/broker.key"
  done
} > "$out/secrets.yaml"
if [ "$print" -eq 1 ]; then
  cat "$out/secrets.yaml"
else
  kubectl apply -f "$out/secrets.yaml"
fi
