#!/usr/bin/env bash
# Conformance pair: runs an unmodified RDMA tool as server and client (two processes on
# loopback, each with its own softrnic device) through scripts/softrnic, with timeouts.
# Passes when both exit 0, the client's output matches --expect and the server's matches
# --server-expect (default for both: any output; one-sided tests print only on the client).
#   pair.sh [--preload] [--daemon] [--expect RE] [--server-expect RE] [--stats-expect RE]
#           [--timeout S] PORT -- TOOL [ARGS...]
# --stats-expect (repeatable): a line of either device's counters at exit (SOFTRNIC_STATS_AT_EXIT)
# must match RE, e.g. '^one_copy_rx [1-9]'.
# --daemon: one softrnicd (SOFTRNICD, its own runtime dir) hosts the device of both processes
# (SOFTRNIC_HOSTING=daemon): they must then report the same local GID.
# The server runs "TOOL ARGS -p PORT", the client "TOOL ARGS -p PORT 127.0.0.1".
# Needs SOFTRNIC_SHIM_DIR (the directory holding the built libibverbs.so.1).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
launcher="$here/../../scripts/softrnic"
launch="$here/launch.sh"  # scripts/softrnic run (+ the ASan runtime in the asan build)
. "$here/output_checks.sh"
mode=()
daemon=0
expect='.'
sexpect='.'
stats_expect=()
tmo=60
while [ $# -gt 0 ]; do
  case "$1" in
    --preload) mode=(--preload); shift ;;
    --daemon) daemon=1; shift ;;
    --expect) expect="$2"; shift 2 ;;
    --server-expect) sexpect="$2"; shift 2 ;;
    --timeout) tmo="$2"; shift 2 ;;
    --stats-expect) stats_expect+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
port="$1"; shift
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: pair.sh [--preload] [--expect RE] PORT -- TOOL ARGS" >&2; exit 2; }

work="$(mktemp -d)"
dpid=
trap '[ -n "$dpid" ] && kill "$dpid" 2>/dev/null; rm -rf "$work"' EXIT

if [ "${#stats_expect[@]}" -gt 0 ]; then
  export SOFTRNIC_STATS_AT_EXIT="$work/stats.%p"
fi
# Each test gets its own runtime dir so generated sysfs trees never race.
export SOFTRNIC_RUNTIME_DIR="$work/rt"
if [ "$daemon" = 1 ]; then
  mkdir -m 700 "$SOFTRNIC_RUNTIME_DIR"
  "${SOFTRNICD:?SOFTRNICD: the softrnicd binary}" --foreground --runtime-dir "$SOFTRNIC_RUNTIME_DIR" \
    >"$work/daemon.out" 2>&1 &
  dpid=$!
  for _ in $(seq 1 100); do [ -S "$SOFTRNIC_RUNTIME_DIR/softrnicd.sock" ] && break; sleep 0.05; done
  [ -S "$SOFTRNIC_RUNTIME_DIR/softrnicd.sock" ] || { echo "FAIL: softrnicd did not start"; cat "$work/daemon.out"; exit 1; }
  export SOFTRNIC_HOSTING=daemon
fi

# One run of the pair: sets listening, src and crc, prints both outputs.
run_pair() {
  timeout -k 5 "$tmo" "$launch" "${mode[@]}" -- "$@" -p "$port" >"$work/server.out" 2>&1 &
  spid=$!
  # Wait (bounded: 20 s) until the server listens on its TCP port, or died.
  listening=0
  for _ in $(seq 1 200); do
    if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then listening=1; break; fi
    kill -0 "$spid" 2>/dev/null || break
    sleep 0.1
  done
  [ "$listening" = 1 ] || echo "FAIL: the server never listened on TCP port $port (20 s)"
  timeout -k 5 "$tmo" "$launch" "${mode[@]}" -- "$@" -p "$port" 127.0.0.1 >"$work/client.out" 2>&1
  crc=$?
  wait "$spid"
  src=$?

  echo "== server: $* -p $port (exit $src)"
  cat "$work/server.out"
  echo "== client: $* -p $port 127.0.0.1 (exit $crc)"
  cat "$work/client.out"
}
run_pair "$@"
# perftest's failed clock calibration (output_checks.sh): once more, and the second run is
# judged as usual.
if calibration_failed "$work/server.out" "$work/client.out" "$expect" "$sexpect"; then
  echo "== perftest's clock calibration failed and the output lacks what is expected: running the pair again"
  rm -f "$work"/stats.*
  run_pair "$@"
fi

fail=0
[ "$listening" = 1 ] || fail=1
if [ "$daemon" = 1 ]; then
  # One device: both sides' local GIDs (ibverbs-utils "local address: ... GID ::ffff:a.b.c.d",
  # ibv_xsrq_pingpong "local: ... GID ...", perftest "local address: ..." with "GID: 00:00:..."
  # on the next line) are the daemon's address.
  lgid() { grep -m1 -iE -A1 'local address|^ *local:' "$1" | grep -oiE 'GID:? *[0-9a-f:.]+' | head -1; }
  sg="$(lgid "$work/server.out")"; cg="$(lgid "$work/client.out")"
  echo "== daemon: server $sg, client $cg"
  if [ -z "$sg" ] || [ "$sg" != "$cg" ]; then echo "FAIL: not one device (local GIDs '$sg' / '$cg')"; fail=1; fi
  stop_daemon "$dpid" "$work/daemon.out" || fail=1
  dpid=
fi
check_run server "$src" "$work/server.out" "$sexpect" || fail=1
check_run client "$crc" "$work/client.out" "$expect" || fail=1
check_foreign "$work/server.out" "$work/client.out" || fail=1
for re in "${stats_expect[@]}"; do
  # grep reads the files itself: `cat | grep -q` fails under pipefail when grep stops early.
  if grep -hqE "$re" "$work"/stats.* 2>/dev/null; then
    echo "== counters: $(grep -hE "$re" "$work"/stats.* | tr '\n' ' ')"
  else
    echo "FAIL: no device counter matches '$re'"
    cat "$work"/stats.* 2>/dev/null | grep -v ' 0$'
    fail=1
  fi
done
exit "$fail"
