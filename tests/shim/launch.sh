#!/usr/bin/env bash
# tests/shim/launch.sh [--preload] -- PROGRAM [ARGS...]: scripts/softrnic run for the test
# scripts (pair.sh, single.sh, config_env.sh, tests/faults/lib.sh). In the asan configuration
# meson sets SOFTRNIC_TEST_PRELOAD to the ASan runtime (tests/meson.build): the Debian programs
# are not instrumented, so the sanitized libibverbs.so.1 can only load into them with the
# runtime preloaded ahead of libc (else ASan stops them: "ASan runtime does not come first").
#   library-path mode: LD_PRELOAD=<runtime> for PROGRAM only (not for the launcher's shell)
#   --preload mode:    the launcher puts the shim first in LD_PRELOAD, the runtime follows it
#                      (still ahead of libc, so malloc is ASan's); verify_asan_link_order=0
#                      accepts that order.
# Foreign programs run with detect_leaks=0: LeakSanitizer at exit would report every buffer
# perftest, ibverbs-utils or Python never free (not our code, not fixable here); leaks in the
# shim and emu/ are caught by the gtests, which keep detect_leaks=1 (scripts/test).
set -euo pipefail
launcher="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/scripts/softrnic"
opts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
# SOFTRNIC_TEST_EXTRA_PRELOAD: a library preloaded into PROGRAM only, last (e.g. Debian's
# librspreload.so, whose librdmacm.so.1 is ours: in the asan configuration it must not load
# into this shell or the launcher, which have no ASan runtime first).
extra="${SOFTRNIC_TEST_EXTRA_PRELOAD:-}"
unset SOFTRNIC_TEST_EXTRA_PRELOAD
if [ -n "$extra" ]; then
  set -- /bin/sh -c 'LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD }$0"; export LD_PRELOAD; exec "$@"' "$extra" "$@"
fi
if [ -z "${SOFTRNIC_TEST_PRELOAD:-}" ]; then
  exec "$launcher" run "${opts[@]}" -- "$@"
fi
[ -f "$SOFTRNIC_TEST_PRELOAD" ] || { echo "launch.sh: no sanitizer runtime at $SOFTRNIC_TEST_PRELOAD" >&2; exit 2; }
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
preload="$SOFTRNIC_TEST_PRELOAD${LD_PRELOAD:+ $LD_PRELOAD}"
runtime="$SOFTRNIC_TEST_PRELOAD"
# Not for the program: the shim warns once about every SOFTRNIC_* name it does not declare.
unset SOFTRNIC_TEST_PRELOAD
case " ${opts[*]} " in
  *" --preload "*)
    export LD_PRELOAD="$preload" ASAN_OPTIONS="$ASAN_OPTIONS:verify_asan_link_order=0"
    exec "$launcher" run "${opts[@]}" -- "$@" ;;
  *)
    # The runtime first, then what `softrnic run` preloads (libsoftrnic_paths.so).
    exec "$launcher" run "${opts[@]}" -- /bin/sh -c \
      'LD_PRELOAD="$0${LD_PRELOAD:+ $LD_PRELOAD}"; export LD_PRELOAD; exec "$@"' "$runtime" "$@" ;;
esac
