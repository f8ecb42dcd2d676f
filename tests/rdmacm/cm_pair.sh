#!/usr/bin/env bash
# rdma_cm conformance pair: an unmodified rdma_cm program as server and client, two
# processes each with its own softrnic device (SOFTRNIC_IP = distinct loopback addresses),
# both through scripts/softrnic run (tests/shim/launch.sh), with timeouts.
#   cm_pair.sh [--preload] [--expect RE] [--server-expect RE] [--count RE N] [--timeout S]
#              [--no-retry] [--settle S] [--daemon] [--env NAME=VALUE]...
#              SERVER_IP CLIENT_IP -- SERVER_CMD... --client-- CLIENT_CMD...
# (either IP may be "auto": a free random 127.64-127.127 address).
# --daemon: one softrnicd (SOFTRNICD, its own runtime dir, --ip SERVER_IP) hosts the device of
# both processes (SOFTRNIC_HOSTING=daemon), so both are on SERVER_IP (CLIENT_IP is ignored):
# the client starts once the daemon's socket is up and a client of it has claimed a CM
# service ID (the server's rdma_listen, from the daemon's status), and its sanitizer reports
# and exit status count as the programs' do.
# --env: set for both programs' launches (e.g. SOFTRNIC_TEST_EXTRA_PRELOAD=librspreload.so,
# which launch.sh preloads into the program only).
# @SIP@ in either command is replaced by SERVER_IP. Passes when both exit 0 and the outputs
# match (--count RE N: the client's output has at least N lines matching RE, and so does the
# server's with --server-count). rdma_cm uses no TCP port: the client starts once the
# server's device has bound SERVER_IP:4791 (its UDP socket) and a second has passed, and
# tries again when it was rejected for want of a listener (the server was not there yet).
# --no-retry (programs that listen twice, perftest -R): the client is not retried alone; a
# pair whose client was rejected that way is run again as a whole (at most 3 times), the
# rejected try's output shown first.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
launch="$here/../shim/launch.sh"
. "$here/../shim/output_checks.sh"
mode=()
expect='.'
sexpect='.'
count_re=''
count_n=0
scount_re=''
scount_n=0
tmo=60
tries=3
settle=1
daemon=0
progenv=()
while [ $# -gt 0 ]; do
  case "$1" in
    --preload) mode=(--preload); shift ;;
    --expect) expect="$2"; shift 2 ;;
    --server-expect) sexpect="$2"; shift 2 ;;
    --count) count_re="$2"; count_n="$3"; shift 3 ;;
    --server-count) scount_re="$2"; scount_n="$3"; shift 3 ;;
    --timeout) tmo="$2"; shift 2 ;;
    --no-retry) tries=1; shift ;;
    --settle) settle="$2"; shift 2 ;;
    --daemon) daemon=1; shift ;;
    --env) progenv+=("$2"); shift 2 ;;
    *) break ;;
  esac
done
sip="$1"; cip="$2"; shift 2
# "auto": a random loopback address no socket holds port 4791 on (other checkouts may run
# the same tests at the same time; ss narrows the race to the moment between check and bind).
pick_ip() {
  local ip
  for _ in $(seq 1 100); do
    ip="127.$((RANDOM % 64 + 64)).$((RANDOM % 256)).$((RANDOM % 250 + 2))"
    ss -Hlun "src $ip:4791" 2>/dev/null | grep -q . || { echo "$ip"; return; }
  done
  echo "127.0.0.254"
}
[ "$sip" = auto ] && sip="$(pick_ip)"
[ "$cip" = auto ] && cip="$(pick_ip)"
[ "$daemon" = 1 ] && cip="$sip"
[ "${1:-}" = "--" ] && shift
server=(); client=()
while [ $# -gt 0 ] && [ "$1" != "--client--" ]; do server+=("${1//@SIP@/$sip}"); shift; done
[ "${1:-}" = "--client--" ] && shift
while [ $# -gt 0 ]; do client+=("${1//@SIP@/$sip}"); shift; done
[ ${#server[@]} -gt 0 ] && [ ${#client[@]} -gt 0 ] || { echo "usage: see the header of $0" >&2; exit 2; }

work="$(mktemp -d)"
dpid=
trap '[ -n "$dpid" ] && kill "$dpid" 2>/dev/null; rm -rf "$work"' EXIT
export SOFTRNIC_RUNTIME_DIR="$work/rt"

# Without a CM agent in the device (rdma_listen: ENOSYS) the pair cannot run: a counted skip.
if [ -n "${RDMACM_CM_PROBE:-}" ]; then
  SOFTRNIC_IP="$sip" "$launch" -- "$RDMACM_CM_PROBE"
  prc=$?
  [ "$prc" = 77 ] && { echo "SKIP: the device has no CM agent (rdma_listen fails with ENOSYS)"; exit 77; }
  [ "$prc" = 0 ] || { echo "FAIL: cm_probe exited $prc"; exit 1; }
fi

# CM service IDs claimed on softrnicd's devices (its kStatus answer, daemon/proto/proto.h),
# or nothing if it does not answer.
daemon_services() {
  /usr/bin/python3 - "$SOFTRNIC_RUNTIME_DIR/softrnicd.sock" <<'PY' 2>/dev/null
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(2)
s.connect(sys.argv[1])
s.send(struct.pack('=II', 8, 8))  # Header{kStatus, len 8}
m = s.recv(65536)
print(sum(d['services'] for d in json.loads(m[8:].decode())['devices']))
PY
}

if [ "$daemon" = 1 ]; then
  mkdir -p -m 700 "$SOFTRNIC_RUNTIME_DIR"
  "${SOFTRNICD:?SOFTRNICD: the softrnicd binary}" --foreground --runtime-dir "$SOFTRNIC_RUNTIME_DIR" \
    --ip "$sip" >"$work/daemon.out" 2>&1 &
  dpid=$!
  for _ in $(seq 1 100); do [ -S "$SOFTRNIC_RUNTIME_DIR/softrnicd.sock" ] && break; sleep 0.05; done
  [ -S "$SOFTRNIC_RUNTIME_DIR/softrnicd.sock" ] || { echo "FAIL: softrnicd did not start"; cat "$work/daemon.out"; exit 1; }
  export SOFTRNIC_HOSTING=daemon
fi

# One run of the pair: the server, then (once it listens) the client; sets up, src, crc.
run_pair() {
env "${progenv[@]}" SOFTRNIC_IP="$sip" timeout -k 5 "$tmo" "$launch" "${mode[@]}" -- "${server[@]}" >"$work/server.out" 2>&1 &
spid=$!
up=0
for _ in $(seq 1 200); do
  if [ "$daemon" = 1 ]; then
    [ "$(daemon_services)" -gt 0 ] 2>/dev/null && { up=1; break; }
  elif ss -Hlun "src $sip:4791" 2>/dev/null | grep -q .; then
    up=1; break
  fi
  kill -0 "$spid" 2>/dev/null || break
  sleep 0.1
done
if [ "$up" = 1 ]; then
  # from the device's bind to rdma_listen: the program's own setup (daemon: from the first
  # listen to the next, perftest -R listens twice)
  sleep "$settle"
elif [ "$daemon" = 1 ]; then
  echo "FAIL: the server never listened on softrnicd's device $sip (20 s)"
else
  echo "FAIL: the server's device never bound $sip:4791 (20 s)"
fi
# A client that came before the server's rdma_listen is rejected with reason 8 (no listener
# for the service ID): that is start-up order, not a result; it retries (3 tries, 2 s apart).
# (--no-retry: programs that listen more than once, perftest -R, cannot be retried: the
# server has moved on to its next phase; the whole pair is run again instead, below.)
cnice=5
[ "$tries" = 1 ] && cnice=19
for try in $(seq 1 "$tries"); do
  # nice: on a loaded machine the server must reach its rdma_listen first (perftest -R
  # listens twice, and a REQ that beats the second listen is rejected; perftest's client
  # then crashes). --no-retry programs are those: their client runs at the lowest priority.
  env "${progenv[@]}" SOFTRNIC_IP="$cip" timeout -k 5 "$tmo" nice -n "$cnice" "$launch" "${mode[@]}" -- "${client[@]}" >"$work/client.out" 2>&1
  crc=$?
  [ "$try" -lt "$tries" ] && [ "$crc" -ne 0 ] && grep -Eq 'REJECTED[^0-9]*8\b' "$work/client.out" && kill -0 "$spid" 2>/dev/null || break
  echo "note: try $try: the server was not listening yet (REJECTED 8); trying again"
  sleep 2
done
# perftest -R's client connects twice, and its second REQ can beat the server's second
# rdma_listen (the server was between its control and its data connection): rejected with
# reason 8. That is start-up order too, but only a new pair can retry it: the server waits
# in its listen for good. The failed try's output is shown, not dropped. Five pairs: on a
# loaded 2-core machine three in a row lost that race, when the client's device held the ACK
# of the server's last control SEND for a post and its timer woke milliseconds late (fixed:
# a thread entering the CM sends it, docs/progress.md).
# Only a server that listened and is still waiting (alive) is retried: one that crashed or
# exited (its second listen never came) is a result, not start-up order.
if [ "$tries" = 1 ] && [ "$up" = 1 ] && [ "$crc" -ne 0 ] && kill -0 "$spid" 2>/dev/null &&
   grep -Eq 'REJECTED[^0-9]*8\b' "$work/client.out" && [ "$pair_try" -lt 5 ]; then
  kill "$spid" 2>/dev/null
  wait "$spid"
  src=$?
  echo "note: pair try $pair_try: the client's connect came before the server's listen" \
    "(REJECTED 8); its output, then the pair again:"
  echo "== server (exit $src)"; cat "$work/server.out"
  echo "== client (exit $crc)"; cat "$work/client.out"
  echo "== end of pair try $pair_try"
  # the daemon drops the killed server's service ID; a new server must claim it afresh
  if [ "$daemon" = 1 ]; then
    for _ in $(seq 1 100); do [ "$(daemon_services)" = 0 ] && break; sleep 0.1; done
  fi
  return 1
fi
wait "$spid"
src=$?
return 0
}

for pair_try in 1 2 3 4 5; do
  run_pair && break
done
# perftest's failed clock calibration (output_checks.sh): that run's output is shown, and the
# pair is run once more and judged.
if calibration_failed "$work/server.out" "$work/client.out" "$expect" "$sexpect"; then
  echo "note: perftest's clock calibration failed and the output lacks what is expected; its output, then the pair again:"
  echo "== server (exit $src)"; cat "$work/server.out"
  echo "== client (exit $crc)"; cat "$work/client.out"
  # the daemon drops the finished server's service ID; a new server must claim it afresh
  if [ "$daemon" = 1 ]; then
    for _ in $(seq 1 100); do [ "$(daemon_services)" = 0 ] && break; sleep 0.1; done
  fi
  for pair_try in 1 2 3 4 5; do
    run_pair && break
  done
fi

echo "== server ($sip): ${server[*]} (exit $src)"
cat "$work/server.out"
echo "== client ($cip): ${client[*]} (exit $crc)"
cat "$work/client.out"

fail=0
[ "$up" = 1 ] || fail=1
check_run server "$src" "$work/server.out" "$sexpect" || fail=1
check_run client "$crc" "$work/client.out" "$expect" || fail=1
if [ -n "$count_re" ]; then
  n=$(grep -Ec -- "$count_re" "$work/client.out")
  [ "$n" -ge "$count_n" ] || { echo "FAIL: client has $n lines /$count_re/, want >= $count_n"; fail=1; }
fi
if [ -n "$scount_re" ]; then
  n=$(grep -Ec -- "$scount_re" "$work/server.out")
  [ "$n" -ge "$scount_n" ] || { echo "FAIL: server has $n lines /$scount_re/, want >= $scount_n"; fail=1; }
fi
check_foreign "$work/server.out" "$work/client.out" || fail=1
if [ "$daemon" = 1 ]; then
  stop_daemon "$dpid" "$work/daemon.out" || fail=1
  dpid=
fi
exit "$fail"
