#!/usr/bin/env bash
# ibv_rc_pingpong -c (checks every received buffer) under a reorder rule on both devices:
# 64 KiB messages (16 packets at MTU 4096), 1% of SEND packets held back until 3 more of the
# same QP have passed. Both sides complete and validate; stats show packets reordered and the
# responder seeing them out of sequence.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
plan='dir=tx class=send p=1% => reorder(3)'
# Final counters: each device writes them at close (a sampler can miss the end of the run).
envs=(SOFTRNIC_FAULTS="$plan" SOFTRNIC_FAULT_SEED=7 SOFTRNIC_STATS_AT_EXIT="$work/st.%p")
port=${FAULTS_PORT:-19830}
pp=(ibv_rc_pingpong -g 0 -c -s 65536 -n 200)
echo "plan: $plan  seed 7"
start_server srv 90 $port "${envs[@]}" -- "${pp[@]}" || bad "server did not listen"
start_client cli 90 $port "${envs[@]}" -- "${pp[@]}"
t0=$SECONDS
wait "$cpid"; crc=$?
wait "$spid"; src=$?
echo "client exit $crc, server exit $src, $((SECONDS - t0)) s"
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'iters in' "$work/cli.out" \
   && grep -q 'iters in' "$work/srv.out"; then
  ok "validated 200 x 64 KiB both ways: $(grep 'iters in' "$work/cli.out")"
else
  bad "ibv_rc_pingpong -c under reorder"; show srv cli
fi
reord=0; oos=0
for f in "$work"/st.*; do
  [ -f "$f" ] || continue
  r=$(stat "$f" fault_reordered); o=$(stat "$f" out_of_seq_request)
  echo "stats pid $(basename "$f" | cut -d. -f2): fault_reordered=$r out_of_seq_request=$o" \
       "duplicate_request=$(stat "$f" duplicate_request) rcvd_seq_err=$(stat "$f" rcvd_seq_err)" \
       "completer_retry_err=$(stat "$f" completer_retry_err) retrans_pkts=$(stat "$f" retrans_pkts)"
  reord=$((reord + r)); oos=$((oos + o))
done
[ "$reord" -gt 0 ] && [ "$oos" -gt 0 ] && ok "reordering happened: fault_reordered=$reord out_of_seq_request=$oos" \
  || bad "no reordering seen in stats (fault_reordered=$reord out_of_seq_request=$oos)"
exit $fail
