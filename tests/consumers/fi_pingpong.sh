#!/usr/bin/env bash
# tests/consumers/fi_pingpong.sh PROVIDER ENDPOINT: Debian's fi_pingpong over libfabric's verbs
# provider on softrnic, server and client as two processes through `scripts/softrnic run` with
# their own device (SOFTRNIC_IP), every transfer data-checked (-c), fi_pingpong's default
# sizes (64 B up to 1 MiB for rdm; DGRAM stops at the path MTU). Passes when both exit 0, the
# client prints its result rows and the client's device captured (SOFTRNIC_PCAP) at least one
# packet per iteration.
#   fi_pingpong.sh 'verbs;ofi_rxd' rdm    RDM over the verbs DGRAM endpoint
#   fi_pingpong.sh verbs dgram            the verbs DGRAM endpoint itself (its EQ needs
#                                         librdmacm's event channel: rdmacm_shim)
# (FI_EP_MSG and verbs;ofi_rxm need a non-loopback interface: fi_pingpong_net.sh.)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
consumer_init fi_pingpong libfabric-bin
export FI_VERBS_DEVICE_NAME=softrnic0
prov=$1; ep=$2
iters=200
port=$(free_port 47700)
SOFTRNIC_IP=127.0.0.56 timeout -k 5 120 "$launch" -- fi_pingpong -p "$prov" -e "$ep" -c -I "$iters" -B "$port" \
  >"$work/s.out" 2>&1 &
spid=$!
wait_listen "$port" "$spid"
SOFTRNIC_IP=127.0.0.57 SOFTRNIC_PCAP="$work/c.pcap" timeout -k 5 120 "$launch" -- \
  fi_pingpong -p "$prov" -e "$ep" -c -I "$iters" -P "$port" 127.0.0.1 >"$work/c.out" 2>&1
crc=$?
wait "$spid"; src=$?
echo "== server (exit $src)"; cat "$work/s.out"; echo "== client (exit $crc)"; cat "$work/c.out"
fail=0
[ "$src" -eq 0 ] || { echo "FAIL: server exited $src"; fail=1; }
[ "$crc" -eq 0 ] || { echo "FAIL: client exited $crc"; fail=1; }
rows=$(awk 'NR > 1 && $1 ~ /^[0-9]/' "$work/c.out" | wc -l)
[ "$rows" -ge 1 ] || { echo "FAIL: no result rows"; fail=1; }
pkts=$(pcap_packets "$work/c.pcap")
[ "$pkts" -ge "$iters" ] || { echo "FAIL: the client's device carried $pkts packets"; fail=1; }
[ "$fail" = 0 ] && echo "ok: fi_pingpong -p '$prov' -e $ep -c: $rows sizes, $pkts packets on the client's device"
exit $fail
