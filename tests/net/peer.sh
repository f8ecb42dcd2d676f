#!/usr/bin/env bash
# tests/net/peer.sh: softrnic against a peer that sends what hardware may send — random
# non-zero IP IDs (ICRC over them), UDP checksum 0, ECN-CE marks, CNPs. Hosts A and B are
# namespaces joined through a router namespace R that does not forward in its kernel: the
# relay tests/net/id_rewriter.py rewrites every RoCE packet in both directions. Unmodified
# ibv_rc_pingpong -c and ib_write_bw must complete, both devices must count icrc_id_solved,
# ecn_ce_rcvd and cnp_rcvd, none icrc_err, and a capture on R's B-side interface must verify
# frame by frame (pcap_icrc_check, with the rewritten IDs) and show the non-zero IDs and zero
# UDP checksums. Needs SOFTRNIC_SHIM_DIR, SOFTRNIC_CTL, PCAP_ICRC_CHECK; root (else exit 77).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
launch="$here/../shim/launch.sh"
: "${SOFTRNIC_SHIM_DIR:?}" "${SOFTRNIC_CTL:?}" "${PCAP_ICRC_CHECK:?}"
source "$here/topo.sh"
topo_require
py=/usr/bin/python3
[ -x "$py" ] || topo_skip "no /usr/bin/python3 for the relay"
command -v tshark >/dev/null || topo_skip "tshark is not installed (scripts/setup installs it)"

tag="$TOPO_TAG"
A="${tag}hA" R="${tag}hR" B="${tag}hB"
net="${TOPO_NET%.0}"  # 10.x
ipA="$net.1.1" ipB="$net.2.1"
work="$(mktemp -d)"
pids=()
fail=0
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  ip netns del "$A" 2>/dev/null; ip netns del "$R" 2>/dev/null; ip netns del "$B" 2>/dev/null
  [ -n "${NET_KEEP:-}" ] && echo "work dir kept: $work" || rm -rf "$work"
}
trap cleanup EXIT
for ns in "$A" "$R" "$B"; do ip netns add "$ns" || exit 1; ip -n "$ns" link set lo up; done
ip link add "${tag}a" netns "$A" type veth peer name r1 netns "$R" || exit 1
ip link add "${tag}b" netns "$B" type veth peer name r2 netns "$R" || exit 1
ip -n "$A" link set "${tag}a" name eth0
ip -n "$B" link set "${tag}b" name eth0
ip -n "$A" addr add "$ipA/24" dev eth0; ip -n "$A" link set eth0 up
ip -n "$B" addr add "$ipB/24" dev eth0; ip -n "$B" link set eth0 up
ip -n "$R" addr add "$net.1.254/24" dev r1; ip -n "$R" link set r1 up
ip -n "$R" addr add "$net.2.254/24" dev r2; ip -n "$R" link set r2 up
ip -n "$A" route add default via "$net.1.254"
ip -n "$B" route add default via "$net.2.254"
ip netns exec "$R" sysctl -qw net.ipv4.ip_forward=0
# Checksums complete in every frame (a veth otherwise hands on CHECKSUM_PARTIAL packets, whose
# TCP checksum the relay would copy unfinished), no UDP segmentation offload.
for ns in "$A" "$B"; do
  ip netns exec "$ns" ethtool -K eth0 tx off tx-udp-segmentation off >/dev/null 2>&1
done

ip netns exec "$R" "$py" "$here/id_rewriter.py" r1 r2 --ce-every 5 --cnp-every 20 \
  >"$work/relay.out" 2>&1 &
relay=$!
pids+=("$relay")
pcap="$work/r2.pcap"
ip netns exec "$R" tshark -q -i r2 -F pcap -w "$pcap" -f "udp port 4791" >"$work/tshark.out" 2>&1 &
tpid=$!
pids+=("$tpid")
# Wait until the relay carries TCP (a closed port answers "refused" through it).
ok=0
for _ in $(seq 1 10); do
  msg="$(ip netns exec "$B" timeout 1 bash -c "exec 3<>/dev/tcp/$ipA/9" 2>&1)"
  case "$msg" in *refused*) ok=1; break ;; esac
  sleep 0.1
done
[ "$ok" = 1 ] || { echo "FAIL: no path from B to A through the relay: $msg"; cat "$work/relay.out"; ip netns exec "$B" ip neigh; ip netns exec "$R" ip -s link; exit 1; }
for _ in $(seq 1 50); do [ -s "$pcap" ] && break; sleep 0.1; done

# run NS IP NAME TMO PROG ARGS...: background, pid in $rpid.
run() {
  local ns="$1" ip="$2" name="$3" tmo="$4"; shift 4
  mkdir -p "$work/rt-$name" && chmod 0700 "$work/rt-$name"
  ip netns exec "$ns" env SOFTRNIC_IP="$ip" SOFTRNIC_RUNTIME_DIR="$work/rt-$name" \
    SOFTRNIC_STATS_AT_EXIT="$work/final.rt-$name" \
    timeout -k 3 "$tmo" "$launch" -- "$@" >"$work/$name.out" 2>&1 &
  rpid=$!
  pids+=("$rpid")
}
topo_sampler "$work" 'rt-*/*.sock' &
pids+=("$!")

# pair NAME PORT EXPECT TMO PROG ARGS...: server on A, client on B.
pair() {
  local name="$1" port="$2" expect="$3" tmo="$4" t0=$SECONDS; shift 4
  run "$A" "$ipA" "$name.server" "$tmo" "$@" -p "$port"
  local spid=$rpid
  for _ in $(seq 1 100); do
    ip netns exec "$A" ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    sleep 0.1
  done
  run "$B" "$ipB" "$name.client" "$tmo" "$@" -p "$port" "$ipA"
  local cpid=$rpid src crc
  wait "$cpid"; crc=$?
  wait "$spid"; src=$?
  if [ "$src" = 0 ] && [ "$crc" = 0 ] && grep -Eq -- "$expect" "$work/$name.client.out"; then
    echo "ok   $name ($((SECONDS - t0))s)"
  else
    echo "FAIL $name (server exit $src, client exit $crc)"; fail=1
    tail -n 12 "$work/$name.server.out" "$work/$name.client.out"
  fi
}
pair rc_pp_5000 18821 'iters in' 60 ibv_rc_pingpong -g 0 -c -s 5000 -n 100
pair rc_pp_64 18822 'iters in' 60 ibv_rc_pingpong -g 0 -c -s 64 -n 200
pair ib_write_bw 18823 '^ *[0-9]+ +[0-9]+ +[0-9.]+' 60 ib_write_bw -d softrnic0 -x 0 -F -n 50 -s 16384
sleep 0.5
kill "$tpid" 2>/dev/null; wait "$tpid" 2>/dev/null
kill -TERM "$relay" 2>/dev/null; wait "$relay" 2>/dev/null
cat "$work/relay.out"

if out=$("$PCAP_ICRC_CHECK" "$pcap" --min 100 2>&1); then
  echo "ok   capture: $out"
  ids=$(sed -n 's/.* \([0-9]*\) with a non-zero IP ID.*/\1/p' <<<"$out")
  zc=$(sed -n 's/.* \([0-9]*\) with UDP checksum 0.*/\1/p' <<<"$out")
  [ "${ids:-0}" -gt 50 ] && [ "${zc:-0}" -gt 50 ] || { echo "FAIL: the relay did not rewrite"; fail=1; }
else
  echo "FAIL capture: $out"; fail=1
fi
# Both sides (server devices on A, client devices on B) must have solved IDs, seen CE and CNPs,
# and sent CNPs for the CE-marked requests they took (the pingpong sends both ways). From the
# final counters each device writes at close (a sampler can miss a short client).
for side in server client; do
  n=$(ls "$work"/final.rt-*."$side" 2>/dev/null | wc -l)
  [ "$n" = 3 ] || { echo "FAIL $n final counter files of the $side side, want 3"; fail=1; }
  for c in icrc_id_solved ecn_ce_rcvd cnp_rcvd cnp_sent icrc_err; do
    v=$(topo_counter_sum "$c" "$work"/final.rt-*."$side")
    echo "     $side $c $v"
    if [ "$c" = icrc_err ]; then
      [ "$v" = 0 ] || { echo "FAIL $side $c = $v"; fail=1; }
    else
      [ "$v" -gt 0 ] || { echo "FAIL $side $c = 0"; fail=1; }
    fi
  done
done
exit "$fail"
