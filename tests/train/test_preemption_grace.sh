#!/usr/bin/env bash
# train.preemption_grace_s: after SIGTERM (or SIGUSR1) the step and its checkpoint must finish
# within the grace period. A step too slow for it ends the process (exit 1, a message naming the
# setting) before the scheduler's SIGKILL would, and leaves no half-written checkpoint; with
# enough grace the same signal gives a checkpoint and exit 75 (preempted, resumable).
source "$(dirname "$0")/lib.sh"
ARGS=(--config "$TINY" --set train.steps=50 --set checkpoint.every_steps=0 --set train.log_every=1)

run_and_signal() {  # dir grace signal: starts a run whose steps take 2 s each, signals it in step 2
  KILN_FAULT_KIND=slow-step KILN_FAULT_STEP=1 "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/$1" \
    --set train.preemption_grace_s="$2" > "$WORK/$1.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do
    [ -f "$WORK/$1/metrics.jsonl" ] && [ "$(wc -l < "$WORK/$1/metrics.jsonl")" -ge 1 ] && break
    sleep 0.1
  done
  sleep 0.3  # inside the 2 s of step 2
  kill -"$3" "$pid"
  local code=0; wait "$pid" || code=$?
  echo "$code"
}

start=$(date +%s)
code=$(run_and_signal short 1 TERM)
took=$(( $(date +%s) - start ))
[ "$code" = 1 ] || { cat "$WORK/short.log"; fail "expected exit 1 past the grace period, got $code"; }
grep -q "SIGTERM.*train.preemption_grace_s = 1 s" "$WORK/short.log" || { cat "$WORK/short.log"; fail "no message naming the grace period"; }
[ -z "$(ls -A "$WORK/short/checkpoints" 2>/dev/null | grep -vx '.kiln-lock')" ] || { ls -la "$WORK/short/checkpoints"; fail "a checkpoint directory was left behind"; }
[ "$took" -le 6 ] || fail "took ${took}s to give up after a 1 s grace period"

code=$(run_and_signal long 30 USR1)
[ "$code" = 75 ] || { cat "$WORK/long.log"; fail "expected exit 75 within the grace period, got $code"; }
grep -q "stop requested (SIGUSR1): checkpointing at step 2" "$WORK/long.log" || { cat "$WORK/long.log"; fail "no stop message naming SIGUSR1"; }
grep -q "stopped by SIGUSR1 at step 2 .*exit code 75 (preempted)" "$WORK/long.log" || { cat "$WORK/long.log"; fail "no final message naming SIGUSR1 and exit 75"; }
[ -d "$WORK/long/checkpoints/step-000002" ] || { cat "$WORK/long.log"; fail "no checkpoint of step 2"; }
pass "past train.preemption_grace_s: exit 1 with the reason after ${took}s; within it: a checkpoint and exit 75"
