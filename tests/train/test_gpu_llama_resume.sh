#!/usr/bin/env bash
# The llama family on one GPU (label gpu): a small Llama (GQA 4:2, tied) and a small Qwen2 (q/k/v
# biases, untied) in bf16 O2 with CUDA graphs and cuDNN's grouped-query attention, deterministic:
# 3 steps, a checkpoint, a new process, 3 more, must equal 6 uninterrupted steps bit for bit
# (losses, weights, optimizer state); the same with the head over 4 chunks of rows
# (train.lm_head_chunks: the fused loss per chunk), whose losses equal the whole logits' within
# bf16's rounding of the head's summed weight gradient.
source "$(dirname "$0")/lib.sh"
export NCCL_NVLS_ENABLE=0
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
[ "$GPUS" -ge 1 ] || { echo "SKIP: needs a GPU"; exit 0; }
# 6 steps of `kiln train ARGS` against 3, a new process, and 3 more: bit for bit.
resumed_equals_uninterrupted() {  # run-name kiln-train-arguments...
  local run=$1; shift
  "$KILN" train "$@" --set logging.dir="$WORK/$run-a" > "$WORK/$run-a.log" 2>&1 \
    || { cat "$WORK/$run-a.log"; fail "$run reference run"; }
  grep -q "declines" "$WORK/$run-a.log" && { cat "$WORK/$run-a.log"; fail "cuDNN declined the attention"; }
  "$KILN" train "$@" --set logging.dir="$WORK/$run-b" > "$WORK/$run-b1.log" 2>&1 \
    || { cat "$WORK/$run-b1.log"; fail "$run first run"; }
  rm -rf "$WORK/$run-b/checkpoints/step-000006"
  keep_until "$WORK/$run-b/metrics.jsonl" 3
  "$KILN" train "$@" --set logging.dir="$WORK/$run-b" --resume latest > "$WORK/$run-b2.log" 2>&1 \
    || { cat "$WORK/$run-b2.log"; fail "$run resumed run"; }
  grep -q "resumed from .*step-000003 at step 3" "$WORK/$run-b2.log" || { cat "$WORK/$run-b2.log"; fail "resume message"; }
  same_run "$WORK/$run-a" "$WORK/$run-b" 6
}
for chunks in 1 4; do
for model in llama qwen2; do
  run=$model-c$chunks
  tied=true; [ "$model" = qwen2 ] && tied=false
  ARGS=(--config "$SRC/tests/train/tiny_llama.pbtxt" --set model.name=$model
        --set model.llama.hidden_size=256 --set model.llama.seq_len=128
        --set model.llama.max_positions=128 --set model.llama.intermediate_size=512
        --set model.llama.qkv_bias=$([ $model = qwen2 ] && echo true || echo false)
        --set model.llama.tie_embeddings=$tied --set data.kind=SYNTHETIC --set data.path=
        --set train.device=CUDA --set train.deterministic=true --set precision.opt_level=O2
        --set precision.half=BF16 --set train.steps=6 --set train.batch_per_gpu=4
        --set train.global_batch=4 --set train.eval_every=0 --set data.eval_split=none
        --set checkpoint.every_steps=3 --set checkpoint.keep_last=2 --set checkpoint.resume=
        --set train.lm_head_chunks=$chunks)
  resumed_equals_uninterrupted "$run" "${ARGS[@]}"
  pass "$model bf16 O2 with CUDA graphs and cuDNN GQA attention, head in $chunks chunk(s): 3 + 3 steps equal 6 uninterrupted bit for bit"
done
done
for model in llama qwen2; do
  python3 - "$WORK/$model-c1-a/metrics.jsonl" "$WORK/$model-c4-a/metrics.jsonl" <<'PY' \
    || fail "$model: the head in 4 chunks does not train as the whole logits"
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"whole {a}\nchunks {b}\nlargest relative difference {worst:.2e}")
assert len(a) == len(b) == 6 and worst < 1e-2, worst
PY
  pass "$model: the head in 4 chunks trains as the whole logits (bf16)"
done

# LoRA adapters on the frozen base (model.lora) and packed documents (data.document_boundary_token:
# the flash kernels with document masks, rotary positions restarting), through CUDA graphs.
LORA_ARGS=(--config "$SRC/tests/train/tiny_llama.pbtxt" --set model.name=llama --set model.llama.vocab_size=64
           --set model.llama.hidden_size=256 --set model.llama.seq_len=128 --set model.llama.max_positions=128
           --set model.llama.intermediate_size=512 --set data.kind=SYNTHETIC --set data.path=
           --set data.document_boundary_token=5 --set model.lora.rank=8
           --set model.lora.targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
           --set train.device=CUDA --set train.deterministic=true --set precision.opt_level=O2
           --set precision.half=BF16 --set train.steps=6 --set train.batch_per_gpu=4
           --set train.global_batch=4 --set train.eval_every=0 --set data.eval_split=none
           --set checkpoint.every_steps=3 --set checkpoint.keep_last=2 --set checkpoint.resume=)
resumed_equals_uninterrupted lora-packed "${LORA_ARGS[@]}"
grep -q "trained (LoRA adapters)" "$WORK/lora-packed-a.log" || { cat "$WORK/lora-packed-a.log"; fail "no LoRA line"; }
pass "LoRA rank 8 on every projection with packed documents, bf16 O2 with CUDA graphs: 3 + 3 steps equal 6 uninterrupted bit for bit"
