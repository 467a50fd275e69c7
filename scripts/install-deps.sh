#!/usr/bin/env bash
# Installs the Debian packages Ferry builds, tests and demos with (bookworm). Idempotent: does
# nothing when everything is there. Uses sudo when not root.
set -euo pipefail
PKGS=(build-essential cmake ninja-build pkg-config
      libtorch-dev libopenblas0-openmp libtomlplusplus-dev libssl-dev
      cppzmq-dev libzmq3-dev libmsgpack-cxx-dev libhiredis-dev libspdlog-dev libcpp-httplib-dev
      redis-server libgtest-dev libgmock-dev
      python3 python3-zmq python3-msgpack python3-redis python3-numpy python3-yaml
      python3-venv python3-pip python3-setuptools python3-pytest python3-fastapi python3-uvicorn
      python3-httpx python3-multipart python3-celery espeak-ng openssl)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# libtorch calls whatever BLAS the alternatives system points at: make it OpenBLAS (the
# reference BLAS is ~18x slower on a transformer layer).
OPENBLAS=/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3
if [ -e "$OPENBLAS" ]; then
  $SUDO update-alternatives --set libblas.so.3-x86_64-linux-gnu "$OPENBLAS" >/dev/null 2>&1 || true
  $SUDO update-alternatives --set liblapack.so.3-x86_64-linux-gnu \
    /usr/lib/x86_64-linux-gnu/openblas-openmp/liblapack.so.3 >/dev/null 2>&1 || true
fi
echo "install-deps: ok"
