#!/usr/bin/env bash
# Resuming on another world size with the same train.global_batch (issue "Nothing lost, nothing
# misread"). Two data sets: Fashion-MNIST in its idx format (120 images: 5 steps of 24 per epoch)
# and llm.c token shards (2 shards of 60 windows), with 4 samples per rank, so one step is 6
# batches on 1 rank, 3 on 2 and 2 on 3 (an MLP, not fashion_cnn: batch norm's statistics per
# rank's batch would make runs on different world sizes differ by more than rounding). A 2-rank
# run (ZeRO stage 0 and 2) checkpoints at step 6, inside epoch 1; the checkpoint resumes on 3 ranks
# (Fashion-MNIST's stage-0 one also on 1) and runs to step 12, into epoch 2:
#   - the data position continues: the step-12 checkpoint's position (epoch, batch, sample of the
#     epoch) and micro-step equal those of an uninterrupted run on that world size;
#   - the losses of steps 7-12 equal the uninterrupted run's within 1e-5 relative (4e-8 measured),
#     not bit for bit: the step-6 weights come from 2 ranks, whose sums over ranks round otherwise;
#   - bit for bit where nothing else differs: with optimizer.lr 1e-30 the weights do not move, so
#     the losses of steps 7-12 on 3 ranks resumed from 2 equal an uninterrupted 3-rank run's
#     exactly (the same samples on the same ranks in the same order);
# PowerSGD's per-rank state starts afresh on 3 ranks, with a warning; and a checkpoint of another
# global batch is refused naming train.global_batch and both values.
source "$(dirname "$0")/lib.sh"
W=$WORK
python3 - "$W" <<'PY'
import os, random, struct, sys
d = sys.argv[1]
os.makedirs(f"{d}/fashion"); os.makedirs(f"{d}/shards")
n, rng = 120, random.Random(3)
with open(f"{d}/fashion/train-images-idx3-ubyte", "wb") as f:
    f.write(struct.pack(">4i", 2051, n, 28, 28) + bytes(rng.randrange(256) for _ in range(n * 784)))
with open(f"{d}/fashion/train-labels-idx1-ubyte", "wb") as f:
    f.write(struct.pack(">2i", 2049, n) + bytes(rng.randrange(10) for _ in range(n)))
random.seed(11)
pattern = random.sample(range(512), 13)
for s, phase in ((1, 0), (2, 5)):  # 60 windows of 32 tokens each
    tokens = [pattern[(i + phase) % 13] for i in range(60 * 32 + 1)]
    with open(f"{d}/shards/tiny_train_00000{s}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
COMMON=(train.steps=12 train.batch_per_gpu=4 train.global_batch=24 checkpoint.every_steps=6)
FASHION=("$TINY" model.name=mlp data.kind=FASHION_MNIST data.path="$W/fashion")
GPT=("$SRC/tests/train/tiny_gpt.pbtxt" data.path="$W/shards/tiny_train_*.bin" data.eval_split=none)
run() {  # np dir config overrides...
  local np=$1 dir=$2 config=$3; shift 3
  local sets=() opt; for opt in "${COMMON[@]}" "$@"; do sets+=(--set "$opt"); done
  local cmd=("$KILN" train --config "$config" --set logging.dir="$dir" "${sets[@]}")
  if [ "$np" = 1 ]; then "${cmd[@]}" > "$dir.log" 2>&1; else "${MPIRUN[@]}" -np "$np" "${cmd[@]}" > "$dir.log" 2>&1; fi \
    || { tail -30 "$dir.log"; fail "run $dir ($*)"; }
}
# The data position and micro-step of a checkpoint's state.pbtxt, one line.
position() { grep -E '^  (epoch|next_batch|samples_per_batch|dataset_size):|^micro_step:' "$1/state.pbtxt" | tr -s ' \n' ' '; }
# Losses of steps 7-12 of two runs: equal (tolerance 0) or within a relative tolerance.
same_losses() {  # reference-dir resumed-dir tolerance
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" <<'PY'
import json, sys
def losses(p): return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r and r["step"] > 6}
a, b, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
assert sorted(a) == sorted(b) == list(range(7, 13)), (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
if (tol == 0 and a != b) or worst > tol: sys.exit(f"losses differ: {a} vs {b} (max rel {worst:.3g})")
print(f"{worst:.2g}")
PY
}

# Fashion-MNIST on 3 ranks and on 1, the token shards on 3 (on CI's 2 cores each run costs about
# 3 s, most of it MPI's start).
for data in fashion gpt; do
  if [ $data = fashion ]; then CFG=("${FASHION[@]}"); sizes="3 1"; else CFG=("${GPT[@]}"); sizes=3; fi
  for np in $sizes; do run $np "$W/$data-ref$np" "${CFG[@]}"; done
  for z in 0 2; do
    run 2 "$W/$data-two$z" "${CFG[@]}" parallel.zero_stage=$z
    ckpt=$W/$data-two$z/checkpoints/step-000006
    # On 1 rank ZeRO does nothing; test_zero.sh reshards a ZeRO checkpoint onto 1 rank already.
    [ $z = 2 ] && sizes=3
    for np in $sizes; do
      dir=$W/$data-z$z-on$np
      run $np "$dir" "${CFG[@]}" parallel.zero_stage=$z checkpoint.resume="$ckpt"
      grep -q "resumed from .*step-000006 at step 6 (epoch 1, batch [0-9]* of [0-9]* (sample 24 of the epoch).*written by 2 rank(s), now $np" "$dir.log" \
        || { grep resumed "$dir.log"; fail "$data zero $z: no resume at sample 24 of epoch 1 on $np ranks"; }
      [ "$(position "$dir/checkpoints/step-000012")" = "$(position "$W/$data-ref$np/checkpoints/step-000012")" ] \
        || fail "$data zero $z on $np ranks: position $(position "$dir/checkpoints/step-000012") at step 12, uninterrupted $(position "$W/$data-ref$np/checkpoints/step-000012")"
      worst=$(same_losses "$W/$data-ref$np" "$dir" 1e-5) || fail "$data zero $z: 2 -> $np ranks"
      pass "$data, zero_stage $z: 2 -> $np ranks, the same data position at step 12, losses 7-12 within $worst relative"
    done
  done
done

# PowerSGD's error feedback and Q are per rank: on 3 ranks they start afresh, with a warning.
PSGD=("${FASHION[@]}" parallel.compression=POWERSGD parallel.powersgd_start_step=2)
run 2 "$W/psgd2" "${PSGD[@]}"
grep -q compression.safetensors "$W/psgd2/checkpoints/step-000006/MANIFEST" || fail "no PowerSGD state in the checkpoint"
run 3 "$W/psgd-on3" "${PSGD[@]}" checkpoint.resume="$W/psgd2/checkpoints/step-000006"
grep -qF "compression.safetensors holds the PowerSGD state (parallel.compression POWERSGD) of 2 rank(s); it cannot move to 3" "$W/psgd-on3.log" \
  || { grep -i powersgd "$W/psgd-on3.log"; fail "no warning that PowerSGD's state starts afresh"; }
[ "$(position "$W/psgd-on3/checkpoints/step-000012")" = "$(position "$W/fashion-ref3/checkpoints/step-000012")" ] \
  || fail "PowerSGD 2 -> 3 ranks: another data position at step 12"
pass "PowerSGD: 2 -> 3 ranks resumes with its per-rank state started afresh (warned), the same data position"

# Bit for bit with the weights held still: with optimizer.lr 1e-30 every update is below half a
# float32 ulp of its weight (zero biases move to about 1e-30, which vanishes in every sum), so the
# losses of steps 7-12 on 3 ranks resumed from 2 equal those of an uninterrupted 3-rank run exactly
# when they read the same samples on the same ranks in the same order.
STILL=("${FASHION[@]}" parallel.zero_stage=2 optimizer.lr=1e-30 schedule.min_lr=0)
run 3 "$W/still3" "${STILL[@]}"
run 2 "$W/still2" "${STILL[@]}"
run 3 "$W/still-on3" "${STILL[@]}" checkpoint.resume="$W/still2/checkpoints/step-000006"
same_losses "$W/still3" "$W/still-on3" 0 > /dev/null || fail "weights held still: 2 -> 3 ranks not bit for bit"
pass "fashion, zero_stage 2, weights held still: steps 7-12 resumed on 3 ranks from 2 equal an uninterrupted 3-rank run bit for bit"

# Another global batch is refused before step 1, naming both values.
expect_exit2 "train.global_batch 24" -- "$KILN" train --config "$TINY" --set model.name=mlp \
  --set data.kind=FASHION_MNIST --set data.path="$W/fashion" --set train.steps=12 --set train.batch_per_gpu=4 \
  --set train.global_batch=12 --set logging.dir="$W/other" --set checkpoint.resume="$W/fashion-two0/checkpoints/step-000006"
grep -qF "this run's is 12" "$W/out.log" || { cat "$W/out.log"; fail "the refusal does not name this run's global batch"; }
grep -qF -- "--set train.global_batch=24" "$W/out.log" || { cat "$W/out.log"; fail "the refusal does not say what to set"; }
pass "another global batch is refused: $(grep -o 'written with train.global_batch.*' "$W/out.log" | cut -c1-120)..."
