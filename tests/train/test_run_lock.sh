#!/usr/bin/env bash
# One run per directory: a second `kiln train` on a checkpoint.dir in use refuses to start (exit 2,
# naming the directory, the host and the first run's pid) and the first run finishes untouched;
# the lock is an fcntl record lock the kernel drops when its holder dies, so after a SIGKILL a new
# run on the same directory starts.
source "$(dirname "$0")/lib.sh"
ARGS=(--config "$TINY" --set train.steps=4 --set checkpoint.every_steps=0 --set train.log_every=1)

wait_for_metrics() {  # dir: until the run's first step is logged (its locks are held by then)
  for _ in $(seq 1 600); do
    [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge 1 ] && return 0
    sleep 0.1
  done
  fail "no step logged in $1"
}

# Steps of 2 s from step 1: the first run holds its directories for about 6 s.
KILN_FAULT_KIND=slow-step KILN_FAULT_STEP=1 "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/a" \
  > "$WORK/a.log" 2>&1 &
first=$!
wait_for_metrics "$WORK/a"
# Another logging.dir, the same checkpoint.dir.
code=0
"$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/b" --set checkpoint.dir="$WORK/a/checkpoints" \
  > "$WORK/b.log" 2>&1 || code=$?
[ "$code" = 2 ] || { cat "$WORK/b.log"; fail "second run on the same checkpoint.dir exited $code, expected 2"; }
grep -qF "checkpoint.dir $WORK/a/checkpoints is in use" "$WORK/b.log" || { cat "$WORK/b.log"; fail "message does not name the directory"; }
grep -qF "host $(hostname), pid $first," "$WORK/b.log" || { cat "$WORK/b.log"; fail "message does not name the host and pid $first"; }
[ ! -d "$WORK/b/checkpoints" ] || fail "the refused run created checkpoints"
code=0; wait "$first" || code=$?
[ "$code" = 0 ] || { cat "$WORK/a.log"; fail "first run exited $code"; }
[ "$(losses "$WORK/a/metrics.jsonl" | wc -l)" = 4 ] || fail "the first run's metrics were disturbed"
[ -d "$WORK/a/checkpoints/step-000004" ] || fail "the first run wrote no final checkpoint"

# A holder killed with SIGKILL leaves no stuck lock.
KILN_FAULT_KIND=slow-step KILN_FAULT_STEP=1 "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/c" \
  > "$WORK/c.log" 2>&1 &
killed=$!
wait_for_metrics "$WORK/c"
kill -KILL "$killed"
wait "$killed" || true
# It continues the killed run's directory (checkpoint.resume latest: that run saved no checkpoint,
# so it starts fresh; a plain fresh run there would be refused, tests/train/test_run_directory.sh).
"$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/c" --set checkpoint.resume=latest --quiet \
  > "$WORK/c2.log" 2>&1 \
  || { cat "$WORK/c2.log"; fail "a run after the holder's SIGKILL did not start"; }
grep -qF "pid=$killed" "$WORK/c/.kiln-lock" && fail "the lock file still names the killed run"
pass "second run refused (exit 2, names directory, host and pid); the lock of a SIGKILLed run is free"
