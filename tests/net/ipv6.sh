#!/usr/bin/env bash
# tests/net/ipv6.sh: softrnic over IPv6 GIDs between hosts (issue 11). Two namespaces on a
# bridge (tests/net/topo.sh --ipv6): eth0 has 10.x.0.i/24, fdNN::i/64 (nodad) and its fe80::
# link-local address. Each device is opened on the IPv4 address (SOFTRNIC_IP), so its GID table
# is 0 = ::ffff:10.x.0.i, 1 = fdNN::i, 2 = fe80::... (emu/objects/device.h gid_table_for).
# Checks: ibv_devinfo -v lists the three GIDs with their type; the generated sysfs tree
# (scripts/softrnic make_sysfs) has gids/N, gid_attrs/types/N, gid_attrs/ndevs/N; unmodified
# ibv_rc_pingpong -g 1 and -g 2 (link-local), ibv_ud_pingpong -g 1, ib_write_bw -x 1 and
# ib_read_lat -x 1 complete; the bridge capture holds IPv6 RoCEv2 frames only for those runs,
# every ICRC verifies (pcap_icrc_check --min-ipv6) and tshark decodes them with nothing
# malformed. Needs SOFTRNIC_SHIM_DIR, SOFTRNIC_CTL, PCAP_ICRC_CHECK; root (else exit 77).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
launch="$here/../shim/launch.sh"
: "${SOFTRNIC_SHIM_DIR:?}" "${SOFTRNIC_CTL:?}" "${PCAP_ICRC_CHECK:?}"
source "$here/topo.sh"
topo_require
command -v tshark >/dev/null || topo_skip "tshark is not installed (scripts/setup installs it)"
command -v ibv_devinfo >/dev/null || topo_skip "ibverbs-utils is not installed"

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
topo_up 2 --mtu 1500 --tso off --gso off --gro off --ipv6 || { echo "FAIL: topology"; exit 1; }
trap cleanup EXIT
echo "topology: 2 hosts on $TOPO_BRIDGE, $(topo_ip 1)/$(topo_ip6 1) and $(topo_ip 2)/$(topo_ip6 2)"
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# run_on HOST NAME TMO PROG ARGS...: the program on host HOST's device (background, pid in $rpid).
run_on() {
  local h="$1" name="$2" tmo="$3"; shift 3
  mkdir -p "$work/rt$h-$name" && chmod 0700 "$work/rt$h-$name"
  topo_exec "$h" env SOFTRNIC_IP="$(topo_ip "$h")" SOFTRNIC_RUNTIME_DIR="$work/rt$h-$name" \
    SOFTRNIC_NAME=softrnic0 timeout -k 3 "$tmo" "$launch" -- "$@" >"$work/$name.out" 2>&1 &
  rpid=$!
  pids+=("$rpid")
}
# pair NAME EXPECT PORT TMO PROG ARGS...: server on host 1, client on host 2 (to 10.x.0.1 for
# the out-of-band exchange; the RDMA traffic goes to the GID the program is given).
pair() {
  local name="$1" expect="$2" port="$3" tmo="$4"; shift 4
  local t0=$SECONDS _
  run_on 1 "$name.server" "$tmo" "$@" -p "$port"
  local spid=$rpid
  for _ in $(seq 1 100); do
    topo_exec 1 ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && break
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  run_on 2 "$name.client" "$tmo" "$@" -p "$port" "$(topo_ip 1)"
  local cpid=$rpid rc1 rc2
  wait "$spid"; rc1=$?
  wait "$cpid"; rc2=$?
  if [ "$rc1" = 0 ] && [ "$rc2" = 0 ] && grep -Eq -- "$expect" "$work/$name.client.out"; then
    ok "$name ($((SECONDS - t0))s)"
  else
    bad "$name (server $rc1, client $rc2)"
    local p
    for p in server client; do echo "---- $name $p (tail)"; tail -n 15 "$work/$name.$p.out"; done
  fi
}

# ---- the GID table through the verbs (ibv_devinfo -v: ibv_query_gid_table) and sysfs ----
run_on 1 devinfo 20 ibv_devinfo -v
wait "$rpid"
gids="$(grep -E 'GID\[ *[0-9]+\]' "$work/devinfo.out")"
echo "$gids" | sed 's/^[[:space:]]*/     /'
ip6="$(topo_ip6 1)"
if echo "$gids" | grep -Eq "GID\[ *0\]:.*::ffff:$(topo_ip 1), RoCE v2" &&
   echo "$gids" | grep -Eq "GID\[ *1\]:.*$ip6, RoCE v2" &&
   echo "$gids" | grep -Eq "GID\[ *2\]:.*fe80:.*, RoCE v2"; then
  ok "ibv_devinfo lists IPv4-mapped, IPv6 global and link-local GIDs, each RoCE v2"
else
  bad "ibv_devinfo GIDs"; cat "$work/devinfo.out" | tail -20
fi
sysroot="$(topo_exec 1 env SOFTRNIC_IP="$(topo_ip 1)" SOFTRNIC_RUNTIME_DIR="$work/rt-sysfs" \
  SOFTRNIC_CTL="$SOFTRNIC_CTL" SOFTRNIC_SHIM_DIR="$SOFTRNIC_SHIM_DIR" \
  bash "$here/../../scripts/softrnic" env | sed -n 's/^export SYSFS_PATH=//p')"
port1="$sysroot/class/infiniband/softrnic0/ports/1"
if [ "$(cat "$port1/gid_attrs/types/1" 2>/dev/null)" = "RoCE v2" ] &&
   [ "$(cat "$port1/gid_attrs/ndevs/2" 2>/dev/null)" = "eth0" ] &&
   grep -q "^fe80:" "$port1/gids/2" 2>/dev/null &&
   [ "$(cat "$port1/gids/0")" = "0000:0000:0000:0000:0000:ffff:$(printf '%02x%02x:%02x%02x' ${TOPO_NET//./ } 1)" ]; then
  ok "sysfs: gids/0..2 $(cat "$port1"/gids/* | tr '\n' ' '), types 'RoCE v2', ndevs eth0"
else
  bad "sysfs tree: $(ls "$port1/gids" "$port1/gid_attrs/types" 2>&1 | tr '\n' ' ')"
fi

# ---- traffic over IPv6 GIDs, captured on the bridge ----
pcap="$work/bridge.pcap"
tshark -q -i "$TOPO_BRIDGE" -F pcap -w "$pcap" -f "udp port 4791" >"$work/tshark.out" 2>&1 &
tpid=$!
pids+=("$tpid")
for _ in $(seq 1 50); do [ -s "$pcap" ] && break; sleep 0.1; done
sleep 0.5
pp='iters in'
pt='^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+'
pair rc_pp_g1 "$pp" 18901 40 ibv_rc_pingpong -g 1 -c -s 4096 -n 200
pair rc_pp_g2_linklocal "$pp" 18902 40 ibv_rc_pingpong -g 2 -c -s 5000 -n 100
pair ud_pp_g1 "$pp" 18903 40 ibv_ud_pingpong -g 1 -c -s 1024 -n 200
pair ib_write_bw_x1 "$pt" 18904 60 ib_write_bw -d softrnic0 -x 1 -F -n 200
pair ib_read_lat_x1 "$pt" 18905 60 ib_read_lat -d softrnic0 -x 1 -F -n 200
sleep 0.5
kill "$tpid" 2>/dev/null
wait "$tpid" 2>/dev/null

total=$(tshark -n -r "$pcap" 2>/dev/null | wc -l)
v6ib=$(tshark -n -r "$pcap" -Y 'ipv6 && infiniband' 2>/dev/null | wc -l)
v4=$(tshark -n -r "$pcap" -Y 'ip' 2>/dev/null | wc -l)
badl=$(tshark -n -r "$pcap" --disable-protocol rpcordma \
        -Y '_ws.malformed || _ws.expert.severity >= error' 2>/dev/null)
if [ "$total" -ge 1000 ] && [ "$v6ib" -eq "$total" ] && [ "$v4" -eq 0 ] && [ -z "$badl" ]; then
  ok "tshark: $total frames, all IPv6 RoCEv2 (infiniband), none malformed"
else
  bad "tshark: total=$total ipv6+infiniband=$v6ib ipv4=$v4"; echo "$badl" | head -5
fi
if out=$("$PCAP_ICRC_CHECK" "$pcap" --min 1000 --min-ipv6 1000 --max-retrans-pct 3 2>&1); then
  ok "capture: $out"
else
  bad "capture: $out"
fi
# The header fields the GRH asked for: rc_pingpong sets hop limit 1 and traffic class 0.
hl=$(tshark -n -r "$pcap" -T fields -e ipv6.hlim 2>/dev/null | sort -u | tr '\n' ' ')
echo "IPv6 hop limits seen: $hl"
exit "$fail"
