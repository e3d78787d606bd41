#!/usr/bin/env bash
# The llama family on one GPU (label gpu): a small Llama (GQA 4:2, tied) and a small Qwen2 (q/k/v
# biases, untied) in bf16 O2 with CUDA graphs and cuDNN's grouped-query attention, deterministic:
# 3 steps, a checkpoint, a new process, 3 more, must equal 6 uninterrupted steps bit for bit
# (losses, weights, optimizer state).
source "$(dirname "$0")/lib.sh"
export NCCL_NVLS_ENABLE=0
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
[ "$GPUS" -ge 1 ] || { echo "SKIP: needs a GPU"; exit 0; }
for model in llama qwen2; do
  tied=true; [ "$model" = qwen2 ] && tied=false
  ARGS=(--config "$SRC/tests/train/tiny_llama.pbtxt" --set model.name=$model
        --set model.llama.hidden_size=256 --set model.llama.seq_len=128
        --set model.llama.max_positions=128 --set model.llama.intermediate_size=512
        --set model.llama.qkv_bias=$([ $model = qwen2 ] && echo true || echo false)
        --set model.llama.tie_embeddings=$tied --set data.kind=SYNTHETIC --set data.path=
        --set train.device=CUDA --set train.deterministic=true --set precision.opt_level=O2
        --set precision.half=BF16 --set train.steps=6 --set train.batch_per_gpu=4
        --set train.global_batch=4 --set train.eval_every=0 --set data.eval_split=none
        --set checkpoint.every_steps=3 --set checkpoint.keep_last=2 --set checkpoint.resume=)
  "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/$model-a" > "$WORK/$model-a.log" 2>&1 \
    || { cat "$WORK/$model-a.log"; fail "$model reference run"; }
  grep -q "declines" "$WORK/$model-a.log" && { cat "$WORK/$model-a.log"; fail "cuDNN declined the attention"; }
  "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/$model-b" > "$WORK/$model-b1.log" 2>&1 \
    || { cat "$WORK/$model-b1.log"; fail "$model first run"; }
  rm -rf "$WORK/$model-b/checkpoints/step-000006"
  keep_until "$WORK/$model-b/metrics.jsonl" 3
  "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/$model-b" --resume latest > "$WORK/$model-b2.log" 2>&1 \
    || { cat "$WORK/$model-b2.log"; fail "$model resumed run"; }
  grep -q "resumed from .*step-000003 at step 3" "$WORK/$model-b2.log" || { cat "$WORK/$model-b2.log"; fail "resume message"; }
  same_run "$WORK/$model-a" "$WORK/$model-b" 6
  pass "$model bf16 O2 with CUDA graphs and cuDNN GQA attention: 3 + 3 steps equal 6 uninterrupted bit for bit"
done
