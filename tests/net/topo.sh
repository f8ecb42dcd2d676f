# tests/net/topo.sh: a test topology of N network namespaces ("hosts") on one Linux bridge, shared
# by the tests in tests/net and by benchmarks. Source it, then:
#   topo_require                      exit 77 (a meson skip) with the reason unless root + ip netns
#   topo_up N [--mtu M] [--tso on|off] [--gso on|off] [--gro on|off] [--ipv6]
#                                     create hosts 1..N: namespace $(topo_ns i), interface eth0
#                                     with $(topo_ip i)/24 (10.<net>.0.i), MTU M (1500), offloads
#                                     set on BOTH ends of every veth (--tso: tx-udp-segmentation)
#   topo_exec i CMD [ARGS...]         run CMD in host i's namespace
#   topo_ip i / topo_ns i             host i's address / namespace name
#   --ipv6                            also $(topo_ip6 i)/64 (fd<net>::i, nodad) on eth0, and DAD
#                                     off so the link-local fe80:: address is usable at once
#   topo_ip6 i                        host i's IPv6 address
#   TOPO_BRIDGE                       the bridge (capture on it: tshark -i "$TOPO_BRIDGE")
#   topo_sampler WORK 'GLOB' &        sample the counters of every device whose control socket
#                                     matches WORK/GLOB (e.g. 'rt*/*.sock') into
#                                     WORK/stats.<socket's directory>, until killed
#   topo_counter_sum NAME FILE...     the sum of counter NAME over counter files ("name value"
#                                     lines: softrnic-ctl stats, SOFTRNIC_STATS_AT_EXIT); 0 if none
#   topo_down                         delete everything (installed as an EXIT trap by topo_up;
#                                     a caller with its own EXIT trap calls topo_down from it)
# Names carry the creating shell's pid ($$) so parallel runs cannot collide: namespaces
# srn<pid>h<i>, bridge srn<pid>b, host-side veth ends srn<pid>v<i> (<= 15 characters).

TOPO_TAG="srn$$"
TOPO_BRIDGE="${TOPO_TAG}b"
TOPO_N=0
TOPO_NET="${TOPO_NET:-10.$(( ($$ % 200) + 20 )).0}"

topo_skip() { echo "SKIP $(basename "$0"): $*"; exit 77; }

topo_require() {
  [ "$(id -u)" = 0 ] || topo_skip "needs root to create network namespaces (running as uid $(id -u))"
  command -v ip >/dev/null || topo_skip "iproute2 'ip' is not installed"
  command -v ethtool >/dev/null || topo_skip "ethtool is not installed"
  ip netns list >/dev/null 2>&1 || topo_skip "'ip netns' does not work here"
  local probe="${TOPO_TAG}probe"
  ip netns add "$probe" 2>/dev/null || topo_skip "cannot create a network namespace (ip netns add failed)"
  ip netns del "$probe" 2>/dev/null
  ip link add "${TOPO_TAG}pb" type bridge 2>/dev/null || topo_skip "cannot create a Linux bridge"
  ip link del "${TOPO_TAG}pb" 2>/dev/null
  return 0
}

topo_ns() { echo "${TOPO_TAG}h$1"; }
topo_ip() { echo "${TOPO_NET}.$1"; }
topo_ip6() { echo "fd$(printf %02x "$(( ($$ % 200) + 20 ))")::$1"; }
topo_exec() { local i="$1"; shift; ip netns exec "$(topo_ns "$i")" "$@"; }

topo_down() {
  local i
  for ((i = 1; i <= TOPO_N; i++)); do
    ip link del "${TOPO_TAG}v$i" 2>/dev/null
    ip netns del "$(topo_ns "$i")" 2>/dev/null
  done
  ip link del "$TOPO_BRIDGE" 2>/dev/null
  TOPO_N=0
  return 0
}

# Sets the UDP segmentation / GSO / GRO offloads of one interface (run in its namespace).
topo_offloads() {
  local dev="$1" tso="$2" gso="$3" gro="$4"
  ethtool -K "$dev" tx-udp-segmentation "$tso" >/dev/null 2>&1 || true
  ethtool -K "$dev" gso "$gso" gro "$gro" >/dev/null 2>&1 || true
}

topo_up() {
  local n="$1"; shift
  local mtu=1500 tso=off gso=on gro=on ipv6=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --mtu) mtu="$2"; shift 2 ;;
      --tso) tso="$2"; shift 2 ;;
      --gso) gso="$2"; shift 2 ;;
      --gro) gro="$2"; shift 2 ;;
      --ipv6) ipv6=1; shift ;;
      *) echo "topo_up: unknown option $1" >&2; return 2 ;;
    esac
  done
  trap topo_down EXIT
  ip link add "$TOPO_BRIDGE" type bridge || return 1
  ip link set "$TOPO_BRIDGE" mtu "$mtu" up || return 1
  local i ns hv
  for ((i = 1; i <= n; i++)); do
    ns="$(topo_ns "$i")"
    hv="${TOPO_TAG}v$i"
    ip netns add "$ns" || return 1
    TOPO_N=$i
    ip link add "$hv" mtu "$mtu" type veth peer name eth0 netns "$ns" mtu "$mtu" || return 1
    ip link set "$hv" master "$TOPO_BRIDGE" up || return 1
    topo_offloads "$hv" "$tso" "$gso" "$gro"
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(topo_ip "$i")/24" dev eth0 || return 1
    if [ "$ipv6" = 1 ]; then
      ip netns exec "$ns" sysctl -qw net.ipv6.conf.eth0.accept_dad=0 net.ipv6.conf.eth0.disable_ipv6=0 || return 1
      ip -n "$ns" addr add "$(topo_ip6 "$i")/64" dev eth0 nodad || return 1
    fi
    ip -n "$ns" link set eth0 up || return 1
    ip netns exec "$ns" bash -c "$(declare -f topo_offloads); topo_offloads eth0 $tso $gso $gro"
  done
  # The bridge forwards at once (no STP, no learning delay on new ports).
  ip link set "$TOPO_BRIDGE" type bridge stp_state 0 forward_delay 0 2>/dev/null || true
  # Wait (bounded) until every host reaches host 1.
  for ((i = 2; i <= n; i++)); do
    local ok=0 _
    for _ in $(seq 1 50); do
      # No ping here: a TCP connect to a closed port answers "refused" once the path works.
      local msg
      msg="$(topo_exec "$i" timeout 1 bash -c "exec 3<>/dev/tcp/$(topo_ip 1)/9" 2>&1)"
      case "$msg" in *refused*) ok=1; break ;; esac
      sleep 0.1
    done
    [ "$ok" = 1 ] || { echo "topo_up: host $i cannot reach $(topo_ip 1)" >&2; return 1; }
  done
  return 0
}

# topo_sampler WORK GLOB: loops until killed, sampling every live device's counters ("softrnic-ctl
# stats") into WORK/stats.<name of the socket's directory>, all sockets of a round in parallel.
# The socket of a process that has exited is dropped after it refused twice: each softrnic-ctl
# call costs ~0.3 s in the asan build, and trying the dead ones in turn made rounds longer than
# the short clients live (asan CI once had no sample of a client at all).
topo_sampler() {
  local work="$1" glob="$2" s n
  while :; do
    for s in "$work"/$glob; do
      [ -S "$s" ] || continue
      n=$(basename "$(dirname "$s")")
      (
        if "$SOFTRNIC_CTL" --socket "$s" stats >"$work/st.$n.tmp" 2>"$work/st.$n.err"; then
          mv "$work/st.$n.tmp" "$work/stats.$n"
          rm -f "$work/refused.$n"
        elif grep -q "refused" "$work/st.$n.err"; then
          if [ -e "$work/refused.$n" ]; then rm -f "$s"; else : >"$work/refused.$n"; fi
        fi
      ) &
    done
    wait
    sleep 0.05
  done
}

topo_counter_sum() {
  local n="$1"; shift
  cat "$@" 2>/dev/null | awk -v n="$n" '$1 == n { s += $2 } END { print s + 0 }'
}
