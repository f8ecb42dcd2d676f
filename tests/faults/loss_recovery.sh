#!/usr/bin/env bash
# Unmodified ib_write_bw (64 KiB, 300 iterations) under 2% random loss in both directions
# (fault engine, 'dir=rx p=2% => drop' on both devices, fixed seeds) completes, and the
# requester's counters show no retransmission storm: it sent less than 2x the packets it
# needed (retransmitted < needed). Go-back-N over a fixed 512-PSN window sent about 10x
# (docs/congestion.md §3). Also: retrans_bytes moved with retrans_pkts, the responder's stash
# replayed packets (docs/congestion.md §2). Counters are the final ones each device writes at
# close (SOFTRNIC_STATS_AT_EXIT): a sampler of the control sockets can miss the end of the
# run (asan: the last sample held 9 of the drops and none of the replays).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
plan='dir=rx p=2% => drop'
port=${FAULTS_PORT:-19860}
pt='^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+'
echo "plan: $plan  seeds 7 (server) / 8 (client)"
bw=(ib_write_bw -d softrnic0 -x 0 -F -s 65536 -n 300)
final="SOFTRNIC_STATS_AT_EXIT=$work/st.%p"
start_server srv 150 $port SOFTRNIC_FAULTS="$plan" SOFTRNIC_FAULT_SEED=7 "$final" -- "${bw[@]}" \
  || bad "ib_write_bw server did not listen"
start_client cli 150 $port SOFTRNIC_FAULTS="$plan" SOFTRNIC_FAULT_SEED=8 "$final" -- "${bw[@]}"
t0=$SECONDS
wait "$cpid"; crc=$?
wait "$spid"; src=$?
echo "ib_write_bw: client exit $crc, server exit $src, $((SECONDS - t0)) s"
[ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && ok "ib_write_bw exits 0 on both sides under 2% loss" \
  || { bad "ib_write_bw exit client=$crc server=$src"; show srv cli; }
grep -Eq "$pt" "$work/cli.out" && ok "result row: $(grep -E "$pt" "$work/cli.out" | head -1 | tr -s ' ')" \
  || bad "ib_write_bw printed no result row"

# The requester is the device that sent the most packets.
best="" bestv=-1 dropped=0 replayed=0
for f in "$work"/st.*; do
  [ -f "$f" ] || continue
  v=$(stat "$f" sent_pkts)
  [ "$v" -gt "$bestv" ] && { bestv=$v; best=$f; }
  dropped=$((dropped + $(stat "$f" fault_dropped)))
  replayed=$((replayed + $(stat "$f" stash_replayed)))
done
n=$(ls "$work"/st.* 2>/dev/null | wc -l)
[ "$n" -eq 2 ] && ok "both devices wrote their final counters at close" \
  || bad "$n final counter files (SOFTRNIC_STATS_AT_EXIT), want 2"
[ -n "$best" ] || exit 1
sent=$(stat "$best" sent_pkts); re=$(stat "$best" retrans_pkts); rb=$(stat "$best" retrans_bytes)
cuts=$(stat "$best" window_cuts); probes=$(stat "$best" retrans_probes)
need=$((sent - re))
echo "requester: sent_pkts=$sent retrans_pkts=$re retrans_bytes=$rb window_cuts=$cuts" \
     "retrans_probes=$probes local_ack_timeout_err=$(stat "$best" local_ack_timeout_err);" \
     "both devices: fault_dropped=$dropped"
[ "$dropped" -gt 0 ] && ok "faults fired: $dropped packets dropped" || bad "no packet was dropped"
[ "$re" -gt 0 ] && [ "$rb" -ge $((re * 28)) ] && ok "retransmissions counted: $re packets, $rb bytes" \
  || bad "retransmission counters: retrans_pkts=$re retrans_bytes=$rb"
# Recovered by the responder's stash (one resend per loss) or by go-backs (which cut).
[ "$replayed" -gt 0 ] && ok "the responder replayed $replayed stashed packets (window cut $cuts times)" \
  || bad "no stashed packet replayed under loss (stash_replayed=$replayed, window_cuts=$cuts)"
if [ "$need" -gt 0 ] && [ "$re" -lt "$need" ]; then
  ok "no storm: retransmitted $re < needed $need ($(awk -v s="$sent" -v n="$need" 'BEGIN { printf "%.2f", s / n }')x sent/needed)"
else
  bad "retransmission storm: retransmitted $re packets for $need needed"
fi
exit $fail
