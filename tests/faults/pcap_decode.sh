#!/usr/bin/env bash
# SOFTRNIC_PCAP captures of perftest runs (ib_send_bw, ib_read_lat; both sides): tshark decodes
# every frame as InfiniBand (RoCEv2) with nothing malformed and no expert error, and
# pcap_icrc_check ($PCAP_ICRC_CHECK) parses every frame and verifies its ICRC.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
: "${PCAP_ICRC_CHECK:?PCAP_ICRC_CHECK must name the pcap_icrc_check tool}"
command -v tshark >/dev/null || bad "tshark is not installed (scripts/setup installs it): nothing can be decoded"
port=${FAULTS_PORT:-19820}
runs=("send_bw:ib_send_bw -d softrnic0 -x 0 -F -n 200"
      "read_lat:ib_read_lat -d softrnic0 -x 0 -F -n 200")
for r in "${runs[@]}"; do
  name="${r%%:*}"; read -r -a cmd <<<"${r#*:}"
  # Addresses of our own (not the default first-free 127.0.0.x): a device that reuses an
  # address another program just left can receive that program's stray retransmissions.
  net="127.77.$((port % 250))"
  start_server "${name}_srv" 60 $port SOFTRNIC_IP=$net.1 SOFTRNIC_PCAP="$work/$name-srv.pcap" -- "${cmd[@]}" \
    || bad "$name server did not listen"
  run_client "${name}_cli" 60 $port SOFTRNIC_IP=$net.2 SOFTRNIC_PCAP="$work/$name-cli.pcap" -- "${cmd[@]}"
  wait "$spid"; src=$?
  [ "$crc" -eq 0 ] && [ "$src" -eq 0 ] && ok "$name ran (client $crc, server $src)" \
    || { bad "$name exit client=$crc server=$src"; show "${name}_srv" "${name}_cli"; }
  port=$((port + 1))
done
for f in "$work"/*.pcap; do
  b=$(basename "$f")
  total=$(tshark -n -r "$f" 2>/dev/null | wc -l)
  ib=$(tshark -n -r "$f" -Y infiniband 2>/dev/null | wc -l)
  badl=$(tshark -n -r "$f" --disable-protocol rpcordma \
          -Y '_ws.malformed || _ws.expert.severity >= error' 2>/dev/null)
  if [ "$total" -ge 200 ] && [ "$ib" -eq "$total" ] && [ -z "$badl" ]; then
    ok "tshark $b: $total frames, all infiniband, none malformed"
  else
    bad "tshark $b: total=$total infiniband=$ib"; echo "$badl" | head -5
  fi
  if out=$("$PCAP_ICRC_CHECK" "$f" --min 200 2>&1); then ok "$out"; else bad "$out"; fi
done
echo "read_lat client opcodes seen: $(tshark -n -r "$work/read_lat-cli.pcap" -T fields \
  -e infiniband.bth.opcode 2>/dev/null | sort -u | tr '\n' ' ')"
# The checker must notice damage: complement the last byte (ICRC) of frame 3 in a copy.
f="$work/read_lat-cli.pcap"; g="$work/damaged.pcap.bad"; cp "$f" "$g"
off=24
for _ in 1 2; do off=$((off + 16 + $(od -An -tu4 -j $((off + 8)) -N4 "$f"))); done
len3=$(od -An -tu4 -j $((off + 8)) -N4 "$f")
pos=$((off + 16 + len3 - 1))
byte=$(od -An -tu1 -j $pos -N1 "$f")
printf "\\x$(printf %02x $((byte ^ 0xff)))" | dd of="$g" bs=1 seek=$pos conv=notrunc status=none
cmp -s "$f" "$g" && bad "could not damage the copy"
if out=$("$PCAP_ICRC_CHECK" "$g" 2>&1); then bad "damaged copy passed: $out"
else grep -q 'frame 3:' <<<"$out" && ok "damaged copy refused: $out" || bad "unexpected: $out"; fi
exit $fail
