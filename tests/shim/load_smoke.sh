#!/usr/bin/env bash
# Loader smoke test (docs/abi.md §5.4): every installed consumer of libibverbs starts
# against the shim, in LD_LIBRARY_PATH and in LD_PRELOAD mode, exits with the status it
# gives with a working library (usage: its usage status; device queries: 0), with no
# "symbol lookup error", no "version ... not found" and no "no version information".
# Every listed tool must be installed (scripts/setup installs them): a missing one fails.
# Each command only prints its usage or queries devices, under a timeout. Needs
# SOFTRNIC_SHIM_DIR; in the asan build SOFTRNIC_TEST_PRELOAD (the ASan runtime, preloaded
# first because these programs are not instrumented; leaks of foreign programs are not
# counted, see tests/shim/launch.sh).
set -uo pipefail
shim="${SOFTRNIC_SHIM_DIR:?}/libibverbs.so.1"
[ -f "$shim" ] || { echo "FAIL: no shim at $shim"; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export SOFTRNIC_RUNTIME_DIR="$work/rt"
bad='symbol lookup error|version .* not found|no version information|undefined symbol|error while loading shared libraries|ERROR: AddressSanitizer|runtime error: '
# expected exit status, command (the usage statuses are the tools' own: rping's is EINVAL)
cmds=(
  "0 ibv_devices" "0 ibv_devinfo" "1 ibv_rc_pingpong -h" "1 ibv_uc_pingpong -h"
  "1 ibv_ud_pingpong -h" "1 ibv_srq_pingpong -h" "1 ibv_xsrq_pingpong -h"
  "1 ib_send_bw --help" "1 ib_send_lat --help" "1 ib_write_bw --help" "1 ib_write_lat --help"
  "1 ib_read_bw --help" "1 ib_read_lat --help" "1 ib_atomic_bw --help" "1 ib_atomic_lat --help"
  "22 rping -h" "1 ucmatose -h" "1 udaddy -h" "1 mckey -h" "1 rdma_server -h" "1 rdma_client -h"
  "1 rstream -h" "1 riostream -h" "1 cmtime -h" "FI fi_info -p verbs"
  "0 /usr/bin/python3 -c import_pyverbs"
)
asan="${SOFTRNIC_TEST_PRELOAD:-}"
[ -n "$asan" ] && export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fail=0
n=0
for mode in lib preload; do
  for c in "${cmds[@]}"; do
    read -r want rest <<<"$c"
    read -r -a argv <<<"$rest"
    if ! command -v "${argv[0]}" >/dev/null; then
      echo "FAIL [$mode] $rest: ${argv[0]} is not installed (scripts/setup installs it)"; fail=1
      continue
    fi
    if [ "${argv[1]:-}" = "-c" ]; then
      argv=(/usr/bin/python3 -c 'import pyverbs.device, pyverbs.pd, pyverbs.mr, pyverbs.cq, pyverbs.qp, pyverbs.srq, pyverbs.addr, pyverbs.cmid; print(len(pyverbs.device.get_device_list()))')
    fi
    if [ "$mode" = lib ]; then
      envs=("LD_LIBRARY_PATH=$(dirname "$shim")" "LD_PRELOAD=$asan")
    else
      envs=("LD_PRELOAD=${asan:+$asan }$shim")
    fi
    out=$(timeout -k 2 10 env "${envs[@]}" "${argv[@]}" 2>&1 </dev/null)
    rc=$?
    n=$((n + 1))
    # libfabric's verbs provider needs an rdma_cm device node this sandbox lacks: fi_info may
    # list it (0) or report no provider (61, ENODATA); anything else is a crash or a loader error.
    if [ "$want" = FI ]; then
      { [ "$rc" -eq 0 ] || [ "$rc" -eq 61 ]; } && want=$rc || want="0|61"
    fi
    if grep -Eq "$bad" <<<"$out"; then
      echo "FAIL [$mode] $rest (exit $rc):"; grep -E "$bad" <<<"$out" | head -3; fail=1
    elif [ "$rc" != "$want" ]; then
      echo "FAIL [$mode] $rest: exit $rc, want $want"; tail -3 <<<"$out"; fail=1
    elif [ "${argv[0]}" = /usr/bin/python3 ] && ! grep -qx '[1-9][0-9]*' <<<"$(tail -1 <<<"$out")"; then
      echo "FAIL [$mode] pyverbs sees no device: $(tail -1 <<<"$out")"; fail=1
    else
      echo "ok   [$mode] $rest (exit $rc)"
    fi
  done
done
echo "$n commands checked"
[ "$n" -eq $((2 * ${#cmds[@]})) ] || { echo "FAIL: ran $n of $((2 * ${#cmds[@]})) commands"; fail=1; }
exit $fail
