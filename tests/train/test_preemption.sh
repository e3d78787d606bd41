#!/usr/bin/env bash
# SIGTERM to every rank of the job, as a cluster scheduler's preemption (scancel --signal=TERM,
# Slurm's pre-emption) delivers it: the current step finishes, a checkpoint is committed, every
# rank and mpirun exit 75 (kExitPreempted: stopped early, resumable), and resuming reproduces the
# uninterrupted run's losses exactly.
source "$(dirname "$0")/lib.sh"
STEPS=60
"${MPIRUN[@]}" -np 2 "$KILN" train --config "$TINY" --set train.steps=$STEPS --set checkpoint.every_steps=0 \
  --set logging.dir="$WORK/ref" --quiet > "$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; fail "reference run"; }

"${MPIRUN[@]}" -np 2 "$KILN" train --config "$TINY" --set train.steps=$STEPS --set checkpoint.every_steps=0 \
  --set logging.dir="$WORK/p" > "$WORK/p.log" 2>&1 &
job=$!
# Wait until a few steps are logged, then preempt.
for _ in $(seq 1 600); do
  [ -f "$WORK/p/metrics.jsonl" ] && [ "$(wc -l < "$WORK/p/metrics.jsonl")" -ge 5 ] && break
  sleep 0.1
done
start=$(date +%s.%N)
pkill -TERM -f "^$KILN train .*$WORK/p" || fail "no rank process to signal"
code=0; wait "$job" || code=$?
took=$(python3 -c "import time; print(round(time.time() - $start, 1))")
[ "$code" = 75 ] || { cat "$WORK/p.log"; fail "preempted job exited $code, expected 75"; }
python3 -c "import sys; sys.exit(0 if $took < 120 else 1)" || fail "preemption took ${took}s (limit 120)"
ckpt=$(ls -d "$WORK/p/checkpoints"/step-* | tail -1)
grep -q "stop requested (SIGTERM): checkpointing at step" "$WORK/p.log" || { cat "$WORK/p.log"; fail "no stop message naming SIGTERM"; }
grep -q "stopped by SIGTERM at step .* exit code 75 (preempted)" "$WORK/p.log" || { cat "$WORK/p.log"; fail "no final message"; }
step=$(basename "$ckpt" | sed 's/step-0*//')
[ "$step" -lt $STEPS ] || fail "the job finished before it was preempted (step $step)"

"${MPIRUN[@]}" -np 2 "$KILN" train --config "$TINY" --set train.steps=$STEPS --set checkpoint.every_steps=0 \
  --set logging.dir="$WORK/p" --resume latest --quiet > "$WORK/r.log" 2>&1 || { cat "$WORK/r.log"; fail "resume"; }
diff <(losses "$WORK/ref/metrics.jsonl") <(losses "$WORK/p/metrics.jsonl") || fail "losses differ from the reference"
cmp "$WORK/ref/checkpoints/step-0000$STEPS/model.safetensors" "$WORK/p/checkpoints/step-0000$STEPS/model.safetensors" \
  || fail "final weights differ"
pass "SIGTERM at step $step: exit 75 after ${took}s with a checkpoint; resume matches the reference bit for bit"
