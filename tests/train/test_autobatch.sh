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

# The shipped experiments as they are: a probe's two steps are not judged by the experiment's
# schedule (10000 warmup steps before a cosine decay cannot span two steps). CPU-sized: small
# images, two BERT layers of 32 tokens, fp16 levels (a GPU's) lowered to O0 and resnet50's NCCL
# to AUTO; vit_b16 keeps its O1 bf16.
for c in vit_b16 resnet50 bert_base; do
  shrink=(--set model.image_size=64 --set precision.opt_level=O0)  # 2x2 at the last batch norm
  [ "$c" = vit_b16 ] && shrink=(--set model.image_size=32)
  [ "$c" = bert_base ] && shrink=(--set model.bert.num_layers=2 --set model.bert.seq_len=32
    --set precision.opt_level=O0)
  "$KILN" autobatch --config "$SRC/configs/$c.pbtxt" --set train.device=CPU \
    --set parallel.backend=AUTO "${shrink[@]}" \
    --set train.max_memory_mb=3072 --set logging.dir="$WORK/$c" --max-batch 2 > "$WORK/$c.out" 2>&1 ||
    { cat "$WORK/$c.out"; fail "autobatch of the shipped $c failed"; }
  # Nothing ran out of memory below --max-batch 2: the ceiling is said to be one, not a limit.
  grep -q "no batch up to --max-batch 2 ran out of memory: batch 2 fits" "$WORK/$c.out" || { cat "$WORK/$c.out"; fail "$c: no result"; }
  ! grep -q "largest batch that fits" "$WORK/$c.out" || fail "$c: the search's ceiling called the largest batch that fits"
done
# Bad options are refused before anything runs (a margin of 2 recommended twice the largest batch
# tried; --max-batch 0 said batch 1 was out of memory).
expect_exit2 "--margin 2: must be in (0, 1]" -- "$KILN" autobatch --config "$TINY" --margin 2
expect_exit2 "--margin 0: must be in (0, 1]" -- "$KILN" autobatch --config "$TINY" --margin 0
expect_exit2 "--max-batch 0: must be at least 1" -- "$KILN" autobatch --config "$TINY" --max-batch 0
# With train.global_batch the recommendation divides it per rank: 90 % of 10 is 9, which does not
# divide 40 / 2 = 20; 5 does.
"$KILN" autobatch --config "$TINY" --set train.global_batch=40 --set train.batch_per_gpu=4 --set logging.dir="$WORK/g" --max-batch 10 \
  --world-size 2 > "$WORK/g.out" 2>&1 || { cat "$WORK/g.out"; fail "autobatch with a global batch"; }
grep -q "batch 10 fits .*recommended train.batch_per_gpu: 5 (divides train.global_batch 40 / 2 ranks)" "$WORK/g.out" \
  || { cat "$WORK/g.out"; fail "the recommended batch does not divide train.global_batch"; }
pass "autobatch found batch $batch under a 48 MiB limit; the recommended $recommended trains; the shipped vit_b16, resnet50 and bert_base probe past their schedules"
