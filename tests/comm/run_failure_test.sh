#!/usr/bin/env bash
# Process-level failure test: runs comm_failure_driver under mpirun and checks that the job ends
# with a non-zero exit within a bounded time, and (hang mode) that rank 0's watchdog named the
# operation, its sequence number and the time waited.
#   run_failure_test.sh <mpiexec> <driver> kill|hang <np> <max_seconds>
set -u
mpiexec=$1 driver=$2 mode=$3 np=$4 max_seconds=$5
log=$(mktemp)
start=$(date +%s%N)
# The outer timeout is a safety net; the job is expected to end well before it.
timeout -s KILL $((max_seconds + 60)) "$mpiexec" --allow-run-as-root --oversubscribe -np "$np" \
  "$driver" "$mode" 5 >"$log" 2>&1
status=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
elapsed=$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))
cat "$log"
echo "--- exit status $status after ${elapsed}s (limit ${max_seconds}s)"
fail=0
if [ "$status" -eq 0 ]; then echo "FAIL: the job exited 0"; fail=1; fi
if [ "$elapsed_ms" -gt $((max_seconds * 1000)) ]; then echo "FAIL: too slow"; fail=1; fi
if [ "$mode" = hang ]; then
  if ! grep -Eq "collective all_reduce #[0-9]+ on rank 0 did not finish within 5 s \(waited [0-9.]+ s\); a rank may be hung or dead" "$log"; then
    echo "FAIL: rank 0's watchdog message is missing"; fail=1
  fi
fi
rm -f "$log"
exit $fail
