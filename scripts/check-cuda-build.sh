#!/usr/bin/env bash
# Compiles and links the worker's CUDA path -- src/cuda_support_cuda.cc, model.cc against CUDA
# libtorch, tests/unit/gpu-worker/gpu_test.cc -- against Debian trixie's CUDA libtorch 2.6, on a
# Debian bookworm host with no GPU, installing nothing:
#
#   1. downloads the .debs with `apt-get download` from a private package list (-o Dir::...; the
#      system's apt configuration is never read for sources nor written) into a cache dir;
#   2. unpacks them with `dpkg -x` into a prefix (never `dpkg -i`);
#   3. configures BUILD_DIR against that libtorch and the CUDA toolkit in CUDA_HOME and builds
#      ferry-worker and ferry_worker_gpu_tests (-DFERRY_GPU_TESTS=ON);
#   4. also compiles cuda_support_cuda.cc (syntax only) against the system's libtorch 1.13
#      c10/cuda headers when they are installed, so the file keeps building with both;
#   5. unless --no-run: unpacks the runtime libraries libtorch 2.6 needs (trixie's glibc and
#      libstdc++ among them) into PREFIX-runtime and runs ferry-worker --help, the GPU tests (they
#      skip without a device) and a worker asked for cuda:0 under trixie's dynamic loader.
#
# Idempotent: what is downloaded or unpacked already is kept. Every step runs again otherwise.
# Why the link needs -Wl,--allow-shlib-undefined: trixie's libtorch needs glibc 2.38 and
# libstdc++ 13 symbols that bookworm's do not have; the worker's own references are still all
# resolved (they must be, for the link to succeed). This is a build check, not a deployment.
#
# Usage: scripts/check-cuda-build.sh [--no-run] [-j N]
# Environment (defaults in brackets):
#   FERRY_APT_DIR [/tmp/trixie]       sources.list + lists/ (created with apt-get update if missing)
#   FERRY_DEB_CACHE [/tmp/ferry-cuda-debs]
#   FERRY_TORCH_CUDA_PREFIX [/opt/torch-cuda]   (runtime libraries go to PREFIX-runtime)
#   CUDA_HOME [/usr/local/cuda]       nvcc and CUDA headers (any 12.x/13.x toolkit)
#   BUILD_DIR [<repo>/build-cuda]
set -euo pipefail

RUN=1
JOBS=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --no-run) RUN=0 ;;
    -j) JOBS=$2; shift ;;
    -j*) JOBS=${1#-j} ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-cuda-build: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

REPO=$(cd "$(dirname "$0")/.." && pwd)
APT_DIR=${FERRY_APT_DIR:-/tmp/trixie}
CACHE=${FERRY_DEB_CACHE:-/tmp/ferry-cuda-debs}
PREFIX=${FERRY_TORCH_CUDA_PREFIX:-/opt/torch-cuda}
RT_PREFIX=$PREFIX-runtime
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
BUILD_DIR=${BUILD_DIR:-$REPO/build-cuda}
LIB=$PREFIX/usr/lib/x86_64-linux-gnu
START=$(date +%s)

say() { echo "check-cuda-build: [+$(( $(date +%s) - START ))s] $*"; }
fail() { echo "check-cuda-build: FAILED: $*" >&2; exit 1; }

[ -x "$CUDA_HOME/bin/nvcc" ] || fail "no nvcc in CUDA_HOME=$CUDA_HOME"
[ "$(realpath -m "$BUILD_DIR")" != "$(realpath -m "$REPO/build")" ] ||
  fail "BUILD_DIR must not be the normal build dir"

# Packages. The build needs libtorch's headers, CMake files and shared libraries, plus the CUDA
# 12 runtime pieces its CMake files link (cudart, nvrtc, nvToolsExt: CUDA 13 no longer ships
# libnvToolsExt). Headers and nvcc come from CUDA_HOME.
BUILD_PKGS=(libtorch-cuda-dev libtorch-cuda-2.6 libcudart12 libnvrtc12 libnvtoolsext1)
# The run check: every DT_NEEDED of libtorch*.so not on a bookworm system (found by resolving
# with trixie's ld.so --list until nothing was missing). cuDNN 9 comes from CUDA_HOME.
RUNTIME_PKGS=(libc6 libstdc++6 libgcc-s1 libgomp1 libfmt10 libcpp-httplib0.18 libprotobuf32t64
  libblas3 liblapack3 libxnnpack0.20241108 libvulkan1 libtensorpipe-cuda-0 libgloo-cuda-0
  libonnx1t64 libdnnl3.6 libsleef3 libz3-4 libzstd1 zlib1g libpthreadpool0 libcpuinfo0
  libcusparse12 libcufft11 libnccl2 libcurand10 libcublas12 libcublaslt12 libnvjitlink12
  libuv1t64 libnuma1 libhiredis1.1.0 libopenmpi40 libevent-core-2.1-7t64
  libevent-pthreads-2.1-7t64 libfabric1 libgfortran5 libhwloc15 libnl-3-200 libpmix2t64
  libpsm2-2 libucx0 ibverbs-providers libibverbs1 librdmacm1t64 libmunge2)

# A private apt: its own sources, lists, caches and archives; trixie preferred over sid.
mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/archives/partial" "$APT_DIR/cache" "$CACHE"
if [ ! -f "$APT_DIR/sources.list" ]; then
  echo "deb http://deb.debian.org/debian trixie main contrib non-free" >"$APT_DIR/sources.list"
fi
APT_OPTS=(-o "Dir::Etc::SourceList=$APT_DIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
  -o "Dir::Cache::Archives=$APT_DIR/archives" -o APT::Default-Release=trixie
  -o APT::Sandbox::User=root)
if ! ls "$APT_DIR"/lists/*_Packages* >/dev/null 2>&1; then
  say "no package lists in $APT_DIR/lists: apt-get update (private lists only)"
  apt-get "${APT_OPTS[@]}" update -qq
fi

# Prints the .deb path of each package's candidate version, downloading the missing ones.
fetch() {
  local -A cand=()
  local want=() p ver file
  while read -r p ver; do cand[$p]=$ver; done < <(apt-cache "${APT_OPTS[@]}" policy "$@" |
    awk '/^[^ ].*:$/ {p = substr($0, 1, length($0) - 1)} /Candidate:/ {print p, $2}')
  for p in "$@"; do
    ver=${cand[$p]:-}
    [ -n "$ver" ] && [ "$ver" != "(none)" ] || fail "package $p not in $APT_DIR/lists"
    compgen -G "$CACHE/${p}_${ver//:/%3a}_*.deb" >/dev/null || want+=("$p=$ver")
  done
  if [ ${#want[@]} -gt 0 ]; then
    (cd "$CACHE" && apt-get "${APT_OPTS[@]}" download -q "${want[@]}" >&2)
  fi
  for p in "$@"; do
    ver=${cand[$p]}
    compgen -G "$CACHE/${p}_${ver//:/%3a}_*.deb" | head -1
  done
}

# dpkg -x each .deb into $1 once (a stamp per .deb).
unpack() {
  local dest=$1 deb; shift
  mkdir -p "$dest/.ferry-unpacked"
  for deb in "$@"; do
    [ -e "$dest/.ferry-unpacked/$(basename "$deb")" ] && continue
    dpkg -x "$deb" "$dest"
    touch "$dest/.ferry-unpacked/$(basename "$deb")"
  done
}

debsize() { du -cb "$@" | tail -1 | awk '{printf "%.0f MB", $1 / 1e6}'; }

mapfile -t BUILD_DEBS < <(fetch "${BUILD_PKGS[@]}")
[ ${#BUILD_DEBS[@]} -eq ${#BUILD_PKGS[@]} ] || fail "download of ${BUILD_PKGS[*]}"
say "build packages ($(debsize "${BUILD_DEBS[@]}")):"
for d in "${BUILD_DEBS[@]}"; do echo "  $(basename "$d")"; done
unpack "$PREFIX" "${BUILD_DEBS[@]}"
TORCH_VERSION=$(dpkg-deb -f "$(printf '%s\n' "${BUILD_DEBS[@]}" | grep /libtorch-cuda-dev_)" Version)

# Configure. Torch's CMake (Caffe2/public/cuda.cmake) runs FindCUDA + enable_language(CUDA) +
# FindCUDAToolkit against CUDA_HOME; the CUDA_*_LIBRARY cache entries point the libraries it
# links at Debian's CUDA 12.4 runtime that libtorch was built with, and nvToolsExt's header at
# CUDA_HOME's header-only NVTX 3. The GPU tests are discovered when ctest runs (PRE_TEST): this
# host cannot run them at build time.
CMAKE_FLAGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_GPU_TESTS=ON
  -DTorch_DIR="$LIB/cmake/Torch" -DCMAKE_PREFIX_PATH="$PREFIX/usr"
  -DCUDA_TOOLKIT_ROOT_DIR="$CUDA_HOME" -DCUDAToolkit_ROOT="$CUDA_HOME"
  -DCMAKE_CUDA_COMPILER="$CUDA_HOME/bin/nvcc"
  -DCUDA_cudart_LIBRARY="$LIB/libcudart.so.12" -DCUDA_nvrtc_LIBRARY="$LIB/libnvrtc.so.12"
  -DCUDA_nvToolsExt_LIBRARY="$LIB/libnvToolsExt.so.1"
  -DCUDAToolkit_nvToolsExt_INCLUDE_DIR="$CUDA_HOME/include/nvtx3"
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined
  -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST -Wno-dev)
LOG=$BUILD_DIR/check-cuda-build.log
mkdir -p "$BUILD_DIR"
say "cmake -S $REPO -B $BUILD_DIR ${CMAKE_FLAGS[*]}"
cmake -S "$REPO" -B "$BUILD_DIR" "${CMAKE_FLAGS[@]}" >"$LOG" 2>&1 || { tail -40 "$LOG"; fail "cmake"; }
grep -q "ferry-worker: CUDA support ON" "$LOG" || fail "CUDA support not detected (see $LOG)"
say "configured: ferry-worker: CUDA support ON"

TARGETS=(ferry-worker ferry_worker_gpu_tests)
[ "$RUN" = 1 ] && TARGETS+=(ferry-make-models)
say "building ${TARGETS[*]} (-j$JOBS; log: $LOG)"
if ! cmake --build "$BUILD_DIR" --target "${TARGETS[@]}" -- -j"$JOBS" >>"$LOG" 2>&1; then
  grep -E "error|FAILED" "$LOG" | head -40
  fail "build (see $LOG)"
fi
# Compiler warnings (ld's "needed by ..., not found" lines are the cross-distribution link).
WARNINGS=$(grep -E "warning:" "$LOG" | grep -v "not found (try using -rpath" | sort -u || true)
NWARN=$(printf '%s' "$WARNINGS" | grep -c . || true)
[ -z "$WARNINGS" ] || printf '%s\n' "$WARNINGS"
say "compiled and linked: ${TARGETS[*]} ($NWARN compiler warning(s))"

# The same TU against the system's CPU libtorch 1.13 c10/cuda headers (+ the one generated
# header its CPU package lacks): the APIs it uses exist in both versions.
if [ -f /usr/include/c10/cuda/CUDAStream.h ]; then
  STUB=$(mktemp -d)
  mkdir -p "$STUB/c10/cuda/impl"
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' >"$STUB/c10/cuda/impl/cuda_cmake_macros.h"
  ${CXX:-c++} -std=c++17 -fsyntax-only -Wall -Wextra -Werror -I"$REPO/gpu-worker/src" \
    -I"$REPO/core/include" \
    -isystem "$STUB" -isystem "$CUDA_HOME/include" -isystem /usr/include/torch/csrc/api/include \
    "$REPO/gpu-worker/src/cuda_support_cuda.cc" || { rm -rf "$STUB"; fail "cuda_support_cuda.cc vs libtorch 1.13 headers"; }
  rm -rf "$STUB"
  say "cuda_support_cuda.cc also compiles against libtorch 1.13's c10/cuda headers"
fi

RUN_NOTE="not run (--no-run)"
if [ "$RUN" = 1 ]; then
  mapfile -t RT_DEBS < <(fetch "${RUNTIME_PKGS[@]}")
  [ ${#RT_DEBS[@]} -eq ${#RUNTIME_PKGS[@]} ] || fail "download of the runtime packages"
  say "runtime packages: ${#RT_DEBS[@]} ($(debsize "${RT_DEBS[@]}"))"
  unpack "$RT_PREFIX" "${RT_DEBS[@]}"
  mkdir -p "$RT_PREFIX/cudnn"
  if [ -e "$CUDA_HOME/lib64/libcudnn.so.9" ]; then
    ln -sfn "$CUDA_HOME/lib64/libcudnn.so.9" "$RT_PREFIX/cudnn/libcudnn.so.9"
  fi
  RL=$RT_PREFIX/usr/lib/x86_64-linux-gnu
  LDSO=$RL/ld-linux-x86-64.so.2
  LP=$RL:$RL/blas:$RL/lapack:$RT_PREFIX/usr/lib:$LIB:$RT_PREFIX/cudnn:/usr/lib/x86_64-linux-gnu
  # main() re-execs /proc/self/exe (the loader here) unless OMP_WAIT_POLICY is set.
  run() { OMP_WAIT_POLICY=PASSIVE "$LDSO" --library-path "$LP" "$@"; }
  W=$BUILD_DIR/gpu-worker/ferry-worker
  T=$BUILD_DIR/tests/unit/gpu-worker/ferry_worker_gpu_tests
  for b in "$W" "$T"; do
    if run --list "$b" 2>&1 | grep -E "not found|error while loading"; then
      fail "$(basename "$b"): unresolved libraries under $LDSO"
    fi
  done
  run "$W" --help >/dev/null || fail "ferry-worker --help"
  say "ferry-worker --help runs (under $LDSO)"
  TOUT=$(run "$T" 2>&1) || { echo "$TOUT" | tail -20; fail "ferry_worker_gpu_tests"; }
  NSKIP=$(echo "$TOUT" | grep -cE '^\[  SKIPPED \] GpuTest\.[A-Za-z0-9]+ \(' || true)
  NPASS=$(echo "$TOUT" | grep -cE '^\[       OK \] GpuTest\.' || true)
  say "ferry_worker_gpu_tests: $NPASS passed, $NSKIP skipped ($(echo "$TOUT" | grep -m1 -A1 Skipped | tail -1))"
  MODELS=$(mktemp -d)
  run "$BUILD_DIR/gpu-worker/ferry-make-models" "$MODELS" >/dev/null
  # Without a device the model load fails and the worker exits 1; with one it would run until
  # SIGINT (it drains and exits 0).
  OMP_WAIT_POLICY=PASSIVE "$LDSO" --library-path "$LP" "$W" --device cuda:0 \
    --model "tiny=$MODELS/tiny.pt" --broker tcp://127.0.0.1:9 --redis redis://127.0.0.1:9 \
    >"$MODELS/worker.log" 2>&1 </dev/null &
  pid=$!
  for _ in $(seq 100); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  kill -INT $pid 2>/dev/null || true
  WRC=0
  wait $pid || WRC=$?
  say "ferry-worker --device cuda:0 exited $WRC: $(tail -1 "$MODELS/worker.log" | cut -c1-200)"
  rm -rf "$MODELS"
  RUN_NOTE="ran under trixie's ld.so: --help ok, gpu tests $NPASS passed/$NSKIP skipped, cuda:0 worker exit $WRC"
fi

say "OK in $(( $(date +%s) - START ))s: ferry-worker + ferry_worker_gpu_tests built against CUDA libtorch $TORCH_VERSION (CUDA headers $("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), cudart 12), $NWARN compiler warning(s); $RUN_NOTE"
