#!/usr/bin/env bash
# The quick start's fashion_cnn, trained briefly (200 steps, 20 of warmup: the comparison is what
# matters), on the real Fashion-MNIST test set: ONNX Runtime on images read from the idx files and
# normalised from the exported metadata alone reaches kiln eval's accuracy within 0.05 %.
source "$(dirname "$0")/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
[ -d "$DATA" ] || fail "$DATA missing: scripts/install-deps.sh installs dataset-fashion-mnist"
C=(--config "$SRC/configs/fashion_mnist.pbtxt" --set logging.dir="$WORK/run" --set train.device=CPU)
"$KILN" train "${C[@]}" --set train.steps=200 --set schedule.warmup_steps=20 --set checkpoint.every_steps=200 --quiet > "$WORK/train.log" 2>&1 ||
  { tail -20 "$WORK/train.log"; fail "kiln train"; }
"$KILN" eval "${C[@]}" --json --dump-inputs "$WORK/inputs.npy" > "$WORK/eval.json" 2> "$WORK/eval.log" ||
  { cat "$WORK/eval.log"; fail "kiln eval"; }
accuracy=$(python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["samples"] == 10000, r; print(r["eval_accuracy"])' "$WORK/eval.json")
"$KILN" export "${C[@]}" --onnx "$WORK/fashion_cnn.onnx" || fail "kiln export"
python3 "$CHECK" fashion "$WORK/fashion_cnn.onnx" "$DATA" "$accuracy" "$WORK/inputs.npy" || fail "accuracy"
pass "ONNX Runtime's Fashion-MNIST accuracy equals kiln eval's"
