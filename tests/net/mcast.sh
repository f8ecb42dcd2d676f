#!/usr/bin/env bash
# tests/net/mcast.sh: UD multicast between hosts (issue 14) with unmodified mckey. Three
# namespaces on a bridge (tests/net/topo.sh --ipv6): an IPv4 group 239.193.8.8 sent from host 1
# reaches receivers on hosts 2 and 3 (each device joins the IP group on eth0: IGMP), and an
# IPv6 group ff0e::8:8 sent from host 1's IPv6 GID reaches host 3's IPv6 device (MLD). Every
# receiver must get all its messages; the bridge capture must show the datagrams to the groups
# with BTH DestQP 0xffffff, nothing malformed.
# Needs SOFTRNIC_SHIM_DIR; root (else exit 77).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
launch="$here/../shim/launch.sh"
: "${SOFTRNIC_SHIM_DIR:?}"
source "$here/topo.sh"
topo_require
command -v tshark >/dev/null || topo_skip "tshark is not installed (scripts/setup installs it)"
command -v mckey >/dev/null || topo_skip "mckey (rdmacm-utils) is not installed"

work="$(mktemp -d)"
fail=0
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  topo_down
  [ -n "${NET_KEEP:-}" ] && echo "work dir kept: $work" || rm -rf "$work"
}
topo_up 3 --mtu 1500 --tso off --gso off --gro off --ipv6 || { echo "FAIL: topology"; exit 1; }
trap cleanup EXIT
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# run_on HOST NAME DEVICE_IP TMO PROG ARGS...: in the background, pid in $rpid.
run_on() {
  local h="$1" name="$2" ip="$3" tmo="$4"; shift 4
  mkdir -p "$work/rt-$name" && chmod 0700 "$work/rt-$name"
  topo_exec "$h" env SOFTRNIC_IP="$ip" SOFTRNIC_RUNTIME_DIR="$work/rt-$name" SOFTRNIC_NAME=softrnic0 \
    timeout -k 3 "$tmo" "$launch" -- stdbuf -oL "$@" >"$work/$name.out" 2>&1 &
  rpid=$!
  pids+=("$rpid")
}
check() {  # NAME RC FILE
  if [ "$2" = 0 ] && grep -q 'test complete' "$3"; then return 0; fi
  echo "---- $1: exit $2 (tail)"; tail -n 15 "$3"
  return 1
}

pcap="$work/bridge.pcap"
tshark -q -i "$TOPO_BRIDGE" -F pcap -w "$pcap" -f "udp port 4791" >"$work/tshark.out" 2>&1 &
tpid=$!
pids+=("$tpid")
for _ in $(seq 1 50); do [ -s "$pcap" ] && break; sleep 0.1; done
sleep 0.5

# IPv4: two receivers (hosts 2 and 3 on their IPv4 addresses), one sender (host 1).
t0=$SECONDS
run_on 2 r4a "$(topo_ip 2)" 30 mckey -m 239.193.8.8 -b "$(topo_ip 2)" -C 20
ra=$rpid
run_on 3 r4b "$(topo_ip 3)" 30 mckey -m 239.193.8.8 -b "$(topo_ip 3)" -C 20
rb=$rpid
for n in r4a r4b; do
  for _ in $(seq 1 100); do grep -q 'receiving data' "$work/$n.out" 2>/dev/null && break; sleep 0.1; done
done
run_on 1 s4 "$(topo_ip 1)" 30 mckey -m 239.193.8.8 -s -b "$(topo_ip 1)" -C 20
s=$rpid
wait "$s"; rs=$?
wait "$ra"; r1=$?
wait "$rb"; r2=$?
good=1
check "IPv4 sender" "$rs" "$work/s4.out" || good=0
check "IPv4 receiver host 2" "$r1" "$work/r4a.out" || good=0
check "IPv4 receiver host 3" "$r2" "$work/r4b.out" || good=0
[ "$good" = 1 ] && ok "mckey IPv4 239.193.8.8: 1 sender, 2 receivers ($((SECONDS - t0))s)" || bad "mckey IPv4"

# IPv6: receiver on host 3's IPv6 device, sender on host 1 (an IPv4 device) from its IPv6 GID.
t0=$SECONDS
run_on 3 r6 "$(topo_ip6 3)" 30 mckey -m ff0e::8:8 -b "$(topo_ip6 3)" -C 20
r=$rpid
for _ in $(seq 1 100); do grep -q 'receiving data' "$work/r6.out" 2>/dev/null && break; sleep 0.1; done
run_on 1 s6 "$(topo_ip 1)" 30 mckey -m ff0e::8:8 -s -b "$(topo_ip6 1)" -C 20
s=$rpid
wait "$s"; rs=$?
wait "$r"; r1=$?
good=1
check "IPv6 sender" "$rs" "$work/s6.out" || good=0
check "IPv6 receiver host 3" "$r1" "$work/r6.out" || good=0
[ "$good" = 1 ] && ok "mckey IPv6 ff0e::8:8 ($((SECONDS - t0))s)" || bad "mckey IPv6"

sleep 0.5
kill "$tpid" 2>/dev/null
wait "$tpid" 2>/dev/null
n4=$(tshark -r "$pcap" -Y 'ip.dst == 239.193.8.8 && infiniband.bth.destqp == 0xffffff' 2>/dev/null | wc -l)
n6=$(tshark -r "$pcap" -Y 'ipv6.dst == ff0e::8:8 && infiniband.bth.destqp == 0xffffff' 2>/dev/null | wc -l)
nbad=$(tshark -r "$pcap" -Y '_ws.malformed || _ws.expert.severity >= 6291456' 2>/dev/null | wc -l)
if [ "$n4" -ge 20 ] && [ "$n6" -ge 20 ] && [ "$nbad" = 0 ]; then
  ok "capture: $n4 IPv4 and $n6 IPv6 multicast datagrams with DestQP 0xffffff, none malformed"
else
  bad "capture: $n4 IPv4 / $n6 IPv6 multicast datagrams (want >= 20 each), $nbad malformed"
fi
exit "$fail"
