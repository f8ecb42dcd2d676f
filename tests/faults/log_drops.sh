#!/usr/bin/env bash
# SOFTRNIC_LOG=debug explains every dropped packet (issue 9): unmodified ib_write_bw, the
# client's fault plan sends the server one WRITE with a bad ICRC, one with its BTH QPN
# rewritten to a QP that does not exist, and later one with a wrong rkey (ICRC fixed). The
# server's stderr must name each drop once (reason, source, QPN, opcode, PSN, counter), and its
# stdout must carry no softrnic log line (the libraries never print to stdout).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# Each rule fires once; the ICRC and QPN faults are recovered by RC retransmission, the rkey
# fault kills the connection (the client fails with status 10, as in rkey_rewrite.sh).
plan='dir=tx class=write nth=5 => corrupt(icrc);
dir=tx class=write nth=20 => rewrite(qpn ^= 0x800000, fix);
dir=tx class=write nth=150 => rewrite(rkey ^= 0x80, fix)'
port=${FAULTS_PORT:-19850}
bw=(ib_write_bw -d softrnic0 -x 0 -F -s 1024 -n 400)
echo "client plan: $plan"

# The server with stdout and stderr kept apart (lib.sh's start_server merges them), launched
# as lib.sh launches (tests/shim/launch.sh where lib.sh names it, else scripts/softrnic run).
run_prog=("$launcher" run)
[ -n "${launch:-}" ] && run_prog=("$launch")
SOFTRNIC_LOG=debug timeout -k 3 40 "${run_prog[@]}" -- "${bw[@]}" -p "$port" \
  >"$work/srv.stdout" 2>"$work/srv.stderr" &
spid=$!
bg_pids+=("$spid")
listening=0
for _ in $(seq 1 100); do
  ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && { listening=1; break; }
  kill -0 "$spid" 2>/dev/null || break
  sleep 0.1
done
[ "$listening" = 1 ] || bad "server did not listen on $port"
run_client cli 30 $port SOFTRNIC_FAULTS="$plan" SOFTRNIC_FAULT_TRACE="$work/trace" -- "${bw[@]}"
for _ in $(seq 1 50); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
kill "$spid" 2>/dev/null; wait "$spid"; src=$?
echo "client exit $crc after $csecs s; server exit $src"
echo "---- client fault trace"; cat "$work/trace" 2>/dev/null
echo "---- server stderr (softrnic lines)"; grep 'softrnic\[' "$work/srv.stderr" | head -40

# The faults fired (else the test proves nothing).
for f in 'corrupt(icrc' 'rewrite(qpn' 'rewrite(rkey'; do
  grep -qF "$f" "$work/trace" 2>/dev/null && ok "client trace shows $f" \
    || bad "client trace shows no $f (the fault did not fire)"
done
[ "$crc" -ne 0 ] && [ "$crc" -ne 124 ] && [ "$crc" -ne 137 ] \
  && ok "client failed (exit $crc) on the wrong rkey" || bad "client exit $crc"

# Each drop named exactly once, with source ip:port, QPN, opcode, PSN and counter.
src_re='from [0-9.]+:[0-9]+ to qpn 0x[0-9a-f]+ op RC_RDMA_WRITE_[A-Z_]+ psn [0-9]+'
check_once() {  # what, regex
  local n
  n=$(grep -Ec "softrnic\[[0-9]+\] warn: $2" "$work/srv.stderr")
  if [ "$n" -eq 1 ]; then
    ok "server stderr names the $1 once: $(grep -Em1 "$2" "$work/srv.stderr")"
  else
    bad "server stderr has $n lines for the $1 (want 1)"
  fi
}
check_once "bad ICRC" "drop: bad ICRC $src_re \\(icrc_err\\)"
check_once "unknown QPN" "drop: unknown QPN $src_re \\(drop_unknown_qpn\\)"
check_once "wrong rkey" "nak: WRITE refused by rkey check: BAD_KEY $src_re \\(rem_access_nak_sent\\)"

# stdout: perftest's own report, but no softrnic line.
[ -s "$work/srv.stdout" ] && ok "server stdout has perftest's output ($(wc -l <"$work/srv.stdout") lines)" \
  || bad "server stdout is empty (wrong stream captured?)"
if grep -Eq 'softrnic\[[0-9]+\] [a-z]+:' "$work/srv.stdout"; then
  bad "server stdout carries softrnic log lines: $(grep -Em1 'softrnic\[' "$work/srv.stdout")"
else
  ok "server stdout has no softrnic log line"
fi
[ "$fail" = 0 ] || { echo "---- server stdout"; tail -20 "$work/srv.stdout"; show cli; }
exit $fail
