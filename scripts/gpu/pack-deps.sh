#!/usr/bin/env bash
# Run on a Debian bookworm machine with network, at the project root, before a GPU device call
# (docs/gpu.md). Downloads the Debian packages Ferry builds, tests and benchmarks with into .deps/
# (git-ignored), which `carry: [".deps"]` takes to the GPU machine (it reaches no registry):
#   .deps/debs           always unpacked and put on the library path there;
#   .deps/fallback-debs  common system libraries, used there only where the system lacks them
#                        (an older copy first on LD_LIBRARY_PATH could break the system's tools).
# Then copies scripts/gpu/device-env.sh to .deps/. Extra package names are added to .deps/debs.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .deps/debs .deps/fallback-debs  # one version of each package
mkdir -p .deps/debs .deps/fallback-debs
apt-get update -qq >/dev/null 2>&1 || true
get() {  # get DIR PACKAGE...: fails when a package cannot be downloaded
  local dir=$1; shift
  (cd "$dir" && apt-get download -qq "$@" 2>&1 | { grep -v '^W: Download is performed unsandboxed' || true; })
}
# What CMake finds and links (headers, .pc and CMake files), pkg-config itself, redis, bc.
get .deps/debs \
  libzmq5 libzmq3-dev cppzmq-dev libsodium23 libpgm-5.3-0 libnorm1 \
  libmsgpack-cxx-dev libhiredis0.14 libhiredis-dev \
  libspdlog1.10 libspdlog-dev libfmt9 libfmt-dev \
  libssl-dev libcpp-httplib0.11 libcpp-httplib-dev libbrotli-dev zlib1g-dev \
  libtomlplusplus3 libtomlplusplus-dev \
  libgtest-dev googletest \
  pkgconf pkgconf-bin libpkgconf3 bc \
  redis-server redis-tools liblzf1 libjemalloc2 liblua5.1-0 lua-bitop lua-cjson "$@"
# Libraries most systems have already (a newer version there must win).
get .deps/fallback-debs \
  libbsd0 libmd0 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 \
  libcom-err2 zlib1g libsystemd0 libcap2 libgcrypt20 libgpg-error0 liblzma5 libzstd1 liblz4-1 \
  libatomic1 libreadline8 libtinfo6 libssl3 libbrotli1
cp scripts/gpu/device-env.sh .deps/
echo "debs: $(ls .deps/debs | wc -l) + fallback $(ls .deps/fallback-debs | wc -l), $(du -sh .deps | cut -f1)"
