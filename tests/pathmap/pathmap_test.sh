#!/usr/bin/env bash
# tests/pathmap/pathmap_test.sh: libsoftrnic_paths.so answers exactly its paths.
#  1. For a list of other paths (existing, absent, symlinks, devices, directories, "..", "//",
#     the generated tree itself, /dev/infiniband/<not declared>), every stat/access/open/
#     fopen/opendir/readlink call gives the same result with and without the preload.
#  2. /sys/class/infiniband/softrnic0/<f> gives what $SYSFS_PATH/class/infiniband/softrnic0/<f>
#     gives without it; /dev/infiniband/uverbs0 stats and access()es as /dev/null and still
#     cannot be opened; without the preload all of them are ENOENT (so 2 fails without it).
#  3. Without SYSFS_PATH (or SYSFS_PATH=/sys) it answers nothing.
#  4. It exports only the interposed libc functions.
#  5. `scripts/softrnic run` preloads it.
# usage: pathmap_test.sh SOURCE_ROOT SHIM_DIR PROBE PATHS_LIB
set -uo pipefail
src=$1; shimdir=$2; probe=$(realpath "$3"); lib=$(realpath "$4")
fail=0
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export SOFTRNIC_RUNTIME_DIR=$tmp/rt
for real in /sys/class/infiniband/softrnic0 /dev/infiniband/uverbs0; do
  if [ -e "$real" ]; then echo "SKIP: this host has a real $real"; exit 77; fi
done
# The generated tree, exactly as `softrnic run` makes it.
export SOFTRNIC_SHIM_DIR=$shimdir
sysfs=$("$src/scripts/softrnic" env | sed -n 's/^export SYSFS_PATH=//p')
[ -d "$sysfs/class/infiniband/softrnic0" ] || { echo "FAIL: no generated tree ($sysfs)"; exit 1; }

without() { env -u LD_PRELOAD SYSFS_PATH="$sysfs" "$probe" "$1"; }
with() { env LD_PRELOAD="$lib" SYSFS_PATH="$sysfs" "$probe" "$1"; }
check_same() {  # label path-with path-without [preload-env]
  local a b
  a=$(with "$2") || { echo "FAIL: probe failed on $2 (preloaded)"; fail=1; return; }
  b=$(without "$3") || { echo "FAIL: probe failed on $3"; fail=1; return; }
  if [ "$a" != "$b" ]; then
    echo "FAIL: $1: $2 (preloaded) differs from $3:"; diff <(echo "$b") <(echo "$a") | head -20; fail=1
  else
    echo "ok: $1: $2"
  fi
}

cd "$tmp"
echo data >rel_file
ln -s /etc/hostname link_to_hostname
ln -s /nonexistent dangling
passthrough=(
  / /etc/passwd /etc/hostname /dev/null /dev/zero /dev/stdin /proc/version /nonexistent/x
  rel_file link_to_hostname dangling "$tmp" ""
  /dev/infiniband /dev/infiniband/ /dev/infiniband/uverbs1 /dev/infiniband/rdma_cm
  /dev/infiniband/uverbs0/x /dev/infiniband/./uverbs0 /dev/infiniband//uverbs0
  /sys /sys/class /sys/class/infiniband /sys/class/infiniband/ /sys/class/net/lo/mtu
  /sys/class/infiniband/nosuchdev /sys/class/infiniband/nosuchdev/ports/1/gid_attrs/types/0
  /sys/class/infiniband/softrnic0/../softrnic0/node_type /sys/class/infiniband//softrnic0/node_type
  /sys/class/infiniband/./softrnic0/node_type /sys/class/infiniband/softrnic0/ports/./1
  /sys/class/infiniband_verbs/uverbs0 /sys/class/infiniband_verbs/uverbs0/ibdev
  "$sysfs/class/infiniband/softrnic0/node_type" "$sysfs/class/infiniband/softrnic0/ports/1/gid_attrs/types/0"
  "$sysfs/class/infiniband/softrnic0"
)
for p in "${passthrough[@]}"; do check_same "unchanged" "$p" "$p"; done

mapped=(
  "" /node_type /ports /ports/1/gid_attrs/types/0 /ports/1/gid_attrs/ndevs/0 /ports/1/gid_attrs/types/
  /device/numa_node /device/driver /ports/1/nosuchfile
)
for m in "${mapped[@]}"; do
  check_same "mapped" "/sys/class/infiniband/softrnic0$m" "$sysfs/class/infiniband/softrnic0$m"
done
# Without the preload these are absent: the mapping above is the interposer's doing.
if without /sys/class/infiniband/softrnic0/ports/1/gid_attrs/types/0 | grep -q '^open: open ok'; then
  echo "FAIL: the path exists without the preload: the test proves nothing"; fail=1
fi

# /dev/infiniband/uverbs0: the stat and access families as /dev/null; open still fails.
a=$(with /dev/infiniband/uverbs0); dn=$(without /dev/null); orig=$(without /dev/infiniband/uverbs0)
stat_fns='^(stat|lstat|stat64|lstat64|fstatat|fstatat64|__xstat64|__lxstat|__fxstatat64|statx|access\(F_OK\)|access\(R_OK\|W_OK\)|faccessat|euidaccess):'
if [ "$(grep -E "$stat_fns" <<<"$a")" != "$(grep -E "$stat_fns" <<<"$dn")" ]; then
  echo "FAIL: uverbs0 stat/access differ from /dev/null:"; diff <(grep -E "$stat_fns" <<<"$dn") <(grep -E "$stat_fns" <<<"$a"); fail=1
elif [ "$(grep -vE "$stat_fns" <<<"$a")" != "$(grep -vE "$stat_fns" <<<"$orig")" ]; then
  echo "FAIL: uverbs0 open/readlink changed:"; diff <(grep -vE "$stat_fns" <<<"$orig") <(grep -vE "$stat_fns" <<<"$a"); fail=1
elif grep -q '^stat: 0' <<<"$orig"; then
  echo "FAIL: uverbs0 exists without the preload"; fail=1
else
  echo "ok: /dev/infiniband/uverbs0 stats as a read-write character device (/dev/null), open unchanged"
fi

# No tree, or the real /sys: nothing is answered.
for root in "" /sys; do
  a=$(env LD_PRELOAD="$lib" SYSFS_PATH="$root" "$probe" /dev/infiniband/uverbs0)
  b=$(env -u LD_PRELOAD SYSFS_PATH="$root" "$probe" /dev/infiniband/uverbs0)
  c=$(env LD_PRELOAD="$lib" SYSFS_PATH="$root" "$probe" /sys/class/infiniband/softrnic0/node_type)
  d=$(env -u LD_PRELOAD SYSFS_PATH="$root" "$probe" /sys/class/infiniband/softrnic0/node_type)
  if [ "$a" != "$b" ] || [ "$c" != "$d" ]; then echo "FAIL: SYSFS_PATH='$root' still maps"; fail=1
  else echo "ok: SYSFS_PATH='$root': nothing mapped"; fi
done

# The launcher preloads it (whatever LD_PRELOAD the caller had).
# (tests/shim/launch.sh: in the asan build it preloads the sanitizer runtime the shim needs.)
if "$src/tests/shim/launch.sh" -- "$probe" /dev/infiniband/uverbs0 | grep -q '^access(R_OK|W_OK): 0$' &&
   "$src/tests/shim/launch.sh" --preload -- "$probe" /sys/class/infiniband/softrnic0/ports/1/gid_attrs/types/0 |
     grep -q "^fopen: ok 'RoCE v2'$"; then
  echo "ok: softrnic run preloads it"
else
  echo "FAIL: softrnic run does not preload it"; fail=1
fi

# Exports: exactly the interposed libc functions.
want="__fxstatat __fxstatat64 __lxstat __lxstat64 __open64_2 __open_2 __openat64_2 __openat_2 __xstat __xstat64 access eaccess euidaccess faccessat fopen fopen64 fstatat fstatat64 lstat lstat64 open open64 openat openat64 opendir readlink readlinkat stat stat64 statx"
got=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWiV]$/ {print $3}' | sed 's/@.*//' | sort | tr '\n' ' ' | sed 's/ $//')
other=$(nm -D --defined-only "$lib" | awk '$2 !~ /^[TtWiV]$/ {print $3}' | tr '\n' ' ')
if [ "$got" != "$want" ] || [ -n "$other" ]; then
  echo "FAIL: exports: got '$got' (other: '$other'), want '$want'"; fail=1
else
  echo "ok: exports only the interposed functions"
fi
exit $fail
