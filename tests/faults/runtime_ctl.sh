#!/usr/bin/env bash
# `softrnic fault add|list|clear` (softrnic-ctl through the control socket) against a running
# ibv_rc_pingpong server that started with no fault plan: a drop rule added to the server's
# device makes the client's packets vanish (retransmit timers fire, list shows the rule
# firing); after `fault clear` the list is empty, no more packets are dropped, and both sides
# complete with validated buffers. The rule goes in before the client connects, so the client
# runs under it however fast the machine is.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
softrnic() { SOFTRNIC_CTL="$SOFTRNIC_CTL" "$launcher" "$@"; }
port=${FAULTS_PORT:-19840}
# 30000 iterations: each softrnic-ctl call below costs ~0.3 s in the asan build, and with 8000
# the client once finished before the first sample after the clear (asan CI).
pp=(ibv_rc_pingpong -g 0 -c -s 4096 -n 30000)
start_server srv 120 $port -- "${pp[@]}" || bad "server did not listen"
srv_pid=$(pgrep -P "$spid" | head -1)
sock="$SOFTRNIC_RUNTIME_DIR/softrnic0.$srv_pid.sock"
for _ in $(seq 1 50); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] && ok "server pid $srv_pid has control socket $(basename "$sock")" || bad "no socket $sock"
sel=(--pid "$srv_pid")

out=$(softrnic fault list "${sel[@]}" 2>&1); rc=$?
[ $rc -eq 0 ] && [ -z "$out" ] && ok "fault list: empty at start" || bad "fault list at start (rc $rc): $out"
rule='dir=rx p=5% => drop'
out=$(softrnic fault "${sel[@]}" add "$rule" 2>&1) && ok "fault add '$rule': $out" || bad "fault add: $out"
out=$(softrnic fault "${sel[@]}" add 'dir=rx => frobnicate' 2>&1) \
  && bad "a bad rule was accepted: $out" \
  || { grep -q frobnicate <<<"$out" && ok "bad rule refused: $out" || bad "bad rule: $out"; }

start_client cli 120 $port -- "${pp[@]}"
cli_pid=""
for _ in $(seq 1 50); do
  cli_pid=$(pgrep -P "$cpid" | head -1); [ -n "$cli_pid" ] && break; sleep 0.1
done
[ -n "$cli_pid" ] || bad "the client process did not start within 5 s"
fired=0
for _ in $(seq 1 300); do
  fired=$(softrnic fault list "${sel[@]}" 2>/dev/null | sed -n 's/.*fired=\([0-9]*\).*/\1/p' | head -1)
  [ "${fired:-0}" -ge 5 ] && break
  kill -0 "$cpid" 2>/dev/null || break
  sleep 0.1
done
echo "fault list: $(softrnic fault list "${sel[@]}" 2>&1)"
[ "${fired:-0}" -ge 5 ] && ok "rule fired $fired times while the client ran" || bad "rule fired ${fired:-0} times"
softrnic stats "${sel[@]}" >"$work/srv_mid" 2>&1
softrnic stats --pid "$cli_pid" >"$work/cli_mid" 2>&1
kill -0 "$cpid" 2>/dev/null && ok "client still running before clear" || bad "client ended before clear"
timeouts=$(stat "$work/cli_mid" local_ack_timeout_err)
echo "client mid-run: local_ack_timeout_err=$timeouts retrans_pkts=$(stat "$work/cli_mid" retrans_pkts)" \
     "sent_pkts=$(stat "$work/cli_mid" sent_pkts); server: fault_dropped=$(stat "$work/srv_mid" fault_dropped)" \
     "local_ack_timeout_err=$(stat "$work/srv_mid" local_ack_timeout_err) duplicate_request=$(stat "$work/srv_mid" duplicate_request)"
retries=$(( timeouts + $(stat "$work/srv_mid" local_ack_timeout_err) + $(stat "$work/cli_mid" rcvd_seq_err) ))
[ "$retries" -gt 0 ] && ok "retries under the rule: client local_ack_timeout_err=$timeouts (+ server side: $retries in all)" \
  || bad "no retransmit timer fired under the drop rule"

out=$(softrnic fault clear "${sel[@]}" 2>&1) && ok "fault clear" || bad "fault clear: $out"
out=$(softrnic fault list "${sel[@]}" 2>&1)
[ -z "$out" ] && ok "fault list: empty after clear" || bad "fault list after clear: $out"
# Sample the server's fault_dropped (once right after the clear, then until it exits): the
# first and last sample must agree while more packets arrived. One sample after the first is
# enough evidence; a fast machine may finish the run before a second.
st=$(softrnic stats "${sel[@]}" 2>/dev/null)
d1=$(awk '$1 == "fault_dropped" { print $2 }' <<<"$st")
s1=$(awk '$1 == "rcvd_pkts" { print $2 }' <<<"$st")
d2=""; s2=""; nsamp=0
while kill -0 "$spid" 2>/dev/null; do
  st=$(softrnic stats "${sel[@]}" 2>/dev/null) || break
  d=$(awk '$1 == "fault_dropped" { print $2 }' <<<"$st"); [ -n "$d" ] || break
  d2=$d; s2=$(awk '$1 == "rcvd_pkts" { print $2 }' <<<"$st"); nsamp=$((nsamp + 1))
  sleep 0.01
done
echo "after clear: server fault_dropped $d1 -> $d2, rcvd_pkts $s1 -> $s2 ($nsamp samples)"
if [ -n "$d1" ] && [ -n "$d2" ] && [ "$nsamp" -ge 1 ] && [ "${s2:-0}" -gt "${s1:-0}" ]; then
  [ "$d1" = "$d2" ] && ok "no drops after clear while $((s2 - s1)) more packets arrived" \
    || bad "drops continued after clear ($d1 -> $d2)"
else
  bad "could not watch the server after clear (samples: $nsamp)"
fi
t0=$SECONDS
wait "$cpid"; crc=$?
wait "$spid"; src=$?
echo "client exit $crc, server exit $src ($((SECONDS - t0)) s after clear)"
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'iters in' "$work/cli.out" \
   && grep -q 'iters in' "$work/srv.out"; then
  ok "completed and validated after clear: $(grep 'iters in' "$work/cli.out")"
else
  bad "rc_pingpong did not complete after clear"; show srv cli
fi
exit $fail
