#!/usr/bin/env bash
# SOFTRNIC_* configuration through unmodified tools: good values take effect, a bad value
# makes the open fail with a message naming the variable, and SOFTRNIC_PCAP writes a
# capture that tshark decodes as RoCE with nothing malformed. Needs SOFTRNIC_SHIM_DIR.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
launcher="$here/../../scripts/softrnic"
launch="$here/launch.sh"  # scripts/softrnic run (+ the ASan runtime in the asan build)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export SOFTRNIC_RUNTIME_DIR="$work/rt"
fail=0
# Read, then unset: the shim would warn about this SOFTRNIC_* name (unknown_var_once counts).
fault_injection=${SOFTRNIC_TEST_FAULT_INJECTION:-true}
unset SOFTRNIC_TEST_FAULT_INJECTION
run() { timeout -k 5 30 "$launch" -- "$@"; }

check() {  # name, expected-exit (0|nz), regex, env assignment..., -- cmd...
  local name=$1 want=$2 re=$3; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local out rc
  out=$(env "${envs[@]}" timeout -k 5 30 "$launch" -- "$@" 2>&1)
  rc=$?
  local ok=1
  if [ "$want" = 0 ]; then [ "$rc" -eq 0 ] || ok=0; else [ "$rc" -ne 0 ] || ok=0; fi
  grep -Eq -- "$re" <<<"$out" || ok=0
  if [ "$ok" = 1 ]; then echo "ok   $name"; else echo "FAIL $name (exit $rc)"; echo "$out" | tail -5; fail=1; fi
}

check bad_mtu nz 'SOFTRNIC_MTU' SOFTRNIC_MTU=1000 -- ibv_devinfo
check bad_ip nz 'SOFTRNIC_IP' SOFTRNIC_IP=300.1.2.3 -- ibv_devinfo
check bad_log nz 'SOFTRNIC_LOG' SOFTRNIC_LOG=loud -- ibv_devinfo
check bad_faults nz 'SOFTRNIC_FAULTS' SOFTRNIC_FAULTS='not a rule' -- ibv_devinfo
check bad_pcap nz 'SOFTRNIC_PCAP' SOFTRNIC_PCAP=/nonexistent/dir/x.pcap -- ibv_devinfo
check bad_name_lists_nothing 0 'SOFTRNIC_NAME' 'SOFTRNIC_NAME=bad name!' -- ibv_devices
check name 0 'mydev0' SOFTRNIC_NAME=mydev0 -- ibv_devices
check ip 0 'GID\[  0\]:.*::ffff:127\.0\.0\.77, RoCE v2' SOFTRNIC_IP=127.0.0.77 -- ibv_devinfo -v
check mtu 0 'active_mtu:[[:space:]]+1024' SOFTRNIC_MTU=1024 -- ibv_devinfo
# base/config.h through the shim: an unknown SOFTRNIC_* name warns once naming the closest
# (even at the default threshold), not with SOFTRNIC_LOG=off; keyword values fold case;
# SOFTRNIC_LOG_FILE takes the log lines off stderr; a leading-zero seed is decimal.
check unknown_var 0 'warn: unknown variable SOFTRNIC_FAULT \(did you mean SOFTRNIC_FAULTS\?\)' \
  SOFTRNIC_FAULT=x -- ibv_devinfo
out=$(SOFTRNIC_FAULT=x SOFTRNIC_LOG=off timeout -k 5 30 "$launch" -- ibv_devinfo 2>&1)
if [ $? -eq 0 ] && ! grep -q 'unknown variable' <<<"$out"; then echo "ok   unknown_var_off"
else echo "FAIL unknown_var_off"; echo "$out" | tail -5; fail=1; fi
n=$(SOFTRNIC_FAULT=x timeout -k 5 30 "$launch" -- ibv_devinfo 2>&1 >/dev/null | grep -c 'unknown variable')
if [ "$n" = 1 ]; then echo "ok   unknown_var_once"; else echo "FAIL unknown_var_once ($n lines)"; fail=1; fi
check case_fold 0 'info: device softrnic0 on' SOFTRNIC_LOG=INFO SOFTRNIC_CONTROL=Off -- ibv_devinfo
check seed_leading_zero 0 'hca_id' SOFTRNIC_FAULT_SEED=010 -- ibv_devinfo
check bad_seed nz 'SOFTRNIC_FAULT_SEED' SOFTRNIC_FAULT_SEED=0o17 -- ibv_devinfo
err=$(SOFTRNIC_LOG=info SOFTRNIC_LOG_FILE="$work/shim.log" timeout -k 5 30 "$launch" -- ibv_devinfo 2>&1 >/dev/null)
if grep -q 'info: device softrnic0 on' "$work/shim.log" 2>/dev/null && ! grep -q 'device softrnic0' <<<"$err"; then
  echo "ok   log_file"
else echo "FAIL log_file: stderr='$err' file='$(cat "$work/shim.log" 2>/dev/null)'"; fail=1; fi

# Built with -Dfault_injection=false (meson passes SOFTRNIC_TEST_FAULT_INJECTION=false): capture
# rides on the compiled-out packet hook, so SOFTRNIC_PCAP must be refused (never an empty file);
# the ping-pong capture below cannot run: exit 77 (a skip) when everything above passed.
if [ "$fault_injection" = false ]; then
  check pcap_refused_nofault nz 'SOFTRNIC_PCAP: capture needs the packet hook' \
    SOFTRNIC_PCAP="$work/x.pcap" -- ibv_devinfo
  [ ! -e "$work/x.pcap" ] || { echo "FAIL pcap_refused_nofault: $work/x.pcap was created"; fail=1; }
  [ "$fail" = 0 ] || exit 1
  echo "SKIP pcap pingpong: fault injection (the packet hook) is compiled out (-Dfault_injection=false)"
  exit 77
fi

# SOFTRNIC_PCAP on both sides of an RC ping-pong; tshark must decode every packet as RoCE,
# none malformed (ICRC values themselves are checked by the wire tests).
command -v tshark >/dev/null || { echo "FAIL tshark is not installed (scripts/setup installs it)"; fail=1; }
port=19690
SOFTRNIC_PCAP="$work/srv.pcap" timeout -k 5 60 "$launch" -- ibv_rc_pingpong -g 0 -n 20 -p $port >"$work/s.out" 2>&1 &
spid=$!
listening=0
for _ in $(seq 1 200); do
  ss -Hltn "sport = :$port" | grep -q . && { listening=1; break; }
  kill -0 $spid 2>/dev/null || break
  sleep 0.1
done
[ "$listening" = 1 ] || { echo "FAIL pcap pingpong: the server never listened on TCP port $port (20 s)"; fail=1; }
SOFTRNIC_PCAP="$work/cli-%p.pcap" timeout -k 5 60 "$launch" -- ibv_rc_pingpong -g 0 -n 20 -p $port 127.0.0.1 >"$work/c.out" 2>&1
crc=$?
wait $spid
src=$?
if [ $crc -ne 0 ] || [ $src -ne 0 ]; then echo "FAIL pcap pingpong (exit $src/$crc)"; cat "$work/s.out" "$work/c.out"; fail=1; fi
for f in "$work/srv.pcap" "$work"/cli-*.pcap; do
  [ -s "$f" ] || { echo "FAIL pcap: $f missing or empty"; fail=1; continue; }
  total=$(tshark -r "$f" 2>/dev/null | wc -l)
  roce=$(tshark -r "$f" -Y infiniband 2>/dev/null | wc -l)
  bad=$(tshark -n -r "$f" --disable-protocol rpcordma \
          -Y '_ws.malformed || _ws.expert.severity >= error || !infiniband' 2>/dev/null | wc -l)
  if [ "$total" -gt 40 ] && [ "$roce" -eq "$total" ] && [ "$bad" -eq 0 ]; then
    echo "ok   pcap $(basename "$f"): $total packets, all RoCE, none malformed"
  else
    echo "FAIL pcap $(basename "$f"): total=$total roce=$roce malformed=$bad"; fail=1
  fi
done
exit $fail
