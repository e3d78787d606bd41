#!/usr/bin/env bash
# kiln export's refusals: each exits 2 with a message saying what to do, and leaves no file.
source "$(dirname "$0")/lib.sh"

expect_refusal() {  # pattern -- command...
  local pattern=$1; shift 2
  local code=0
  "$@" > "$WORK/out.log" 2>&1 || code=$?
  [ "$code" = 2 ] || { cat "$WORK/out.log"; fail "expected exit 2, got $code: $*"; }
  grep -q -- "$pattern" "$WORK/out.log" || { cat "$WORK/out.log"; fail "no '$pattern' in the message"; }
  [ ! -e "$WORK/m.onnx" ] || fail "a refused export left $WORK/m.onnx"
  pass "$(head -c 160 "$WORK/out.log")"
}
L=(--set logging.dir="$WORK/run")
expect_refusal "no complete checkpoint in .*--random-init" -- "$KILN" export --config "$TINY" "${L[@]}" --onnx "$WORK/m.onnx"
expect_refusal "opset 13 is not supported" -- "$KILN" export --config "$TINY" "${L[@]}" --random-init --opset 13 --onnx "$WORK/m.onnx"
expect_refusal "exclude each other" -- "$KILN" export --config "$TINY" "${L[@]}" --random-init --checkpoint "$WORK" --onnx "$WORK/m.onnx"
expect_refusal "exclude each other" -- "$KILN" export --config "$TINY" "${L[@]}" --random-init --batch 2 --dynamic-batch --onnx "$WORK/m.onnx"
expect_refusal "must be >= 1" -- "$KILN" export --config "$TINY" "${L[@]}" --random-init --batch 0 --onnx "$WORK/m.onnx"
# A target that is not a regular file is refused, never replaced (as root, a rename over /dev/null
# would replace the system's device node); so is an empty path.
mkfifo "$WORK/fifo"; mkdir "$WORK/folder"
for target in /dev/null "$WORK/fifo" "$WORK/folder"; do
  expect_refusal "$target: --onnx would replace a" -- "$KILN" export --config "$TINY" "${L[@]}" --random-init --onnx "$target"
done
[ -c /dev/null ] || fail "/dev/null is no longer a character device"
[ -p "$WORK/fifo" ] && [ -d "$WORK/folder" ] || fail "the FIFO or the folder was replaced"
[ -z "$(ls /dev "$WORK" | grep '\.tmp\.')" ] || fail "a refused export left a temporary file"
expect_refusal "--onnx: the output path is empty" -- "$KILN" export --config "$TINY" "${L[@]}" --random-init --onnx ""
"$KILN" train --config "$TINY" "${L[@]}" --quiet > "$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "train"; }
expect_refusal "checkpoint of model 'fashion_cnn'" -- "$KILN" export --config "$TINY" "${L[@]}" --set model.name=mlp --onnx "$WORK/m.onnx"
expect_refusal "no eval split" -- "$KILN" eval --config "$TINY" "${L[@]}" --set data.eval_split=none --dump-logits "$WORK/l.npy"
# kiln eval's dump files go through the same check.
expect_refusal "$WORK/fifo: the output file would replace a FIFO" -- "$KILN" eval --config "$TINY" "${L[@]}" --dump-logits "$WORK/fifo"
[ -p "$WORK/fifo" ] || fail "kiln eval replaced the FIFO"
"$KILN" export --config "$TINY" "${L[@]}" --random-init --onnx "$WORK/m.onnx" > /dev/null || fail "export"
[ -z "$(ls "$WORK" | grep '\.tmp\.')" ] || fail "a temporary file was left beside the output"
pass "a written export leaves no temporary file"
