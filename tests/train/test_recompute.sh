#!/usr/bin/env bash
# train.recompute: BLOCKS in `kiln train`: a tiny GPT-2 and a tiny BERT (dropout 0.1) log the
# same losses, bit for bit, as with NONE; under a memory cap that NONE exceeds, BLOCKS trains,
# and NONE's out-of-memory message names what to change (docs/memory.md).
source "$(dirname "$0")/lib.sh"
COMMON=(--set train.steps=3 --set train.log_every=1 --set checkpoint.every_steps=0
        --set logging.tensorboard=false --set data.kind=SYNTHETIC --set model.dropout=0.1
        --set schedule.warmup_steps=0 --set train.batch_per_gpu=8)
GPT=(--set model.name=gpt2 --set model.gpt.vocab_size=64 --set model.gpt.seq_len=64
     --set model.gpt.hidden_size=32 --set model.gpt.num_layers=6 --set model.gpt.num_heads=2
     --set model.gpt.intermediate_size=128 --set model.gpt.max_positions=64)
BERT=(--set model.name=bert_base --set model.bert.vocab_size=64 --set model.bert.seq_len=16
      --set model.bert.hidden_size=16 --set model.bert.num_layers=3 --set model.bert.num_heads=2
      --set model.bert.intermediate_size=32)

train() {  # dir recompute args...
  local dir=$1 recompute=$2; shift 2
  "$KILN" train --config "$TINY" "${COMMON[@]}" "$@" --set train.recompute="$recompute" \
    --set logging.dir="$WORK/$dir" --quiet > "$WORK/$dir.out" 2>&1
}
for model in GPT BERT; do
  declare -n args=$model
  train "$model-none" NONE "${args[@]}" || { cat "$WORK/$model-none.out"; fail "$model NONE failed"; }
  train "$model-blocks" BLOCKS "${args[@]}" || { cat "$WORK/$model-blocks.out"; fail "$model BLOCKS failed"; }
  [ "$(losses "$WORK/$model-none/metrics.jsonl" | wc -l)" = 3 ] || fail "$model: expected 3 losses"
  diff <(losses "$WORK/$model-none/metrics.jsonl") <(losses "$WORK/$model-blocks/metrics.jsonl") ||
    fail "$model: losses differ with train.recompute BLOCKS"
done

# The 6-layer GPT's step needs more than 9 MiB of host memory without recomputation, less than 4 with.
CAP=${RECOMPUTE_CAP_MB:-6}
code=0
train cap-none NONE "${GPT[@]}" --set train.max_memory_mb=$CAP || code=$?
[ "$code" = 1 ] || { cat "$WORK/cap-none.out"; fail "NONE under $CAP MiB exited $code, expected out of memory"; }
for what in "out of memory" train.batch_per_gpu train.recompute parallel.zero_stage "kiln plan"; do
  grep -q "$what" "$WORK/cap-none.out" || { cat "$WORK/cap-none.out"; fail "the out-of-memory message lacks '$what'"; }
done
train cap-blocks BLOCKS "${GPT[@]}" --set train.max_memory_mb=$CAP ||
  { cat "$WORK/cap-blocks.out"; fail "BLOCKS does not train under $CAP MiB"; }
pass "recompute BLOCKS: same losses as NONE (GPT-2, BERT); trains under a $CAP MiB cap that NONE exceeds, whose message names what to change"
