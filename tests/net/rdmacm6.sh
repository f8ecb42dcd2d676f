#!/usr/bin/env bash
# tests/net/rdmacm6.sh: librdmacm over IPv6 between hosts (issue 12 with issue 11's IPv6 GIDs).
# Three namespaces on a bridge (tests/net/topo.sh --ipv6): eth0 has 10.x.0.i/24, fdNN::i/64
# (nodad) and its fe80:: link-local address. Host 1 (the servers) and host 2 open their
# device on the IPv4 address, so its GID table is 0 = ::ffff:10.x.0.i, 1 = fdNN::i, 2 = fe80::..
# (an IPv4 device that also serves IPv6); host 3 opens it on fdNN::3 (an IPv6 device: GID 0 is
# the IPv6 address, no IPv4 GID). Unmodified rdmacm-utils (server on host 1 unless said):
#   rping -a fdNN::1 (client on the IPv6 device), rping -a fe80::..%eth0 (link-local, client on
#   host 2), ucmatose -b/-s fdNN::1 (client: '[fdNN::1]', the bracketed form), udaddy -b/-s
#   fdNN::3 (server on the IPv6 device; UD: SIDR over IPv6, AH from the path and from the
#   work completion),
#   ucmatose -b :: with an IPv4 client (host 2 -> 10.x.0.1) and an IPv6 client (host 3 ->
#   fdNN::1) on the one wildcard listener (IPv4 and IPv6 coexisting).
# The bridge capture: every CM REQ of an IPv6 run is carried over IPv6, tshark decodes its
# CMA header as IP version 6 with the hosts' 16-byte addresses and the path GIDs as those
# addresses, every ICRC verifies (pcap_icrc_check) and nothing is malformed.
# Needs SOFTRNIC_SHIM_DIR, PCAP_ICRC_CHECK; root (else exit 77).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
launch="$here/../shim/launch.sh"
: "${SOFTRNIC_SHIM_DIR:?}" "${PCAP_ICRC_CHECK:?}"
source "$here/topo.sh"
topo_require
command -v tshark >/dev/null || topo_skip "tshark is not installed (scripts/setup installs it)"
for p in rping ucmatose udaddy; do
  command -v "$p" >/dev/null || topo_skip "$p (rdmacm-utils) is not installed"
done

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
S4="$(topo_ip 1)"
S6="$(topo_ip6 1)"
SLL="$(topo_exec 1 ip -6 -o addr show dev eth0 scope link | awk '{sub(/\/.*/, "", $4); print $4; exit}')"
[ -n "$SLL" ] || { echo "FAIL: host 1 has no link-local address"; exit 1; }
echo "topology: 3 hosts on $TOPO_BRIDGE; host 1 $S4 $S6 $SLL; host 3's device on $(topo_ip6 3)"

# The device address of each host: hosts 1 and 2 IPv4 (with IPv6 GIDs), host 3 IPv6.
dev_ip() { case "$1" in 3) topo_ip6 3 ;; *) topo_ip "$1" ;; esac; }

# run_on HOST NAME TMO PROG ARGS...: the program on host HOST's device (background, pid in $rpid).
# SOFTRNIC_CM_MAX_WAIT_MS caps the CM's waits (a lost MAD costs a second, not 6).
run_on() {
  local h="$1" name="$2" tmo="$3"; shift 3
  mkdir -p "$work/rt$h-$name" && chmod 0700 "$work/rt$h-$name"
  topo_exec "$h" env SOFTRNIC_IP="$(dev_ip "$h")" SOFTRNIC_RUNTIME_DIR="$work/rt$h-$name" \
    SOFTRNIC_NAME=softrnic0 SOFTRNIC_CM_MAX_WAIT_MS=1000 \
    timeout -k 3 "$tmo" "$launch" -- "$@" >"$work/$name.out" 2>&1 &
  rpid=$!
  pids+=("$rpid")
}
# server_up HOST PID: waits (bounded) until the server's device has bound UDP 4791, then a second
# for the program's own setup up to rdma_listen.
server_up() {
  local h="$1" pid="$2" _
  for _ in $(seq 1 100); do
    topo_exec "$h" ss -Hlun "sport = :4791" 2>/dev/null | grep -q . && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  sleep 1
}
# check NAME RC FILE RE [N]: exit status 0 and at least N (1) lines matching RE.
check() {
  local name="$1" rc="$2" f="$3" re="$4" n="${5:-1}" got
  got=$(grep -Ec -- "$re" "$f")
  if [ "$rc" = 0 ] && [ "$got" -ge "$n" ]; then return 0; fi
  echo "---- $name: exit $rc, $got/$n lines /$re/ (tail)"; tail -n 15 "$f"
  # stderr is unbuffered and stdout flushed at exit: the program's own error lines come first
  echo "---- $name: lines not matching /$re/"; grep -Ev -- "$re" "$f" | tail -n 15
  return 1
}
# pair NAME RE N TMO SERVER_HOST CLIENT_HOST -- SERVER_CMD... --client-- CLIENT_CMD...
pair() {
  local name="$1" re="$2" n="$3" tmo="$4" sh="$5" ch="$6"; shift 6
  [ "$1" = "--" ] && shift
  local server=() client=()
  while [ $# -gt 0 ] && [ "$1" != "--client--" ]; do server+=("$1"); shift; done
  shift
  client=("$@")
  local t0=$SECONDS
  run_on "$sh" "$name.server" "$tmo" "${server[@]}"
  local spid=$rpid
  server_up "$sh" "$spid"
  run_on "$ch" "$name.client" "$tmo" "${client[@]}"
  local cpid=$rpid rc1 rc2
  wait "$cpid"; rc2=$?
  wait "$spid"; rc1=$?
  local good=1
  check "$name server" "$rc1" "$work/$name.server.out" "$re" "$n" || good=0
  check "$name client" "$rc2" "$work/$name.client.out" "$re" "$n" || good=0
  if [ "$good" = 1 ]; then ok "$name ($((SECONDS - t0))s)"; else bad "$name"; fi
}

pcap="$work/bridge.pcap"
tshark -q -i "$TOPO_BRIDGE" -F pcap -w "$pcap" -f "udp port 4791" >"$work/tshark.out" 2>&1 &
tpid=$!
pids+=("$tpid")
for _ in $(seq 1 50); do [ -s "$pcap" ] && break; sleep 0.1; done
sleep 0.5

# rping: RC over IPv6, both directions of data validated (-V), 50 pings.
pair rping_v6 'ping data: rdma-ping-' 50 40 1 3 -- rping -s -a "$S6" -v -V -C 50 \
  --client-- rping -c -a "$S6" -v -V -C 50
# rping to the link-local address (scope = eth0): GID 2 on both ends.
pair rping_linklocal 'ping data: rdma-ping-' 20 40 1 2 -- rping -s -a "$SLL%eth0" -v -V -C 20 \
  --client-- rping -c -a "$SLL%eth0" -v -V -C 20
# ucmatose: 2 connections, sends both ways; the client names the server as '[fdNN::1]'.
pair ucmatose_v6 'test complete' 1 40 1 3 -- ucmatose -b "$S6" -c 2 \
  --client-- ucmatose -s "[$S6]" -c 2
# udaddy: UD over IPv6 (SIDR_REQ/SIDR_REP, then datagrams both ways); the server on the IPv6
# device (host 3), the client on host 1's IPv4 device, from its IPv6 GID.
pair udaddy_v6 'test complete' 1 40 3 1 -- udaddy -b "$(topo_ip6 3)" \
  --client-- udaddy -s "$(topo_ip6 3)"

# One wildcard IPv6 listener (AFONLY off, the kernel's default) takes an IPv4 client and an
# IPv6 client: host 2 connects to 10.x.0.1, host 3 (IPv6 device) to fdNN::1.
t0=$SECONDS
run_on 1 coexist.server 40 ucmatose -b :: -c 2
spid=$rpid
server_up 1 "$spid"
run_on 2 coexist.client4 40 ucmatose -s "$S4" -c 1
c4=$rpid
run_on 3 coexist.client6 40 ucmatose -s "$S6" -c 1
c6=$rpid
wait "$c4"; r4=$?
wait "$c6"; r6=$?
wait "$spid"; rs=$?
good=1
check "coexist server" "$rs" "$work/coexist.server.out" 'test complete' || good=0
check "coexist IPv4 client" "$r4" "$work/coexist.client4.out" 'test complete' || good=0
check "coexist IPv6 client" "$r6" "$work/coexist.client6.out" 'test complete' || good=0
if [ "$good" = 1 ]; then ok "coexist: ucmatose -b :: served an IPv4 and an IPv6 client ($((SECONDS - t0))s)"
else bad "coexist"; fi

sleep 0.5
kill "$tpid" 2>/dev/null
wait "$tpid" 2>/dev/null

# ---- the capture ----
h3="$(topo_ip6 3)"
# REQs over IPv6 from host 3 to fdNN::1 (rping_v6, ucmatose_v6 x2, coexist's IPv6 client):
# the CMA header says IP version 6 with both 16-byte addresses, the path GIDs are those.
reqs="$(tshark -n -r "$pcap" -Y "ipv6.src == $h3 && infiniband.cm.req" -T fields -E separator=' ' \
        -e infiniband.cm.req.ip_cm.ipv -e infiniband.cm.req.ip_cm.sip6 -e infiniband.cm.req.ip_cm.dip6 \
        -e infiniband.cm.req.prim_localgid -e infiniband.cm.req.prim_remotegid 2>/dev/null)"
nreq=$(echo "$reqs" | grep -c .)
nright=$(echo "$reqs" | awk -v s="$h3" -v d="$S6" '$1 == 6 && $2 == s && $3 == d && $4 == s && $5 == d' | wc -l)
if [ "$nreq" -ge 4 ] && [ "$nright" -eq "$nreq" ]; then
  ok "tshark: $nreq IPv6 CM REQs from $h3: CMA header IP version 6, $h3 -> $S6, path GIDs the same"
else
  bad "IPv6 CM REQs: $nreq, $nright right (want >= 4, all): ipv sip6 dip6 localgid remotegid:"
  echo "$reqs" | head -5
fi
# SIDR over IPv6 (udaddy) and the link-local exchange.
nsidr=$(tshark -n -r "$pcap" -Y "ipv6.src == $S6 && ipv6.dst == $h3 && infiniband.mad.attributeid == 0x0017" 2>/dev/null | wc -l)
nsidrrep=$(tshark -n -r "$pcap" -Y "ipv6.src == $h3 && ipv6.dst == $S6 && infiniband.mad.attributeid == 0x0018" 2>/dev/null | wc -l)
nll=$(tshark -n -r "$pcap" -Y "ipv6.dst == $SLL && infiniband.cm.req" 2>/dev/null | wc -l)
nv4req=$(tshark -n -r "$pcap" -Y "ip.dst == $S4 && infiniband.cm.req.ip_cm.ipv == 4" 2>/dev/null | wc -l)
if [ "$nsidr" -ge 1 ] && [ "$nsidrrep" -ge 1 ] && [ "$nll" -ge 1 ] && [ "$nv4req" -ge 1 ]; then
  ok "tshark: SIDR_REQ/SIDR_REP over IPv6 ($nsidr/$nsidrrep), REQ to the link-local address ($nll), IPv4 REQ with a version-4 header ($nv4req)"
else
  bad "tshark: SIDR_REQ/REP over IPv6 $nsidr/$nsidrrep, link-local REQ $nll, IPv4 REQ $nv4req (want >= 1 each)"
fi
total=$(tshark -n -r "$pcap" 2>/dev/null | wc -l)
badl=$(tshark -n -r "$pcap" --disable-protocol rpcordma \
        -Y '_ws.malformed || _ws.expert.severity >= error' 2>/dev/null)
if [ "$total" -ge 100 ] && [ -z "$badl" ]; then
  ok "tshark: $total frames, none malformed"
else
  bad "tshark: $total frames (want >= 100), malformed or in error:"; echo "$badl" | head -5
fi
if out=$("$PCAP_ICRC_CHECK" "$pcap" --min 100 --min-ipv6 100 2>&1); then
  ok "capture: $out"
else
  bad "capture: $out"
fi
exit "$fail"
