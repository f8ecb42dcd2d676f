#!/usr/bin/env bash
# Conformance pair: runs an unmodified RDMA tool as server and client (two processes on
# loopback, each with its own softrnic device) through scripts/softrnic, with timeouts.
# Passes when both exit 0, the client's output matches --expect and the server's matches
# --server-expect (default for both: any output; one-sided tests print only on the client).
#   pair.sh [--preload] [--expect RE] [--server-expect RE] [--timeout S] PORT -- TOOL [ARGS...]
# The server runs "TOOL ARGS -p PORT", the client "TOOL ARGS -p PORT 127.0.0.1".
# Needs SOFTRNIC_SHIM_DIR (the directory holding the built libibverbs.so.1).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
launcher="$here/../../scripts/softrnic"
launch="$here/launch.sh"  # scripts/softrnic run (+ the ASan runtime in the asan build)
. "$here/output_checks.sh"
mode=()
expect='.'
sexpect='.'
tmo=60
while [ $# -gt 0 ]; do
  case "$1" in
    --preload) mode=(--preload); shift ;;
    --expect) expect="$2"; shift 2 ;;
    --server-expect) sexpect="$2"; shift 2 ;;
    --timeout) tmo="$2"; shift 2 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
port="$1"; shift
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: pair.sh [--preload] [--expect RE] PORT -- TOOL ARGS" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Each test gets its own runtime dir so generated sysfs trees never race.
export SOFTRNIC_RUNTIME_DIR="$work/rt"

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

fail=0
[ "$listening" = 1 ] || fail=1
check_run server "$src" "$work/server.out" "$sexpect" || fail=1
check_run client "$crc" "$work/client.out" "$expect" || fail=1
check_foreign "$work/server.out" "$work/client.out" || fail=1
exit "$fail"
