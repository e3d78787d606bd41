#!/usr/bin/env bash
# Ctrl-C: the first SIGINT finishes the step, writes a checkpoint and exits 130 with the command
# that resumes; --resume latest continues from it. A second SIGINT exits at once.
source "$(dirname "$0")/lib.sh"
ARGS=(--config "$TINY" --set train.steps=6 --set checkpoint.every_steps=0 --set train.log_every=1)
# Job control: a background job of a script otherwise starts with SIGINT ignored, and kiln keeps
# an ignored SIGINT ignored.
set -m

start_slow() {  # dir: starts a run whose steps take 2 s each from step 1, as $pid; returns in step 2
  KILN_FAULT_KIND=slow-step KILN_FAULT_STEP=1 "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/$1" \
    > "$WORK/$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do
    [ -f "$WORK/$1/metrics.jsonl" ] && [ "$(wc -l < "$WORK/$1/metrics.jsonl")" -ge 1 ] && break
    sleep 0.1
  done
  sleep 0.3  # inside the 2 s of step 2
}

start_slow once
kill -INT "$pid"
code=0; wait "$pid" || code=$?
[ "$code" = 130 ] || { cat "$WORK/once.log"; fail "SIGINT: exit $code, expected 130"; }
grep -q "stop requested (SIGINT): checkpointing at step 2" "$WORK/once.log" || { cat "$WORK/once.log"; fail "no stop message naming SIGINT"; }
grep -qF "interrupted (SIGINT) at step 2 after a checkpoint ($WORK/once/checkpoints/step-000002); resume with: kiln train --config $TINY" "$WORK/once.log" \
  || { cat "$WORK/once.log"; fail "no resume hint"; }
grep -qF -- "--resume latest" "$WORK/once.log" || fail "the hint does not say --resume latest"
[ -d "$WORK/once/checkpoints/step-000002" ] || { cat "$WORK/once.log"; fail "no checkpoint of step 2"; }
"$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/once" --resume latest > "$WORK/resume.log" 2>&1 \
  || { cat "$WORK/resume.log"; fail "--resume latest after SIGINT"; }
grep -q "resumed from $WORK/once/checkpoints/step-000002 at step 2" "$WORK/resume.log" || { cat "$WORK/resume.log"; fail "did not resume from step 2"; }
[ -d "$WORK/once/checkpoints/step-000006" ] || fail "the resumed run did not finish"

start_slow twice
kill -INT "$pid"
sleep 0.2
begin=$(date +%s.%N)
kill -INT "$pid"
code=0; wait "$pid" || code=$?
took=$(python3 -c "import time; print(round(time.time() - $begin, 1))")
[ "$code" = 130 ] || { cat "$WORK/twice.log"; fail "second SIGINT: exit $code, expected 130"; }
python3 -c "import sys; sys.exit(0 if $took < 1.5 else 1)" || fail "second SIGINT took ${took}s to exit (the step has 2 s)"
grep -q "second SIGINT: exiting at once" "$WORK/twice.log" || { cat "$WORK/twice.log"; fail "no message for the second SIGINT"; }
[ ! -d "$WORK/twice/checkpoints/step-000002" ] || fail "a checkpoint of the step cut short"
pass "SIGINT: checkpoint at step 2, exit 130, resume hint, resumed; a second SIGINT exits after ${took}s"
