#!/usr/bin/env bash
# tests/consumers/ucx_info.sh: Debian's `ucx_info -d` through `scripts/softrnic run` lists the
# memory domain softrnic0 and the device softrnic0:1 with the transports rc_verbs and ud_verbs.
# Without libsoftrnic_paths.so UCX drops the device silently (/dev/infiniband/uverbs0 absent):
# (tests/pathmap/pathmap_test.sh proves that side).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
consumer_init ucx_info ucx-utils
export SOFTRNIC_IP=127.0.0.59
timeout -k 5 60 "$launch" -- ucx_info -d >"$work/out" 2>&1
rc=$?
# The transports listed under the softrnic0:1 device, one "tl/device" line each.
found=$(awk '/# Memory domain:/ {md=$NF} /# *Transport:/ {tl=$NF} /# *Device:/ {print tl "/" $NF " md=" md}' "$work/out" | sort -u)
echo "$found"
fail=0
[ "$rc" -eq 0 ] || { echo "FAIL: ucx_info exited $rc"; tail -20 "$work/out"; fail=1; }
for tl in rc_verbs ud_verbs; do
  grep -qx "$tl/softrnic0:1 md=softrnic0" <<<"$found" || { echo "FAIL: no $tl on softrnic0:1"; fail=1; }
done
# rc_mlx5/ud_mlx5/dc_mlx5 need Mellanox hardware objects (libmlx5 DEVX): never listed.
grep -qE '^(rc|ud|dc)_mlx5/softrnic0' <<<"$found" && { echo "FAIL: an mlx5 transport on softrnic0?"; fail=1; }
[ "$fail" = 0 ] && echo "ok: ucx_info -d lists softrnic0:1 with rc_verbs and ud_verbs"
exit $fail
