#!/usr/bin/env bash
# Unmodified perftest and ibverbs-utils under 2% drop + 1% duplicate (both devices, tx, fixed
# seed): ib_write_bw completes on both sides, ibv_rc_pingpong -c validates its buffers, and
# the counters each device writes at close (SOFTRNIC_STATS_AT_EXIT) show faults firing and the RC
# retransmission machinery at work (sequence NAKs / go-back-N retries / duplicates).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
plan='dir=tx p=2% => drop; dir=tx p=1% => dup'
envs=(SOFTRNIC_FAULTS="$plan" SOFTRNIC_FAULT_SEED=42)
port=${FAULTS_PORT:-19800}
pt='^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+'

echo "plan: $plan  seed 42"
bw=(ib_write_bw -d softrnic0 -x 0 -F -s 65536 -n 1000)
final=SOFTRNIC_STATS_AT_EXIT="$work/st.%p"
start_server wbw_srv 90 $port "${envs[@]}" "$final" -- "${bw[@]}" || bad "ib_write_bw server did not listen"
start_client wbw_cli 90 $port "${envs[@]}" "$final" -- "${bw[@]}"
t0=$SECONDS
wait "$cpid"; crc=$?
wait "$spid"; src=$?
echo "ib_write_bw: client exit $crc, server exit $src, $((SECONDS - t0)) s"
[ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && ok "ib_write_bw exits 0 on both sides" \
  || { bad "ib_write_bw exit client=$crc server=$src"; show wbw_srv wbw_cli; }
grep -Eq "$pt" "$work/wbw_cli.out" && ok "ib_write_bw result row: $(grep -E "$pt" "$work/wbw_cli.out" | head -1 | tr -s ' ')" \
  || bad "ib_write_bw printed no result row"

# Counters: the final counters of both devices (largest value per counter).
names=(fault_dropped fault_duplicated sent_pkts rcvd_seq_err completer_retry_err retrans_pkts
       local_ack_timeout_err out_of_seq_request duplicate_request naks_sent rdma_sends rdma_recvs)
declare -A mx
nfiles=0
for f in "$work"/st.*; do
  [ -f "$f" ] || continue
  nfiles=$((nfiles + 1))
  line="device pid $(basename "$f" | cut -d. -f2):"
  for n in "${names[@]}"; do
    v=$(stat "$f" "$n"); line+=" $n=$v"
    [ "${mx[$n]:-0}" -lt "$v" ] && mx[$n]=$v
  done
  echo "$line"
done
[ "$nfiles" -eq 2 ] && ok "both devices wrote their final counters at close" \
  || bad "$nfiles final counter files (SOFTRNIC_STATS_AT_EXIT), want 2"
[ "${mx[fault_dropped]:-0}" -gt 0 ] && [ "${mx[fault_duplicated]:-0}" -gt 0 ] \
  && ok "faults fired: dropped=${mx[fault_dropped]} duplicated=${mx[fault_duplicated]}" \
  || bad "fault counters did not move: dropped=${mx[fault_dropped]:-0} duplicated=${mx[fault_duplicated]:-0}"
recov=$(( ${mx[rcvd_seq_err]:-0} + ${mx[completer_retry_err]:-0} ))
[ "$recov" -gt 0 ] && [ "${mx[retrans_pkts]:-0}" -gt 0 ] && ok "retransmission seen: rcvd_seq_err=${mx[rcvd_seq_err]:-0} completer_retry_err=${mx[completer_retry_err]:-0} retrans_pkts=${mx[retrans_pkts]:-0}" \
  || bad "retransmission counters: rcvd_seq_err=${mx[rcvd_seq_err]:-0} completer_retry_err=${mx[completer_retry_err]:-0} retrans_pkts=${mx[retrans_pkts]:-0}"
[ "${mx[out_of_seq_request]:-0}" -gt 0 ] && [ "${mx[duplicate_request]:-0}" -gt 0 ] \
  && ok "responder saw gaps and duplicates: out_of_seq_request=${mx[out_of_seq_request]} duplicate_request=${mx[duplicate_request]}" \
  || bad "responder counters: out_of_seq_request=${mx[out_of_seq_request]:-0} duplicate_request=${mx[duplicate_request]:-0}"

# Data correctness: ibv_rc_pingpong -c checks every received buffer. Its drops hit SENDs only:
# the program has no closing handshake, so the side whose last receive completes destroys
# its QP and exits, and if the fault engine ate that side's final ACK its peer's last SEND
# could only end in RETRY_EXC_ERR (as on hardware). Lost ACKs are ib_write_bw's part above.
port=$((port + 1))
pp=(ibv_rc_pingpong -g 0 -c -s 4096 -n 300)
pp_envs=(SOFTRNIC_FAULTS='dir=tx class=send p=2% => drop; dir=tx p=1% => dup' SOFTRNIC_FAULT_SEED=42)
start_server pp_srv 90 $port "${pp_envs[@]}" -- "${pp[@]}" || bad "rc_pingpong server did not listen"
run_client pp_cli 90 $port "${pp_envs[@]}" -- "${pp[@]}"
wait "$spid"; src=$?
echo "ibv_rc_pingpong -c: client exit $crc, server exit $src, ${csecs} s"
if [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && grep -q 'iters in' "$work/pp_cli.out" \
   && grep -q 'iters in' "$work/pp_srv.out"; then
  ok "ibv_rc_pingpong -c validated 300 x 4096 B both ways: $(grep 'iters in' "$work/pp_cli.out")"
else
  bad "ibv_rc_pingpong -c under drop+dup"; show pp_srv pp_cli
fi
exit $fail
