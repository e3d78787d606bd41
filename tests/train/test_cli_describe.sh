#!/usr/bin/env bash
# The commands that describe a job without running it: `kiln config` validates for the world it
# names (a login node without a GPU describes an 8-GPU job), and `kiln model` describes the
# model `kiln train` builds.
source "$(dirname "$0")/lib.sh"

# bert_base names train.device CUDA; this machine may have no GPU: kiln config still describes it.
"$KILN" config --config "$SRC/configs/bert_base.pbtxt" --world-size 8 > "$WORK/config.txt" 2>&1 \
  || { cat "$WORK/config.txt"; fail "kiln config of bert_base for 8 ranks"; }
grep -q '^name: "bert_base"' "$WORK/config.txt" || { cat "$WORK/config.txt"; fail "no experiment printed"; }
grep -qF "# batch plan for 8 rank(s): 64 per GPU x 8 accumulation x 8 = 4096 global" "$WORK/config.txt" \
  || { cat "$WORK/config.txt"; fail "no batch plan for 8 ranks"; }
# train.cuda_graphs: unset, it is filled from the device the run gets (tiny.pbtxt: the CPU).
"$KILN" config --config "$TINY" > "$WORK/default.txt" 2>&1 || { cat "$WORK/default.txt"; fail "kiln config of tiny"; }
grep -q "cuda_graphs: false" "$WORK/default.txt" || { cat "$WORK/default.txt"; fail "train.cuda_graphs default not shown"; }
# and described as set when set.
"$KILN" config --config "$TINY" --set train.cuda_graphs=true > "$WORK/graphs.txt" 2>&1 \
  || { cat "$WORK/graphs.txt"; fail "train.cuda_graphs=true refused"; }
grep -q "cuda_graphs: true" "$WORK/graphs.txt" || { cat "$WORK/graphs.txt"; fail "train.cuda_graphs not shown"; }

# kiln model --name mlp and a trained mlp have the same parameters (hidden widths from the schema).
described=$("$KILN" model --name mlp --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["parameters"])')
"$KILN" train --config "$TINY" --set model.name=mlp --set train.steps=2 --set logging.dir="$WORK/mlp" \
  > "$WORK/mlp.log" 2>&1 || { cat "$WORK/mlp.log"; fail "training the mlp"; }
trained=$(sed -n 's/^training mlp (\([0-9]*\) parameters).*/\1/p' "$WORK/mlp.log")
[ -n "$trained" ] || { cat "$WORK/mlp.log"; fail "no parameter count in the training log"; }
[ "$described" = "$trained" ] || fail "kiln model says $described parameters, kiln train built $trained"
# 784-512-256-10: the default widths [512, 256] of configs/kiln.proto.
[ "$trained" = $(( 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10 )) ] || fail "mlp of $trained parameters"
# kiln config shows enum fields at their first value (protobuf's printer hides them there).
"$KILN" config --config "$TINY" --set optimizer.kind=ADAMW --set train.device=AUTO > "$WORK/enums.txt" 2>&1 \
  || { cat "$WORK/enums.txt"; fail "kiln config of tiny with first-value enums"; }
for line in "  kind: ADAMW" "  device: AUTO" "  opt_level: O0" "  kind: SYNTHETIC"; do
  grep -qx "$line" "$WORK/enums.txt" || { cat "$WORK/enums.txt"; fail "kiln config hides '$line'"; }
done
"$KILN" config --config "$TINY" --set data.kind=FASHION_MNIST > "$WORK/fashion.txt" 2>&1 || fail "kiln config fashion"
grep -qx "  kind: FASHION_MNIST" "$WORK/fashion.txt" || { cat "$WORK/fashion.txt"; fail "kiln config hides data.kind"; }

# kiln bench of fashion_cnn runs on its own 28x28 greyscale images, and O0 is labelled fp32.
"$KILN" bench --model fashion_cnn --batch 2 --amp O0 --steps 1 --warmup 0 --device cpu > "$WORK/bench.txt" 2>&1 \
  || { cat "$WORK/bench.txt"; fail "kiln bench of fashion_cnn"; }
grep -q "^fashion_cnn batch 2/GPU x 1 GPU(s) of 1x28x28 images, O0 fp32 on cpu" "$WORK/bench.txt" \
  || { cat "$WORK/bench.txt"; fail "kiln bench: not fashion_cnn's input, or O0 not labelled fp32"; }
"$KILN" bench --model fashion_cnn --batch 2 --amp O0 --steps 1 --warmup 0 --device cpu --json > "$WORK/bench.json" 2>&1 \
  || { cat "$WORK/bench.json"; fail "kiln bench --json"; }
python3 - "$WORK/bench.json" <<'PY' || fail "kiln bench --json: input or precision"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["input"] == "1x28x28 images" and r["precision"] == "fp32" and r["half"] == "none", r
# 28x28 inputs: the forward FLOPs of fashion_cnn, not of 224x224x3 images (64 times as many pixels).
assert r["gflop_per_step_per_gpu"] < 0.1, r
PY

pass "kiln config describes an 8-GPU job here and shows every enum; kiln model and kiln train agree on the mlp ($trained parameters); kiln bench of fashion_cnn on 28x28 fp32"
