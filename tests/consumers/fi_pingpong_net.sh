#!/usr/bin/env bash
# tests/consumers/fi_pingpong_net.sh PROVIDER ENDPOINT: Debian's fi_pingpong over libfabric's
# verbs provider on connected endpoints, which go through rdma_cm (rdmacm_shim/ and the IB CM
# on the wire, emu/cm). libfabric skips loopback interfaces when it looks for FI_EP_MSG
# devices, so server and client run in two network namespaces on a bridge (tests/net/topo.sh),
# each through `scripts/softrnic run` with SOFTRNIC_IP = its namespace's address, after
# `fi_info -p PROVIDER` listed the endpoint type on softrnic0; every transfer data-checked
# (-c), fi_pingpong's default sizes (64 B up to 1 MiB). Passes when both exit 0, the client
# prints a result row per size, its device captured (SOFTRNIC_PCAP) at least one packet per
# iteration and (with tshark) CM MADs to QP1 among them.
#   fi_pingpong_net.sh verbs msg              FI_EP_MSG: an RC QP connected by rdma_cm
#   fi_pingpong_net.sh 'verbs;ofi_rxm' rdm    RDM over MSG endpoints (FI_UNIVERSE_SIZE=16:
#                                             rxm sizes its CQ at 1024 x universe, 256 by
#                                             default, beyond max_cqe 32767, as on rxe)
# Needs root (network namespaces): skips (77) otherwise.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/lib.sh"
source "$here/../net/topo.sh"
consumer_init fi_pingpong libfabric-bin
topo_require
prov=$1; ep=$2
iters=100
sizes=6  # 64 256 1k 4k 64k 1m
extra=()
case "$prov" in *ofi_rxm*) extra=(FI_UNIVERSE_SIZE=16) ;; esac
topo_up 2 || { echo "FAIL: topo_up"; exit 1; }
# topo_up's EXIT trap replaced consumer_init's: remove both.
trap 'topo_down; rm -rf "$work"' EXIT
# fi_info lists the endpoint type on the device (FI_EP_MSG needs the non-loopback address).
topo_exec 1 env SOFTRNIC_IP="$(topo_ip 1)" SOFTRNIC_RUNTIME_DIR="$work/rt1" "${extra[@]}" \
  timeout -k 5 60 "$launch" -- fi_info -p "$prov" -t "FI_EP_${ep^^}" >"$work/info.out" 2>&1
if ! grep -q "domain: softrnic0\$" "$work/info.out" || ! grep -q "type: FI_EP_${ep^^}" "$work/info.out"; then
  cat "$work/info.out"; echo "FAIL: fi_info -p '$prov' lists no FI_EP_${ep^^} endpoint on softrnic0"; exit 1
fi
topo_exec 1 env SOFTRNIC_IP="$(topo_ip 1)" SOFTRNIC_RUNTIME_DIR="$work/rt1" \
  FI_VERBS_DEVICE_NAME=softrnic0 "${extra[@]}" \
  timeout -k 5 120 "$launch" -- fi_pingpong -p "$prov" -e "$ep" -c -I "$iters" >"$work/s.out" 2>&1 &
spid=$!
# Until the server's control socket (fi_pingpong's default port) listens in its namespace.
for _ in $(seq 1 200); do
  topo_exec 1 ss -Hltn "sport = :47592" 2>/dev/null | grep -q . && break
  kill -0 "$spid" 2>/dev/null || break
  sleep 0.1
done
topo_exec 2 env SOFTRNIC_IP="$(topo_ip 2)" SOFTRNIC_RUNTIME_DIR="$work/rt2" SOFTRNIC_PCAP="$work/c.pcap" \
  FI_VERBS_DEVICE_NAME=softrnic0 "${extra[@]}" \
  timeout -k 5 120 "$launch" -- fi_pingpong -p "$prov" -e "$ep" -c -I "$iters" "$(topo_ip 1)" \
  >"$work/c.out" 2>&1
crc=$?
wait "$spid"; src=$?
echo "== server (exit $src)"; cat "$work/s.out"; echo "== client (exit $crc)"; cat "$work/c.out"
fail=0
[ "$src" -eq 0 ] || { echo "FAIL: server exited $src"; fail=1; }
[ "$crc" -eq 0 ] || { echo "FAIL: client exited $crc"; fail=1; }
rows=$(awk 'NR > 1 && $1 ~ /^[0-9]/' "$work/c.out" | wc -l)
[ "$rows" -ge "$sizes" ] || { echo "FAIL: $rows result rows (want $sizes)"; fail=1; }
pkts=$(pcap_packets "$work/c.pcap")
[ "$pkts" -ge "$iters" ] || { echo "FAIL: the client's device carried $pkts packets"; fail=1; }
if command -v tshark >/dev/null; then
  cm=$(tshark -r "$work/c.pcap" -Y 'infiniband.bth.destqp == 1' 2>/dev/null | wc -l)
  [ "$cm" -ge 2 ] || { echo "FAIL: $cm CM MADs (to QP1) on the client's device: not connected by the CM"; fail=1; }
fi
[ "$fail" = 0 ] && echo "ok: fi_pingpong -p '$prov' -e $ep -c across namespaces: $rows sizes, $pkts packets on the client's device"
exit $fail
