#!/usr/bin/env bash
# train.loss_average on the CPU: a tiny GPT-2 on llm.c shards with loss masks (.mask beside each
# shard, as kiln tokenize --chat writes them) whose windows train 1 or all 8 of their targets.
# With STEP_TOKENS (AUTO on masked shards) a step of 8 sequences gives the same losses and weights
# as one batch of 8 (within summation order), whether it runs as 2 accumulated micro-batches of 4
# or on 2 ranks of 4 (mpirun), with the whole logits or the head in 2 chunks of rows;
# MICRO_BATCHES, which averages the micro-batches' means, does not.
# LOSS_AVERAGE_DEVICE=CUDA runs it on one GPU (tests/train/test_gpu_loss_average.sh: no ranks, the
# GEMMs' own summation order in the tolerances).
source "$(dirname "$0")/lib.sh"
DEVICE=${LOSS_AVERAGE_DEVICE:-CPU}
LOSS_TOL=1e-6 WEIGHT_TOL=1e-4
DETERMINISTIC=false
# On the GPU, AUTO against the same run with STEP_TOKENS set is bit for bit only with deterministic
# kernels (cuBLAS's and the reductions' order).
[ "$DEVICE" = CUDA ] && LOSS_TOL=1e-5 WEIGHT_TOL=1e-3 DETERMINISTIC=true
W=$WORK
python3 - "$W" <<'PY'
import random, struct, sys
out = sys.argv[1]
random.seed(3)
T, windows = 8, 64
tokens = [random.randrange(64) for _ in range(T * windows + 1)]
# Window w predicts tokens[w*T+1 .. w*T+T]: every other window trains one of them, the rest all.
mask = [1] * len(tokens)
for w in range(0, windows, 2):
    for t in range(w * T + 1, w * T + T): mask[t] = 0
def header(magic, version, count):
    return struct.pack("<256i", magic, version, count, *([0] * 253))
with open(f"{out}/chat_train_000000.bin", "wb") as f:
    f.write(header(20240520, 1, len(tokens)) + struct.pack(f"<{len(tokens)}H", *tokens))
with open(f"{out}/chat_train_000000.mask", "wb") as f:
    f.write(header(20261204, 1, len(mask)) + bytes(mask))
PY
GPT=(model.name=gpt2 model.gpt.vocab_size=64 model.gpt.seq_len=8 model.gpt.max_positions=8
     model.gpt.hidden_size=16 model.gpt.num_layers=1 model.gpt.num_heads=2
     model.gpt.intermediate_size=32 data.kind=LLMC_SHARDS "data.path=$W/chat_train_*.bin"
     data.workers=0 data.eval_split=none train.steps=10 train.global_batch=8 optimizer.lr=0.01
     schedule.warmup_steps=0 checkpoint.every_steps=10 train.device=$DEVICE
     train.deterministic=$DETERMINISTIC)
train() {  # dir np overrides...
  local dir=$1 np=$2; shift 2
  local sets=() opt; for opt in "${GPT[@]}" "$@"; do sets+=(--set "$opt"); done
  local launch=(); [ "$np" -gt 1 ] && launch=("${MPIRUN[@]}" -np "$np")
  "${launch[@]}" "$KILN" train --config "$TINY" --set logging.dir="$W/$dir" "${sets[@]}" \
    > "$W/$dir.log" 2>&1 || { tail -30 "$W/$dir.log"; fail "run $dir"; }
}
# Largest relative difference of two runs' losses and largest absolute one of their weights.
close() {  # a b loss-tolerance weight-tolerance
  python3 - "$W/$1" "$W/$2" "$3" "$4" <<'PY'
import json, struct, sys
import numpy as np
a, b, lt, wt = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
def losses(d): return [json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl") if '"loss"' in l]
def weights(d):
    with open(f"{d}/checkpoints/step-000010/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n)); data = f.read()
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], np.float32)
            for k, v in h.items() if k != "__metadata__"}
la, lb = losses(a), losses(b)
assert len(la) == len(lb) == 10, (len(la), len(lb))
dl = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
wa, wb = weights(a), weights(b)
dw = max(float(np.max(np.abs(wa[k] - wb[k]))) for k in wa)
print(f"{a} vs {b}: losses {dl:.3g}, weights {dw:.3g}")
sys.exit(0 if dl <= lt and dw <= wt else 1)
PY
}
train whole 1 train.batch_per_gpu=8
train accumulated 1 train.batch_per_gpu=4
train accumulated-micro 1 train.batch_per_gpu=4 train.loss_average=MICRO_BATCHES
train accumulated-explicit 1 train.batch_per_gpu=4 train.loss_average=STEP_TOKENS
train chunked 1 train.batch_per_gpu=4 train.lm_head_chunks=2
close whole accumulated $LOSS_TOL $WEIGHT_TOL || fail "2 accumulated micro-batches with STEP_TOKENS (AUTO) are not one batch of 8"
close whole chunked $LOSS_TOL $WEIGHT_TOL || fail "the head in chunks with STEP_TOKENS is not one batch of 8"
same_run "$W/accumulated" "$W/accumulated-explicit" 10
close whole accumulated-micro 1e-3 1 && fail "MICRO_BATCHES trains as STEP_TOKENS on masked data (the setting does nothing)"
if [ "$DEVICE" = CPU ]; then
  train ranks 2 train.batch_per_gpu=4
  train ranks-micro 2 train.batch_per_gpu=4 train.loss_average=MICRO_BATCHES
  close whole ranks $LOSS_TOL $WEIGHT_TOL || fail "2 ranks with STEP_TOKENS (AUTO) are not one batch of 8"
  close whole ranks-micro 1e-3 1 && fail "MICRO_BATCHES on 2 ranks trains as STEP_TOKENS on masked data"
fi
pass "masked shards ($DEVICE): AUTO is STEP_TOKENS: 2 micro-batches of 4 (the head whole or in 2 chunks), and on the CPU 2 ranks of 4, train as one batch of 8; MICRO_BATCHES, the means of the micro-batches, does not"
