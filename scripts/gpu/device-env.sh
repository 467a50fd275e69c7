# Source on the GPU machine, at the project root, after carrying .deps (docs/gpu.md):
#   source .deps/device-env.sh
# (scripts/gpu/pack-deps.sh copies this file to .deps/.) Unpacks the carried Debian packages into
# /opt/ferry-deps -- the fallback ones only where the system lacks that library -- and points
# CMake, pkg-config, the compiler and the loader at them and at the libtorch inside the machine's
# PyTorch. Changed from the recipe the team started from (docs/gpu.md): pkg-config sees only the carried .pc files
# (PKG_CONFIG_LIBDIR), with empty stand-ins for the -dev packages that libzmq's and cpp-httplib's
# Requires.private name but nothing here needs (their libraries come with the runtime packages);
# pkgconf, bc and OpenSSL's headers travel too; TORCH_CUDA_ARCH_LIST defaults to 9.0 (Hopper).
FERRY_DEPS=/opt/ferry-deps
FERRY_LIB=$FERRY_DEPS/usr/lib/x86_64-linux-gnu
ferry_deb_x() {  # ferry_deb_x DEB DEST: dpkg -x, or ar + tar where there is no dpkg
  if command -v dpkg >/dev/null; then dpkg -x "$1" "$2"; return; fi
  local m; m=$(ar t "$1" | grep '^data.tar')
  case "$m" in
    *.xz) ar p "$1" "$m" | tar -xJ -C "$2" ;;
    *.zst) ar p "$1" "$m" | zstd -dc | tar -x -C "$2" ;;
    *) ar p "$1" "$m" | tar -xz -C "$2" ;;
  esac
}
FERRY_STAMP="$FERRY_DEPS/.stamp-$(ls .deps/debs .deps/fallback-debs | md5sum | cut -c1-8)"
if [ ! -f "$FERRY_STAMP" ]; then
  rm -rf "$FERRY_DEPS" /opt/ferry-deps-fallback
  mkdir -p "$FERRY_DEPS" /opt/ferry-deps-fallback "$FERRY_DEPS/stub-pc"
  for f in .deps/debs/*.deb; do ferry_deb_x "$f" "$FERRY_DEPS"; done
  for f in .deps/fallback-debs/*.deb; do ferry_deb_x "$f" /opt/ferry-deps-fallback; done
  # Bookworm ships some libraries in /lib: gather them where the loader path points.
  [ -d "$FERRY_DEPS/lib/x86_64-linux-gnu" ] && cp -a "$FERRY_DEPS/lib/x86_64-linux-gnu/." "$FERRY_LIB/"
  # The system's libraries, by soname ("\tlibssl.so.3 (libc6,x86-64) => /usr/lib/.../libssl.so.3").
  FERRY_SYS_LIBS=$({ /sbin/ldconfig -p || ldconfig -p; } 2>/dev/null)
  ferry_sys_lib() { awk -v n="$1" '$1 == n { print $NF; exit }' <<<"$FERRY_SYS_LIBS"; }
  # A fallback library goes in only where the system has no library of that soname.
  for so in /opt/ferry-deps-fallback/lib/x86_64-linux-gnu/*.so* /opt/ferry-deps-fallback/usr/lib/x86_64-linux-gnu/*.so*; do
    [ -e "$so" ] || continue
    n=$(basename "$so")
    [ -n "$(ferry_sys_lib "$n")" ] && continue
    cp -a "$so" "$FERRY_LIB/"
    [[ "$n" =~ \.so\.[0-9]+$ ]] && echo "device-env: the system lacks $n: using bookworm's"
  done
  # Link-time names (libssl.so, libz.so) whose library the system provides: point them there.
  for l in "$FERRY_LIB"/*.so; do
    [ -L "$l" ] && [ ! -e "$l" ] || continue
    t=$(basename "$(readlink "$l")")
    while [ -n "$t" ] && [ -z "$(ferry_sys_lib "$t")" ]; do  # libz.so.1.2.13 -> libz.so.1
      case "$t" in *.so.*) t=${t%.*} ;; *) t="" ;; esac
    done
    [ -n "$t" ] && ln -sfn "$(ferry_sys_lib "$t")" "$l"
  done
  # Debian's hiredis.pc says libdir=/usr/lib; the library is in the multiarch folder.
  sed -i 's#^libdir=/usr/lib$#libdir=/usr/lib/x86_64-linux-gnu#' "$FERRY_LIB/pkgconfig/hiredis.pc"
  for pc in krb5-gssapi libsodium openpgm-5.3 norm libbsd zlib libbrotlicommon libbrotlidec libbrotlienc; do
    printf 'Name: %s\nDescription: stand-in (device-env.sh)\nVersion: 99\n' "$pc" >"$FERRY_DEPS/stub-pc/$pc.pc"
  done
  touch "$FERRY_STAMP"  # last: an unpack cut short is redone next time
fi
export TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
export CMAKE_PREFIX_PATH="$FERRY_DEPS/usr:$TORCH_PREFIX"
export CPATH="$FERRY_DEPS/usr/include${CPATH:+:$CPATH}"
export PKG_CONFIG_SYSROOT_DIR="$FERRY_DEPS"
export PKG_CONFIG_LIBDIR="$FERRY_LIB/pkgconfig:$FERRY_DEPS/usr/share/pkgconfig:$FERRY_DEPS/stub-pc"
unset PKG_CONFIG_PATH
export LD_LIBRARY_PATH="$FERRY_LIB:$(python3 -c 'import torch,os; print(os.path.dirname(torch.__file__))')/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PATH:$FERRY_DEPS/usr/bin"   # the system's tools first; pkgconf, bc, redis-* from here
command -v pkg-config >/dev/null || export PKG_CONFIG="$FERRY_DEPS/usr/bin/pkgconf"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())'
