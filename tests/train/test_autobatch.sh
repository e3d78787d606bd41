#!/usr/bin/env bash
# kiln autobatch on the CPU under a memory limit: finds the largest batch by real steps, recovers
# from out-of-memory without leaking, and prints it with the memory it used.
source "$(dirname "$0")/lib.sh"
"$KILN" autobatch --config "$TINY" --set train.max_memory_mb=48 --set logging.dir="$WORK/a" \
  --max-batch 4096 > "$WORK/out" 2>&1 || { cat "$WORK/out"; fail "autobatch failed"; }
cat "$WORK/out"
grep -q "out of memory" "$WORK/out" || fail "the limit was never reached"
line=$(grep "largest batch that fits" "$WORK/out") || fail "no result line"
batch=$(echo "$line" | sed 's/.*fits: \([0-9]*\).*/\1/')
[ "$batch" -ge 8 ] && [ "$batch" -lt 4096 ] || fail "implausible batch $batch"
# The recommended batch (a margin below the largest for the loader's buffers and fragmentation,
# which differ with thread timing) trains under the same limit; twice the largest does not.
recommended=$(sed -n 's/.*recommended train.batch_per_gpu: \([0-9]*\).*/\1/p' "$WORK/out")
[ -n "$recommended" ] && [ "$recommended" -le "$batch" ] || fail "no recommended batch at most $batch"
"$KILN" train --config "$TINY" --set train.max_memory_mb=48 --set train.batch_per_gpu="$recommended" \
  --set train.steps=2 --set logging.dir="$WORK/b" --quiet > "$WORK/fit" 2>&1 || { cat "$WORK/fit"; fail "batch $recommended does not train"; }
code=0
"$KILN" train --config "$TINY" --set train.max_memory_mb=48 --set train.batch_per_gpu=$((batch * 2)) \
  --set train.steps=2 --set logging.dir="$WORK/c" --quiet > "$WORK/oom" 2>&1 || code=$?
[ "$code" = 1 ] || { cat "$WORK/oom"; fail "batch $((batch * 2)) exited $code, expected an out-of-memory error"; }
grep -q "out of memory allocating" "$WORK/oom" || { cat "$WORK/oom"; fail "no out-of-memory message"; }
grep -q "in use" "$WORK/oom" || fail "message lacks what is in use"
pass "autobatch found batch $batch under a 48 MiB limit; the recommended $recommended trains"
