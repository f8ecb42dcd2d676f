#!/usr/bin/env bash
# A fault rule on the client that flips bit 7 of the R_Key of every RDMA WRITE it sends (ICRC
# fixed, so the packet is well formed): the responder's rkey check refuses it, the client gets
# a remote access error (perftest: "Failed status 10") and exits non-zero promptly, not hang.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
plan='dir=tx class=write => rewrite(rkey ^= 0x80, fix)'
port=${FAULTS_PORT:-19810}
bw=(ib_write_bw -d softrnic0 -x 0 -F -n 200)
echo "client plan: $plan"
start_server srv 40 $port -- "${bw[@]}" || bad "server did not listen"
start_client cli 30 $port SOFTRNIC_FAULTS="$plan" SOFTRNIC_FAULT_TRACE="$work/trace" -- "${bw[@]}"
t0=$SECONDS
sample_stats "$work/st" "$cpid"
wait "$cpid"; crc=$?
secs=$((SECONDS - t0))
wait "$sampler"
# The server may wait for a peer that has gone; give it a moment, then stop it.
for _ in $(seq 1 50); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
kill "$spid" 2>/dev/null; wait "$spid"; src=$?
echo "client exit $crc after $secs s; server exit $src"
show cli
if [ "$crc" -ne 0 ] && [ "$crc" -ne 124 ] && [ "$crc" -ne 137 ]; then
  ok "ib_write_bw client failed (exit $crc) instead of completing"
else
  bad "client exit $crc (0 = the bad rkey went unnoticed, 124/137 = hung until the timeout)"
fi
[ "$secs" -le 15 ] && ok "client gave up within $secs s" || bad "client took $secs s"
grep -Eiq 'status 10|REM_ACCESS' "$work/cli.out" \
  && ok "client reports a remote access error: $(grep -Eim1 'status 10|REM_ACCESS' "$work/cli.out")" \
  || bad "client output does not mention status 10 / REM_ACCESS_ERR"
# The client's fault trace records the rewrites (written as they fire).
nrw=$(grep -c 'RC_RDMA_WRITE.*rewrite(rkey' "$work/trace" 2>/dev/null)
[ "${nrw:-0}" -gt 0 ] && ok "client trace: $nrw WRITE(s) with a rewritten rkey, first: $(head -1 "$work/trace")" \
  || bad "client trace shows no rkey rewrite"
for f in "$work"/st.*; do
  [ -f "$f" ] || continue
  echo "stats pid $(basename "$f" | cut -d. -f2): fault_rewritten=$(stat "$f" fault_rewritten)" \
       "rem_access_nak_sent=$(stat "$f" rem_access_nak_sent) rem_access_nak_rcvd=$(stat "$f" rem_access_nak_rcvd)"
done
exit $fail
