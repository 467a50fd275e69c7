#!/usr/bin/env bash
# The GPU machine's whole check in one device call (docs/gpu.md): builds Ferry against the
# machine's CUDA libtorch, runs the GPU tests, then the benchmark scenarios on the GPU.
#
#   source .deps/device-env.sh; bash scripts/gpu/check.sh [SECONDS]
#
# SECONDS (default 480): the script's own deadline; every stage gets what is left of it (the GPU
# tests at most 240 s), so it ends (and writes its results) before the device call's limit. Exit
# status 1 when a stage failed: the build, the GPU tests (their exit status, a crash at exit
# included) or a benchmark (run.sh fails on a broker or worker that does not exit 0). Writes under $OUT (the device
# tool's folder; ./gpu-out elsewhere): check.log (what ran, how long), build.log (cmake + ninja),
# gpu_tests.txt (gpu_tests_bt.txt: stacks, when they crashed), summary.txt (the benchmark tables),
# threads.txt and bench.tgz (every run's JSON).
# Scenarios, in order of what matters most: whisper (30-s clips; --raw at batch 16..128, then
# fleet vs --raw at the best of them), whisper_half (the same in float16, --raw at batch
# HALF_BATCHES "64 128", HALF_JOBS 3072 clips a run), threads (bench/thread_profile.sh: each
# thread's CPU per 30-s clip -- float32 with one executor and two, float16 with one; THREADS_JOBS
# 1024 clips of THREADS_SHAPE 480000 samples; the first run also samples the executor's stacks
# THREADS_STACKS times with gdb, 6; threads.txt), audio and audio_out (960 KB jobs,
# beside this host's libzmq floor), tiny (Ferry's own overhead with a GPU worker); not in the
# default list: audio_io (audio and audio_out again, Redis with I/O threads: IO_REDIS_FLAGS,
# default "--io-threads 4 --io-threads-do-reads yes").
# Set SCENARIOS to change the list (none: the build and the GPU tests only).
set -uo pipefail
cd "$(dirname "$0")/../.."
LIMIT=${1:-480}
START=$(date +%s)
OUT=${OUT:-$PWD/gpu-out}
FAILURES=0
mkdir -p "$OUT"
B=build-gpu
rm -rf "$B"  # a fresh configure: a cached compiler from an earlier call would stay
RES=/tmp/ferry-gpu-results
rm -rf "$RES"; mkdir -p "$RES"
say() { echo "gpu-check [+$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/check.log"; }
left() { local t=$(( LIMIT - ($(date +%s) - START) )); echo $(( t > 1 ? t : 1 )); }
finish() {
  for d in "$RES"/*/; do
    [ -d "$d" ] || continue
    { echo "== $(basename "$d")"; python3 bench/table.py "$d" 2>&1; echo; } >>"$OUT/summary.txt"
  done
  tar czf "$OUT/bench.tgz" -C "$RES" . 2>/dev/null
  say "done: $FAILURES failure(s)"
  [ "$FAILURES" = 0 ] || exit 1
}
trap finish EXIT

say "$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)"
say "$(nproc) cores; $(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1); $(c++ --version | head -1); $(cmake --version | head -1)"

# ---- build ----------------------------------------------------------------------------------
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
# The system's compiler, whose libstdc++ PyTorch uses: the image's CXX (/opt/gcc) put a second,
# static copy of libstdc++'s locale code into our programs, and the first std::stringstream torch
# freed aborted with "free(): invalid pointer".
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
# --allow-shlib-undefined: libtorch_cuda's own CUDA libraries are found through its RUNPATH when
# the programs run, not by the linker here. -include cstdint (FERRY_GPU_CXXFLAGS overrides): a
# newer libstdc++ there than CI's GCC 12 may no longer pull <cstdint> in through other headers,
# and this build is for measuring, with no time to spare for a rebuild.
if ! cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_GPU_TESTS=ON ${CXX:+-DCMAKE_CXX_COMPILER=$CXX} \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DOPENSSL_ROOT_DIR="${FERRY_DEPS:-/opt/ferry-deps}/usr" \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined -DCMAKE_CXX_FLAGS="${FERRY_GPU_CXXFLAGS--include cstdint}" \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST -Wno-dev >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; FAILURES=1; say "FAILED: cmake (build.log)"; exit 1
fi
grep -E "CUDA support|Caffe2: CUDA|Torch" "$OUT/build.log" | head -5 | while read -r l; do say "cmake: $l"; done
if ! timeout -k 10 "$(left)" cmake --build "$B" --target ferry-broker ferry-worker ferry-bench ferry-floor \
    ferry-make-models ferry_worker_gpu_tests >>"$OUT/build.log" 2>&1; then
  grep -E "error|FAILED" "$OUT/build.log" | head -30; FAILURES=1; say "FAILED: build (build.log)"; exit 1
fi
say "built ($(grep -c 'warning:' "$OUT/build.log") warning lines)"

# ---- GPU tests --------------------------------------------------------------------------------
t=$(left); [ "$t" -lt 240 ] || t=240
timeout -k 10 "$t" "$B/tests/unit/gpu-worker/ferry_worker_gpu_tests" >"$OUT/gpu_tests.txt" 2>&1
rc=$?
[ "$rc" = 0 ] || FAILURES=$((FAILURES + 1))
# Each test's line while it runs ends in "(N ms)"; the summary at the end repeats the names.
count() { grep -cE "^\[ *$1 *\] [A-Za-z0-9_]+\.[A-Za-z0-9_]+ \([0-9]+ ms\)" "$OUT/gpu_tests.txt"; }
say "gpu tests: exit status $rc; $(count OK) passed, $(count SKIPPED) skipped, $(count FAILED) failed"
# Killed by a signal (a crash at exit, say): once more under a debugger, for every thread's
# stack where it stopped (gpu_tests_bt.txt).
GDB=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
if [ "$rc" -gt 128 ] && [ "$rc" != 137 ] && [ -n "$GDB" ]; then
  gt=$(left); [ "$gt" -lt 90 ] || gt=90
  timeout -k 5 "$gt" "$GDB" -q -batch -ex run -ex 'x/6a $sp' -ex "thread apply all bt 20" --args \
    "$B/tests/unit/gpu-worker/ferry_worker_gpu_tests" >"$OUT/gpu_tests_bt.txt" 2>&1
  say "gpu tests under $(basename "$GDB"): $(grep -m1 -E 'received signal|exited' "$OUT/gpu_tests_bt.txt")"
fi

# ---- benchmarks on the GPU --------------------------------------------------------------------
export FERRY_BENCH_DEVICE=cuda:0
for s in ${SCENARIOS:-whisper whisper_half threads audio tiny}; do
  [ "$s" != none ] || continue  # SCENARIOS=none: build and GPU tests only
  t=$(( $(left) - 15 ))
  [ "$t" -gt 30 ] || { say "no time left for $s"; continue; }
  case $s in
    whisper) env ROUNDS=2 WHISPER_SAMPLES=480000 WHISPER_BATCHES="16 32 64 128" WHISPER_BATCH=best \
               WHISPER_JOBS=2048 timeout -k 30 "$t" bash bench/run.sh "$B" --only whisper --out "$RES/whisper" ;;
    tiny) timeout -k 30 "$t" bash bench/run.sh "$B" --only tiny_closed,tiny_light,tiny_light_run --out "$RES/tiny" ;;
    whisper_half) env ROUNDS=2 WHISPER_HALF=1 WHISPER_SAMPLES=480000 WHISPER_BATCHES="${HALF_BATCHES:-64 128}" \
               WHISPER_BATCH=best WHISPER_JOBS=${HALF_JOBS:-3072} timeout -k 30 "$t" bash bench/run.sh "$B" --only whisper \
               --out "$RES/whisper_half" ;;
    audio) env ROUNDS=1 AUDIO_JOBS=2000 timeout -k 30 "$t" bash bench/run.sh "$B" --only audio,audio_out --out "$RES/audio" ;;
    audio_io) env FERRY_REDIS_FLAGS="${IO_REDIS_FLAGS:---io-threads 4 --io-threads-do-reads yes}" ROUNDS=1 \
               AUDIO_JOBS=2000 timeout -k 30 "$t" bash bench/run.sh "$B" --only audio,audio_out --out "$RES/audio_io" ;;
    threads) trc=0
             for v in "1 0" "1 1" "2 0"; do  # executors, half precision
               read -r inst half <<<"$v"
               tt=$(( $(left) - 10 )); [ "$tt" -gt 20 ] || { echo "no time left"; break; }
               echo "== whisper, 30-s clips, C=256, --max-batch 128, $inst executor(s), half=$half"
               # The first also samples the executor's stacks (STACKS): launching or waiting?
               stacks=0; [ "$inst $half" = "1 0" ] && stacks=${THREADS_STACKS:-6}
               env MODEL=whisper SHAPE=${THREADS_SHAPE:-480000} DTYPE=int16 CONCURRENCY=256 \
                 MAX_BATCH=128 INSTANCES=$inst HALF=$half STACKS=$stacks BENCH_FLAGS="--loaders 4" timeout -k 10 "$tt" \
                 bash bench/thread_profile.sh "$B" "${THREADS_JOBS:-1024}" || trc=1
             done
             cp "$RES/threads.log" "$OUT/threads.txt"; [ "$trc" = 0 ] ;;
    *) timeout -k 30 "$t" bash bench/run.sh "$B" --only "$s" --out "$RES/$s" ;;
  esac >"$RES/$s.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || FAILURES=$((FAILURES + 1))
  say "bench $s: rc $rc ($(tail -1 "$RES/$s.log" | cut -c1-120))"
done
