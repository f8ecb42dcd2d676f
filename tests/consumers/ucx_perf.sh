#!/usr/bin/env bash
# tests/consumers/ucx_perf.sh: unmodified ucx_perftest (Debian's UCX) over softrnic, server and
# client as two processes through `scripts/softrnic run` (tests/shim/launch.sh), each with its
# own device (SOFTRNIC_IP 127.0.0.x). For every TEST[:SIZE] it passes when both sides exit 0,
# the client prints UCX's "Final:" row and the client's device captured (SOFTRNIC_PCAP) at
# least as many RoCE packets as iterations: the data went over softrnic, not over shm or tcp.
#   ucx_perf.sh [--iters N] TLS TEST[:SIZE]...      e.g. ucx_perf.sh rc_verbs,ud_verbs tag_lat
# Prints "figure TLS TEST SIZE <latency usec> <MB/s>" per test (the "Final:" row) for
# scripts/bench_ucx, which sets BENCH_NO_PCAP=1 (no capture, no packet count: the figures are
# the device's, not the pcap writer's). Exit 77 (skip) when ucx_perftest is not installed.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
iters=2000
[ "${1:-}" = "--iters" ] && { iters=$2; shift 2; }
tls=$1; shift
consumer_init ucx_perftest ucx-utils
export UCX_TLS="$tls" UCX_WARN_UNUSED_ENV_VARS=n
# The device, unless the transport is UCX's own tcp (the baseline of scripts/bench_ucx).
if [ "$tls" = tcp ]; then export UCX_NET_DEVICES=lo; else export UCX_NET_DEVICES=softrnic0:1; fi

fail=0
n=0
for spec in "$@"; do
  t=${spec%%:*}; size=8
  [ "$spec" != "$t" ] && size=${spec#*:}
  n=$((n + 1))
  port=$(free_port $((13400 + n * 7)))
  sip=127.0.0.$((60 + 2 * n)); cip=127.0.0.$((61 + 2 * n))
  pcap="$work/client-$n.pcap"
  [ -n "${BENCH_NO_PCAP:-}" ] && pcap=
  SOFTRNIC_IP=$sip timeout -k 5 120 "$launch" -- ucx_perftest -p "$port" >"$work/s.out" 2>&1 &
  spid=$!
  wait_listen "$port" "$spid"
  env SOFTRNIC_IP=$cip ${pcap:+SOFTRNIC_PCAP=$pcap} timeout -k 5 120 "$launch" -- \
    ucx_perftest 127.0.0.1 -p "$port" -t "$t" -s "$size" -n "$iters" -w 100 >"$work/c.out" 2>&1
  crc=$?
  wait "$spid"; src=$?
  final=$(grep -E '^ *Final:' "$work/c.out" | tail -1)
  pkts=$(pcap_packets "$pcap")
  # "Final:" row: iterations, latency typical/average/overall (usec), bandwidth
  # average/overall (MB/s), message rate average/overall.
  lat=$(awk '{print $3}' <<<"$final"); bw=$(awk '{print $7}' <<<"$final")
  if [ "$crc" -ne 0 ] || [ "$src" -ne 0 ] || [ -z "$final" ]; then
    echo "FAIL: $tls $t $size: client exit $crc, server exit $src"
    echo "== server"; show_log "$work/s.out"; echo "== client"; show_log "$work/c.out"
    fail=1
  elif [ "$tls" != tcp ] && [ -n "$pcap" ] && [ "$pkts" -lt "$iters" ]; then
    echo "FAIL: $tls $t $size: only $pkts RoCE packets for $iters iterations (not over softrnic?)"
    fail=1
  else
    echo "ok: $tls $t $size: $final${pcap:+ (client device: $pkts packets)}"
    echo "figure $tls $t $size ${lat:-n/a} ${bw:-n/a}"
  fi
done
exit $fail
