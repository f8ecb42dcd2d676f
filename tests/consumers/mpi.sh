#!/usr/bin/env bash
# tests/consumers/mpi.sh: Debian's Open MPI runs tests/consumers/mpi_check (ping-pong with
# every byte checked, allreduce checked, MPI_Put/MPI_Get/MPI_Accumulate checked) with 2 ranks,
# each rank on its own softrnic device (SOFTRNIC_IP 127.0.0.x, MPMD form of mpirun), started
# through `scripts/softrnic run` (tests/shim/launch.sh). Passes when mpirun exits 0, rank 0
# prints "mpi_check: OK", and each rank's device captured (SOFTRNIC_PCAP) RoCE traffic.
#   mpi.sh ucx MPI_CHECK   --mca pml ucx --mca osc ucx, UCX_TLS=rc_verbs,ud_verbs
#   mpi.sh ofi MPI_CHECK   --mca pml cm --mca mtl ofi, provider verbs;ofi_rxd (no RMA: osc ucx
#                          would bypass libfabric; Debian builds no other RDMA osc)
# Exit 77 (skip) when mpirun is not installed.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
mode=$1; app=$2
consumer_init mpirun openmpi-bin
# Debian's /etc/openmpi/openmpi-mca-params.conf excludes pml ucx, osc ucx and mtl ofi: the
# command line overrides that. btl self,vader stay for ob1's own needs; pml cm/ucx carry the
# MPI traffic.
case "$mode" in
  ucx) mca=(--mca pml ucx --mca osc ucx -x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_NET_DEVICES=softrnic0:1
            -x UCX_WARN_UNUSED_ENV_VARS=n); args=(--rma); ip=91 ;;
  ofi) mca=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include 'verbs;ofi_rxd'
            -x FI_VERBS_DEVICE_NAME=softrnic0); args=(); ip=93 ;;
  *) echo "usage: mpi.sh ucx|ofi MPI_CHECK" >&2; exit 2 ;;
esac
timeout -k 5 240 "$launch" -- mpirun --allow-run-as-root --oversubscribe --bind-to none \
  -x LD_LIBRARY_PATH -x LD_PRELOAD -x SYSFS_PATH -x SOFTRNIC_RUNTIME_DIR "${mca[@]}" \
  -np 1 -x SOFTRNIC_IP=127.0.0.$ip -x SOFTRNIC_PCAP="$work/rank0.pcap" "$app" "${args[@]}" : \
  -np 1 -x SOFTRNIC_IP=127.0.0.$((ip + 1)) -x SOFTRNIC_PCAP="$work/rank1.pcap" "$app" "${args[@]}" \
  >"$work/out" 2>&1
rc=$?
cat "$work/out"
fail=0
[ "$rc" -eq 0 ] || { echo "FAIL: mpirun exited $rc"; fail=1; }
grep -q '^mpi_check: OK$' "$work/out" || { echo "FAIL: no 'mpi_check: OK'"; fail=1; }
for r in 0 1; do
  pkts=$(pcap_packets "$work/rank$r.pcap")
  if [ "$pkts" -lt 1000 ]; then echo "FAIL: rank $r's device carried $pkts packets (not over softrnic?)"; fail=1
  else echo "ok: rank $r's device carried $pkts RoCE packets"; fi
done
exit $fail
