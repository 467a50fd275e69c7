#!/usr/bin/env bash
# Installs what `make fuzz`, `make fuzz-ci` and `make sanitize` need beyond scripts/install-deps.sh:
# Debian's clang and its sanitizer/libFuzzer runtimes (bookworm: clang 14). Idempotent: does
# nothing when they are there. Uses sudo when not root.
set -euo pipefail
PKGS=(clang libclang-rt-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-clang: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
