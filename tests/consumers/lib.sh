# tests/consumers/lib.sh: what the consumer conformance scripts share (sourced).
#   consumer_init PROGRAM PACKAGE   skip (77) unless PROGRAM is installed; sets $launch
#                                   (tests/shim/launch.sh) and a private $work and
#                                   SOFTRNIC_RUNTIME_DIR, removed at exit
#   free_port FIRST                 first TCP port from FIRST on that nothing listens on
#   wait_listen PORT PID            until PORT listens (bounded: 20 s) or PID died
#   pcap_packets FILE               packets in a pcap (0 if absent)
consumer_init() {
  command -v "$1" >/dev/null || { echo "SKIP: $1 not installed (apt-get install $2)"; exit 77; }
  launch="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../shim/launch.sh"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  export SOFTRNIC_RUNTIME_DIR="$work/rt"
}

free_port() {
  local p
  for p in $(seq "$1" $(($1 + 200))); do
    ss -Hltn "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
  done
  echo "$1"
}

wait_listen() {
  for _ in $(seq 1 200); do
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

pcap_packets() {
  local n=0
  [ -s "$1" ] && n=$(capinfos -M -c "$1" 2>/dev/null | awk -F: '/Number of packets/ {gsub(/ /, "", $2); print $2}')
  echo "${n:-0}"
}

# show_log FILE: the last 20 lines of a program's output, and a sanitizer report in it whole
# (its stack is what explains a failure; the tail is only ASan's legend).
show_log() {
  local f=$1
  if grep -q -E '^(==[0-9]+==ERROR|SUMMARY): (AddressSanitizer|UndefinedBehaviorSanitizer|LeakSanitizer)|runtime error:' "$f"; then
    grep -E -A60 '^==[0-9]+==ERROR|runtime error:' "$f" | grep -v -E '^ +(Addressable|Partially|Heap|Freed|Stack|Global|Poisoned|Container|Array|Intra|ASan|Left|Right)' | head -80
    echo "..."
  fi
  tail -20 "$f"
}
