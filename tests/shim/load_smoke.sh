#!/usr/bin/env bash
# Loader smoke test (abi-surface.md §5.4): every installed consumer of libibverbs starts
# against the shim, in LD_LIBRARY_PATH and in LD_PRELOAD mode, with no "symbol lookup
# error", no "version ... not found" and no "no version information". Each command only
# prints its usage or queries devices, under a timeout. Needs SOFTRNIC_SHIM_DIR.
set -uo pipefail
shim="${SOFTRNIC_SHIM_DIR:?}/libibverbs.so.1"
[ -f "$shim" ] || { echo "no shim at $shim"; exit 1; }
bad='symbol lookup error|version .* not found|no version information|undefined symbol'
cmds=(
  "ibv_devices" "ibv_devinfo" "ibv_rc_pingpong -h" "ibv_uc_pingpong -h" "ibv_ud_pingpong -h"
  "ibv_srq_pingpong -h" "ibv_xsrq_pingpong -h"
  "ib_send_bw --help" "ib_send_lat --help" "ib_write_bw --help" "ib_write_lat --help"
  "ib_read_bw --help" "ib_read_lat --help" "ib_atomic_bw --help" "ib_atomic_lat --help"
  "rping -h" "ucmatose -h" "udaddy -h" "mckey -h" "rdma_server -h" "rdma_client -h"
  "rstream -h" "riostream -h" "cmtime -h" "fi_info -p verbs"
  "/usr/bin/python3 -c import_pyverbs"
)
fail=0
n=0
for mode in lib preload; do
  for c in "${cmds[@]}"; do
    read -r -a argv <<<"$c"
    command -v "${argv[0]}" >/dev/null || continue
    if [ "${argv[1]:-}" = "-c" ]; then
      argv=(/usr/bin/python3 -c 'import pyverbs.device, pyverbs.pd, pyverbs.mr, pyverbs.cq, pyverbs.qp, pyverbs.srq, pyverbs.addr, pyverbs.cmid; print(len(pyverbs.device.get_device_list()))')
    fi
    if [ "$mode" = lib ]; then
      out=$(LD_LIBRARY_PATH="$(dirname "$shim")" timeout -k 2 10 "${argv[@]}" 2>&1 </dev/null)
    else
      out=$(LD_PRELOAD="$shim" timeout -k 2 10 "${argv[@]}" 2>&1 </dev/null)
    fi
    n=$((n + 1))
    if grep -Eq "$bad" <<<"$out"; then
      echo "FAIL [$mode] $c:"; grep -E "$bad" <<<"$out" | head -3; fail=1
    else
      echo "ok   [$mode] $c"
    fi
  done
done
echo "$n commands checked"
[ "$n" -gt 20 ] || fail=1
exit $fail
