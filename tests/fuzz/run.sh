#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz (or the ones named) for SECONDS each, on a copy of its
# committed seed corpus (the repository is never written to): first every corpus input, then new
# inputs until SECONDS have passed. Prints one line per target (runs, runs/s, coverage, new
# inputs, peak RSS). Exit status 1 when any target found something: its input is kept under
# BUILD/fuzz-artifacts/<target>/ and the command that reproduces it is printed.
#   usage: tests/fuzz/run.sh BUILD SECONDS [TARGET...]      (`make fuzz`, `make fuzz-ci`)
# FUZZ_CORPUS_OUT=DIR keeps each target's grown corpus in DIR/<target>/ (to minimize into the
# committed corpus: tests/fuzz/README.md).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: run.sh BUILD SECONDS [TARGET...]}
SECONDS_EACH=${2:?usage: run.sh BUILD SECONDS [TARGET...]}
shift 2
if [ $# -gt 0 ]; then
  TARGETS=("$@")
else
  TARGETS=()
  for dir in tests/fuzz/corpus/*/; do TARGETS+=("$(basename "$dir")"); done
fi

dict_for() {
  case "$1" in
    fuzz_npy) echo tests/fuzz/dict/npy.dict ;;
    fuzz_model_config) echo tests/fuzz/dict/toml.dict ;;
    fuzz_metrics_text) echo tests/fuzz/dict/metrics.dict ;;
    fuzz_stats) echo tests/fuzz/dict/stats.dict ;;
    *) echo tests/fuzz/dict/msgpack.dict ;;
  esac
}

if [ -n "${FUZZ_CORPUS_OUT:-}" ]; then
  WORK=$FUZZ_CORPUS_OUT
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d "${TMPDIR:-/tmp}/ferry-fuzz.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
fi
ARTIFACTS="$BUILD/fuzz-artifacts"
failed=()
run_one() {
  local t=$1 bin="$BUILD/tests/fuzz/$1"
  if [ ! -x "$bin" ]; then
    echo "fuzz: $bin is missing (build it: cmake --build $BUILD --target fuzzers)" >&2
    return 1
  fi
  mkdir -p "$WORK/$t" "$ARTIFACTS/$t"
  cp tests/fuzz/corpus/"$t"/* "$WORK/$t/" 2>/dev/null || true
  # -malloc_limit_mb/-rss_limit_mb: an input of at most 64 KiB must not make a decoder allocate
  # 64 MB at once (the codec's limits: docs/security.md); -timeout: nor spin for seconds. Leaks
  # are reported by ASan at the end of the run and by libFuzzer on each new input.
  "$bin" "$WORK/$t" -dict="$(dict_for "$t")" -max_total_time="$SECONDS_EACH" -timeout=10 \
    -rss_limit_mb=2048 -malloc_limit_mb=64 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$ARTIFACTS/$t/" >"$WORK/$t.log" 2>&1
  local rc=$?
  local runs rate added rss cov
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$WORK/$t.log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$WORK/$t.log")
  added=$(sed -n 's/^stat::new_units_added: *//p' "$WORK/$t.log")
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$WORK/$t.log")
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$WORK/$t.log" | tail -1)
  local stats="runs ${runs:-?} (${rate:-?}/s), ${cov:-cov: ?}, new ${added:-?}, rss ${rss:-?} MB"
  if [ $rc -ne 0 ]; then
    echo "fuzz: $t FAILED (exit $rc) $stats"
    grep -E 'ERROR|runtime error|invariant failed|failed:|Test unit written|SUMMARY' "$WORK/$t.log" | head -20
    local unit
    unit=$(grep -oE "Test unit written to [^ ]+" "$WORK/$t.log" | head -1 | sed 's/Test unit written to //')
    [ -n "$unit" ] && echo "  reproduce: $bin $unit"
    return 1
  fi
  echo "fuzz: $t ok (${SECONDS_EACH} s) $stats"
}

for t in "${TARGETS[@]}"; do
  run_one "$t" || failed+=("$t")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) found problems: ${failed[*]} (inputs in $ARTIFACTS)"
  exit 1
fi
echo "fuzz: all ${#TARGETS[@]} targets ok"
