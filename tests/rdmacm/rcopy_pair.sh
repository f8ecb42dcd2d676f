#!/usr/bin/env bash
# rcopy over rsockets: the unmodified rcopy server (it serves forever) and client, two
# processes with their own devices on two free loopback addresses; the client copies a
# 3 MB random file to the server, which writes it; passes when the client exits 0 and the
# copy is byte-identical. The server is stopped afterwards.
#   rcopy_pair.sh [--timeout S]
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
launch="$here/../shim/launch.sh"
. "$here/../shim/output_checks.sh"
tmo=60
[ "${1:-}" = "--timeout" ] && { tmo="$2"; shift 2; }
pick_ip() {
  local ip
  for _ in $(seq 1 100); do
    ip="127.$((RANDOM % 64 + 64)).$((RANDOM % 256)).$((RANDOM % 250 + 2))"
    ss -Hlun "src $ip:4791" 2>/dev/null | grep -q . || { echo "$ip"; return; }
  done
  echo "127.0.0.253"
}
sip="$(pick_ip)"; cip="$(pick_ip)"
work="$(mktemp -d)"
spid=
trap '[ -n "$spid" ] && kill "$spid" 2>/dev/null; rm -rf "$work"' EXIT
export SOFTRNIC_RUNTIME_DIR="$work/rt"
head -c 3000000 /dev/urandom >"$work/src.bin"
port=$((7000 + RANDOM % 1000))
(cd "$work" && SOFTRNIC_IP="$sip" exec timeout -k 5 "$tmo" "$launch" -- rcopy -p "$port") >"$work/server.out" 2>&1 &
spid=$!
for _ in $(seq 1 200); do
  ss -Hlun "src $sip:4791" 2>/dev/null | grep -q . && break
  kill -0 "$spid" 2>/dev/null || break
  sleep 0.1
done
sleep 1
crc=1
for try in 1 2 3; do
  SOFTRNIC_IP="$cip" timeout -k 5 "$tmo" nice -n 5 "$launch" -- rcopy "$work/src.bin" "$sip:$work/dst.bin" -p "$port" \
    >"$work/client.out" 2>&1
  crc=$?
  [ "$crc" = 0 ] && break
  grep -q "Connection refused" "$work/client.out" || break
  echo "note: try $try: the server was not listening yet; trying again"
  sleep 2
done
# the server closes the file after the client's last byte: wait for it
for _ in $(seq 1 50); do grep -q "closing...done" "$work/server.out" && break; sleep 0.1; done
kill "$spid" 2>/dev/null
wait "$spid" 2>/dev/null
spid=
echo "== server ($sip): rcopy -p $port"; cat "$work/server.out"
echo "== client ($cip): rcopy src.bin $sip:dst.bin (exit $crc)"; cat "$work/client.out"
fail=0
check_run client "$crc" "$work/client.out" "bytes in" || fail=1
grep -q "3000000 bytes...closing...done" "$work/server.out" || { echo "FAIL: the server did not finish the file"; fail=1; }
cmp "$work/src.bin" "$work/dst.bin" || { echo "FAIL: the copy differs"; fail=1; }
check_foreign "$work/server.out" "$work/client.out" || fail=1
exit "$fail"
