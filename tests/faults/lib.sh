# tests/faults/lib.sh: helpers sourced by the fault-injection conformance scripts: a private
# runtime dir, start a server / run a client through scripts/softrnic with timeouts, wait for
# the server's TCP port, sample `softrnic stats` from every live control socket while a
# program runs. Needs SOFTRNIC_SHIM_DIR and SOFTRNIC_CTL (softrnic-ctl).
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
launcher="$here/../../scripts/softrnic"
launch="$here/../shim/launch.sh"  # scripts/softrnic run (+ the ASan runtime in the asan build)
: "${SOFTRNIC_SHIM_DIR:?SOFTRNIC_SHIM_DIR must name the directory holding libibverbs.so.1}"
: "${SOFTRNIC_CTL:?SOFTRNIC_CTL must name softrnic-ctl}"
# Built with -Dfault_injection=false (meson passes SOFTRNIC_TEST_FAULT_INJECTION=false): the
# scenario cannot run. Check that a plan is refused as compiled out (never silently ignored),
# then skip (exit 77: counted and shown as a skip by scripts/count_results.py).
if [ "${SOFTRNIC_TEST_FAULT_INJECTION:-true}" = false ]; then
  nf_rt="$(mktemp -d)"
  nf_out=$(SOFTRNIC_RUNTIME_DIR="$nf_rt" SOFTRNIC_FAULTS='dir=rx => drop' \
           timeout -k 3 30 "$launch" -- ibv_devinfo 2>&1)
  nf_rc=$?
  rm -rf "$nf_rt"
  if [ "$nf_rc" -ne 0 ] && grep -q 'compiled out' <<<"$nf_out"; then
    echo "SKIP $(basename "$0"): fault injection is compiled out of this build; a plan is refused:"
    grep -m1 'compiled out' <<<"$nf_out"
    exit 77
  fi
  echo "FAIL: -Dfault_injection=false but SOFTRNIC_FAULTS was not refused (exit $nf_rc):"
  echo "$nf_out" | tail -5
  exit 1
fi
work="$(mktemp -d)"
[ -n "${FAULTS_KEEP:-}" ] && echo "work dir kept: $work" || trap 'cleanup_all' EXIT
export SOFTRNIC_RUNTIME_DIR="$work/rt"
mkdir -p "$SOFTRNIC_RUNTIME_DIR" && chmod 0700 "$SOFTRNIC_RUNTIME_DIR"
fail=0
bg_pids=()

cleanup_all() {
  local p
  for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$work"
}
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }

# start_server NAME TMO PORT ENV... -- PROG ARGS   (background; pid in $spid)
start_server() {
  local name="$1" tmo="$2" port="$3"; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" timeout -k 3 "$tmo" "$launch" -- "$@" -p "$port" >"$work/$name.out" 2>&1 &
  spid=$!
  bg_pids+=("$spid")
  for _ in $(seq 1 100); do
    ss -Hltn "sport = :$port" 2>/dev/null | grep -q . && return 0
    kill -0 "$spid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# run_client NAME TMO PORT ENV... -- PROG ARGS   (foreground; exit status in $crc, secs in $csecs)
run_client() {
  local name="$1" tmo="$2" port="$3"; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  local t0=$SECONDS
  env "${envs[@]}" timeout -k 3 "$tmo" "$launch" -- "$@" -p "$port" 127.0.0.1 >"$work/$name.out" 2>&1
  crc=$?
  csecs=$((SECONDS - t0))
}

# start_client: as run_client but in the background (pid in $cpid).
start_client() {
  local name="$1" tmo="$2" port="$3"; shift 3
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" timeout -k 3 "$tmo" "$launch" -- "$@" -p "$port" 127.0.0.1 >"$work/$name.out" 2>&1 &
  cpid=$!
  bg_pids+=("$cpid")
}

# The control sockets in the private runtime dir, one per line.
sockets() { ls "$SOFTRNIC_RUNTIME_DIR"/*.sock 2>/dev/null; }

# The pid encoded in a socket path <dir>/<device>.<pid>.sock.
sock_pid() { local b; b="$(basename "$1" .sock)"; echo "${b##*.}"; }

# sample_stats OUTPREFIX WATCHPID: while WATCHPID lives, writes each socket's latest successful
# `stats` to OUTPREFIX.<pid> every 0.1 s (background; pid in $sampler).
sample_stats() {
  local prefix="$1" watch="$2"
  (
    while kill -0 "$watch" 2>/dev/null; do
      for s in $(sockets); do
        if "$SOFTRNIC_CTL" --socket "$s" stats >"$prefix.tmp.$$" 2>/dev/null; then
          mv "$prefix.tmp.$$" "$prefix.$(sock_pid "$s")"
        fi
      done
      sleep 0.1
    done
    rm -f "$prefix.tmp.$$"
  ) &
  sampler=$!
}

# stat FILE NAME -> the counter's value (0 if absent)
stat() { awk -v n="$2" '$1 == n { print $2; f = 1 } END { if (!f) print 0 }' "$1" 2>/dev/null; }

show() {
  local n
  for n in "$@"; do
    echo "---- $n output (tail)"
    tail -n 25 "$work/$n.out"
  done
}
