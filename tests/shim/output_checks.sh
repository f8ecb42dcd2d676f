# tests/shim/output_checks.sh (sourced): checks on the output of a foreign program run
# through the shims, shared by pair.sh and tests/rdmacm/cm_pair.sh.
# check_run NAME EXIT OUTFILE RE: prints FAIL lines and returns 1 unless NAME exited 0 and
# OUTFILE matches RE.
check_run() {
  local r=0
  [ "$2" -eq 0 ] || { echo "FAIL: $1 exited $2"; r=1; }
  grep -Eq -- "$4" "$3" || { echo "FAIL: $1 output lacks /$4/"; r=1; }
  return $r
}
# calibration_failed SERVER_OUT CLIENT_OUT EXPECT SEXPECT: true when perftest's clock
# calibration failed in the run ("Correlation coefficient r^2: 0.86 < 0.9"; with -F the tool
# goes on and prints "inf" for every latency) and the outputs lack what is expected. That is
# the tool's clock, not the device: the pair scripts run such a pair once more.
calibration_failed() {
  grep -qE 'r\^2: [^ ]+ < 0\.9' "$1" "$2" &&
    ! { grep -Eq -- "$3" "$2" && grep -Eq -- "$4" "$1"; }
}
# check_foreign OUTFILE...: a loader error, or a sanitizer report in our code inside the
# foreign program (asan build), fails the test even when the exit status did not show it.
check_foreign() {
  local r=0
  if grep -Eq 'symbol lookup error|version .* not found|no version information' "$@"; then
    echo "FAIL: loader error"; r=1
  fi
  if grep -Eq 'ERROR: (Address|Leak|Thread)Sanitizer|runtime error: ' "$@"; then
    echo "FAIL: sanitizer report"; r=1
  fi
  return $r
}
# stop_daemon PID OUTFILE: stops a softrnicd started by the script (SIGTERM, 10 s, then
# SIGKILL), prints its output, and returns 1 unless it exited 0 with no sanitizer report
# (the asan build's softrnicd is sanitized itself, LeakSanitizer included).
stop_daemon() {
  local r=0 rc
  kill -TERM "$1" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$1" 2>/dev/null && { echo "FAIL: softrnicd did not stop on SIGTERM (10 s)"; kill -KILL "$1"; r=1; }
  wait "$1"
  rc=$?
  echo "== softrnicd (exit $rc)"
  cat "$2"
  [ "$rc" -eq 0 ] || { echo "FAIL: softrnicd exited $rc"; r=1; }
  check_foreign "$2" || r=1
  return $r
}
