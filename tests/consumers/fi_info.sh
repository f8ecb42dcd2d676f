#!/usr/bin/env bash
# tests/consumers/fi_info.sh: Debian's libfabric verbs provider through `scripts/softrnic run`:
# `fi_info -p verbs` lists softrnic0's DGRAM endpoint (FI_EP_DGRAM, FI_PROTO_IB_UD) and
# 'verbs;ofi_rxd' its RDM endpoint over it. FI_EP_MSG (and so verbs;ofi_rxm) needs librdmacm's
# connection manager on a non-loopback IP: not listed yet (README, libfabric section).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
consumer_init fi_info libfabric-bin
export SOFTRNIC_IP=127.0.0.58
fail=0
timeout -k 5 60 "$launch" -- fi_info -p verbs >"$work/v.out" 2>&1 || { echo "FAIL: fi_info -p verbs"; fail=1; }
timeout -k 5 60 "$launch" -- fi_info -p 'verbs;ofi_rxd' >"$work/r.out" 2>&1 || { echo "FAIL: fi_info -p verbs;ofi_rxd"; fail=1; }
cat "$work/v.out" "$work/r.out"
grep -A3 'domain: softrnic0-dgram' "$work/v.out" | grep -q 'FI_EP_DGRAM' || { echo "FAIL: no softrnic0-dgram FI_EP_DGRAM"; fail=1; }
grep -q 'FI_PROTO_IB_UD' "$work/v.out" || { echo "FAIL: no FI_PROTO_IB_UD"; fail=1; }
grep -A3 'domain: softrnic0-dgram' "$work/r.out" | grep -q 'FI_EP_RDM' || { echo "FAIL: no verbs;ofi_rxd FI_EP_RDM"; fail=1; }
[ "$fail" = 0 ] && echo "ok: fi_info lists softrnic0's DGRAM and verbs;ofi_rxd RDM endpoints"
exit $fail
