#!/usr/bin/env bash
# ViT-B/16 on one GPU (label gpu): its attention has no mask and no dropout, so it runs cuDNN's
# fused attention. fp16 O2, deterministic: 3 steps, a checkpoint, a new process, 3 more, must
# equal 6 uninterrupted steps bit for bit (losses, weights, optimizer state), as the flash
# kernels' runs do in test_gpu_training.sh.
source "$(dirname "$0")/lib.sh"
export NCCL_NVLS_ENABLE=0
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
[ "$GPUS" -ge 1 ] || { echo "SKIP: needs a GPU"; exit 0; }
VIT=(--config "$SRC/configs/vit_b16.pbtxt" --set train.device=CUDA --set train.deterministic=true
     --set precision.opt_level=O2 --set precision.half=FP16 --set train.steps=6
     --set train.batch_per_gpu=8 --set train.global_batch=8 --set train.log_every=1
     --set train.eval_every=0 --set data.eval_split=none --set data.workers=2
     --set checkpoint.every_steps=3 --set checkpoint.keep_last=2 --set checkpoint.resume=
     --set schedule.warmup_steps=1 --set logging.progress=OFF)
"$KILN" train "${VIT[@]}" --set logging.dir="$WORK/a" > "$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "reference run"; }
grep -q "declines" "$WORK/a.log" && { cat "$WORK/a.log"; fail "cuDNN declined the attention: the test would not cover it"; }
"$KILN" train "${VIT[@]}" --set logging.dir="$WORK/b" > "$WORK/b1.log" 2>&1 || { cat "$WORK/b1.log"; fail "first run"; }
rm -rf "$WORK/b/checkpoints/step-000006"
keep_until "$WORK/b/metrics.jsonl" 3
"$KILN" train "${VIT[@]}" --set logging.dir="$WORK/b" --resume latest > "$WORK/b2.log" 2>&1 || { cat "$WORK/b2.log"; fail "resumed run"; }
grep -q "resumed from .*step-000003 at step 3" "$WORK/b2.log" || { cat "$WORK/b2.log"; fail "resume message"; }
same_run "$WORK/a" "$WORK/b" 6
pass "ViT-B/16 fp16 O2 with cuDNN attention: 3 + 3 steps equal 6 uninterrupted bit for bit"
