#!/usr/bin/env bash
# make-keys.sh: makes the fleet's CURVE key pairs with `ferry keygen` and a random Redis password
# per role, and stores them as Secrets (docs/security.md), each holding only what its pods need:
#   ferry-broker-keys      broker.key_secret, redis.password   the broker (Redis user ferry-broker)
#   ferry-allow-producers  producer.key (+ --producer NAMEs)   public keys, --allow-producers
#   ferry-allow-workers    worker.key                          public keys, --allow-workers
#   ferry-worker-keys      worker.key_secret, broker.key,      every worker pod (Redis user
#                          redis.password                      ferry-worker)
#   ferry-producer-keys    producer.key_secret, broker.key,    your producers' pods (Redis user
#                          redis.password                      ferry-producer; mount it, and pass
#                          --curve-server-public/--curve-secret/--redis-password-file or
#                          curve_server_public/curve_secret/redis_password_file)
#   ferry-redis-auth       users.acl, probe.password           the Redis pod: the ACL users
#                          (SHA-256 hashes only, never a password) and its readiness probe's
#                          password (user ferry-probe, which may only PING)
# users.acl is deploy/redis/users.acl with the hashes filled in: each role's rules as there.
# Every producer Secret has a password of its own, each a hash on the one user ferry-producer.
#
#   deploy/kubernetes/make-keys.sh [-n NAMESPACE] [--producer NAME]... [--out DIR] [--print]
#                                  [--acl FILE]
#
#   -n NAMESPACE     where the Secrets go (default ferry; created by `kubectl apply -k` too)
#   --producer NAME  one more producer key pair and Redis password: NAME.key in
#                    ferry-allow-producers, the pair and the password in the Secret
#                    ferry-producer-NAME (repeatable)
#   --out DIR        keep the key and password files in DIR (default: a temp dir, removed at the
#                    end)
#   --print          print the Secrets as YAML (for `kubectl apply -f -` or GitOps) instead of
#                    applying them; nothing is sent to a cluster
#   --acl FILE       the ACL to fill in (default: deploy/redis/users.acl; e.g. a copy for
#                    another --redis-prefix), with #BROKER_PASSWORD_SHA256,
#                    #WORKER_PASSWORD_SHA256 and #PRODUCER_PASSWORD_SHA256 where the hashes go
#
# Running it again makes new keys and passwords and replaces the Secrets: a rotation. Redis reads
# its ACL file and every Ferry process its files at start only, so restart Redis first, then the
# fleet, then the producers (Ferry cannot reach Redis in between; AOF keeps the results, the
# broker's journal the accepted jobs):
#   kubectl -n ferry rollout restart statefulset/redis
#   kubectl -n ferry rollout status statefulset/redis
#   kubectl -n ferry rollout restart deploy/ferry-broker deploy/ferry-worker
# Adding only a producer: put its public NAME.key into ferry-allow-producers and SIGHUP the
# broker (kubectl -n ferry exec deploy/ferry-broker -- sh -c 'kill -HUP 1'); for Redis, give it
# the redis.password of ferry-producer-keys in its Secret (or add its own hash to the
# ferry-producer line of users.acl in ferry-redis-auth and restart Redis).
# `ferry` comes from $FERRY, else PATH.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }
ns=ferry
out=""
print=0
producers=()
acl_template="$(dirname "$0")/../redis/users.acl"
while [ $# -gt 0 ]; do
  case "$1" in
    -n|--namespace) ns="$2"; shift 2 ;;
    --producer) producers+=("$2"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --print) print=1; shift ;;
    --acl) acl_template="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "make-keys: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done
ferry="${FERRY:-ferry}"
command -v "$ferry" > /dev/null || { echo "make-keys: no ferry binary (set FERRY)" >&2; exit 2; }
command -v kubectl > /dev/null || { echo "make-keys: kubectl not found" >&2; exit 2; }
for p in "${producers[@]}"; do
  case "$p" in
    broker|worker|producer) echo "make-keys: producer name '$p' is taken" >&2; exit 2 ;;
  esac
  [[ "$p" =~ ^[A-Za-z0-9._-]{1,64}$ ]] || { echo "make-keys: bad producer name '$p'" >&2; exit 2; }
done
[ -r "$acl_template" ] || { echo "make-keys: cannot read the ACL $acl_template" >&2; exit 2; }
for role in BROKER WORKER PRODUCER; do
  grep -q "#${role}_PASSWORD_SHA256" "$acl_template" ||
    { echo "make-keys: $acl_template has no #${role}_PASSWORD_SHA256" >&2; exit 2; }
done
if command -v sha256sum > /dev/null; then
  sha256() { sha256sum | cut -d' ' -f1; }
elif command -v shasum > /dev/null; then
  sha256() { shasum -a 256 | cut -d' ' -f1; }
else
  echo "make-keys: no sha256sum or shasum" >&2; exit 2
fi

if ! grep -qx 'user default off' "$acl_template"; then
  echo "make-keys: $acl_template must say 'user default off' (else anyone connects)" >&2; exit 2
fi
if grep -q '^user ferry-probe ' "$acl_template"; then
  echo "make-keys: $acl_template defines ferry-probe, which make-keys.sh adds itself" >&2; exit 2
fi

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

# Redis passwords: 32 random bytes as 64 hex digits, one line without a newline, mode 0600. They
# go from /dev/urandom into files and from there into the Secrets, never through a command line.
password() {  # FILE: a new password in FILE; prints its SHA-256 (hex), what users.acl holds
  head -c 32 /dev/urandom | od -An -v -tx1 | tr -d ' \n' > "$1"
  sha256 < "$1"
}
broker_hash="$(password "$out/redis-broker.password")"
worker_hash="$(password "$out/redis-worker.password")"
producer_hashes="#$(password "$out/redis-producer.password")"
for p in "${producers[@]}"; do
  producer_hashes+=" #$(password "$out/redis-producer-$p.password")"
done
probe_hash="$(password "$out/redis-probe.password")"
{
  sed -e "s/#BROKER_PASSWORD_SHA256/#$broker_hash/" -e "s/#WORKER_PASSWORD_SHA256/#$worker_hash/" \
    -e "s/#PRODUCER_PASSWORD_SHA256/$producer_hashes/" "$acl_template" | awk 1
  echo "user ferry-probe on #$probe_hash resetchannels -@all +ping"
} > "$out/users.acl"
if grep -q '_PASSWORD_SHA256' "$out/users.acl"; then
  echo "make-keys: $acl_template has a hash placeholder left over" >&2; exit 2
fi

secret() {  # NAME KEY FILE [KEY FILE]... : one Secret as YAML, FILE stored under KEY
  local name="$1"; shift
  local args=()
  while [ $# -gt 0 ]; do args+=("--from-file=$1=$2"); shift 2; done
  kubectl create secret generic "$name" --namespace "$ns" "${args[@]}" \
    --dry-run=client -o yaml | sed '/creationTimestamp: null/d'
  echo "---"
}
allow_producers=(producer.key "$out/producer.key")
for p in "${producers[@]}"; do allow_producers+=("$p.key" "$out/$p.key"); done
{
  secret ferry-broker-keys broker.key_secret "$out/broker.key_secret" \
    redis.password "$out/redis-broker.password"
  secret ferry-allow-producers "${allow_producers[@]}"
  secret ferry-allow-workers worker.key "$out/worker.key"
  secret ferry-worker-keys worker.key_secret "$out/worker.key_secret" \
    broker.key "$out/broker.key" redis.password "$out/redis-worker.password"
  secret ferry-producer-keys producer.key_secret "$out/producer.key_secret" \
    broker.key "$out/broker.key" redis.password "$out/redis-producer.password"
  for p in "${producers[@]}"; do
    secret "ferry-producer-$p" "$p.key_secret" "$out/$p.key_secret" \
      broker.key "$out/broker.key" redis.password "$out/redis-producer-$p.password"
  done
  secret ferry-redis-auth users.acl "$out/users.acl" probe.password "$out/redis-probe.password"
} > "$out/secrets.yaml"
if [ "$print" -eq 1 ]; then
  cat "$out/secrets.yaml"
else
  kubectl apply -f "$out/secrets.yaml"
fi
