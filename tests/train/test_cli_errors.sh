#!/usr/bin/env bash
# Bad input on the command line: each case exits with the documented code and a message naming
# the file, field or checkpoint, within 5 s, without a stack trace.
source "$(dirname "$0")/lib.sh"
expect() {  # expected-code message-fragment -- command...
  local want=$1 fragment=$2; shift 3
  local start code=0
  start=$(date +%s)
  timeout 30 "$@" > "$WORK/out" 2>&1 || code=$?
  local took=$(( $(date +%s) - start ))
  [ "$code" = "$want" ] || { cat "$WORK/out"; fail "exit $code (want $want): $*"; }
  grep -qF -- "$fragment" "$WORK/out" || { cat "$WORK/out"; fail "message lacks '$fragment': $*"; }
  [ "$took" -le 5 ] || fail "took ${took}s: $*"
  ! grep -qiE "terminate called|stack trace|Segmentation|Aborted" "$WORK/out" || fail "crash output: $*"
}
printf 'model { name: "fashion_cnn" }\ntrain { stepz: 3 }\n' > "$WORK/bad.pbtxt"
expect 2 "bad.pbtxt:2:9" -- "$KILN" train --config "$WORK/bad.pbtxt"
expect 2 "optimizer.lr" -- "$KILN" train --config "$TINY" --set optimizer.lr=-1
expect 2 "nosuch" -- "$KILN" train --config "$TINY" --set nosuch.field=1
expect 2 "cannot" -- "$KILN" train --config "$WORK/missing.pbtxt"
expect 2 "no complete checkpoint" -- "$KILN" train --config "$TINY" --set logging.dir="$WORK/empty" --resume latest
expect 2 "data.path" -- "$KILN" train --config "$TINY" --set data.kind=CIFAR10 --set data.path="$WORK/no-such-dir"
expect 2 "unknown command" -- "$KILN" trian
expect 2 "required" -- "$KILN" train
expect 2 "O2" -- "$KILN" train --config "$TINY" --set precision.opt_level=O2
expect 2 "give one of the two" -- "$KILN" eval --config "$TINY" --checkpoint latest --resume latest
expect 2 "model.init_from = \"/dev/zero\": is a character device" -- "$KILN" train --config "$TINY" --set model.init_from=/dev/zero
# Paths that are not regular files: a directory is said to be one (never read, never "truncated").
expect 2 "directory" -- "$KILN" train --config "$TINY" --set model.init_from="$WORK"
expect 2 "directory" -- "$KILN" train --config "$WORK"
# A FIFO blocks a reader forever, /dev/zero never ends: both refused at once (issue 32).
mkfifo "$WORK/fifo"
expect 2 "a FIFO (named pipe)" -- "$KILN" train --config "$WORK/fifo"
expect 2 "a character device" -- "$KILN" train --config /dev/zero
expect 2 "model.init_from = \"$WORK/fifo\": is a FIFO" -- "$KILN" train --config "$TINY" --set model.init_from="$WORK/fifo"
# A warmup longer than the steps train.epochs makes: refused before step 1, in field names, once.
expect 2 "schedule.warmup_steps = 100000: must be less than the 30 optimizer steps train.epochs = 0.5 makes" -- \
  "$KILN" train --config "$TINY" --set data.kind=FASHION_MNIST --set train.epochs=0.5 \
  --set train.batch_per_gpu=1000 --set schedule.warmup_steps=100000 --set logging.dir="$WORK/warm"
[ "$(grep -c "schedule.warmup_steps" "$WORK/out")" = 1 ] || { cat "$WORK/out"; fail "the warmup error is not said once"; }
! grep -q "lr schedule" "$WORK/out" || fail "the warmup error is in the schedule's words, not the fields'"
# Validation of the experiment's values (kiln config): a name no directory can have, a subnormal
# learning rate (a number, if a useless one), a huge global batch's suggestions.
expect 2 "must be at most 255 characters" -- "$KILN" config --config "$TINY" --set name="$(printf 'x%.0s' $(seq 300))"
"$KILN" config --config "$TINY" --set optimizer.lr=1e-320 > "$WORK/lr.txt" 2>&1 || { cat "$WORK/lr.txt"; fail "lr=1e-320 refused"; }
expect 2 "too small for a double" -- "$KILN" config --config "$TINY" --set optimizer.lr=1e-400
expect 2 "9223372036854775806 (multiples of 2)" -- "$KILN" config --config "$TINY" --set train.batch_per_gpu=2 --set train.global_batch=9223372036854775807
! grep -q -- "-9223" "$WORK/out" || { cat "$WORK/out"; fail "a negative global batch suggested"; }

# A corrupt checkpoint is refused before step 1, naming the file and the reason.
"$KILN" train --config "$TINY" --set train.steps=2 --set logging.dir="$WORK/c" --quiet > /dev/null 2>&1 || fail "setup run"
ck="$WORK/c/checkpoints/step-000002"
cp -r "$ck" "$WORK/keep"
python3 - "$ck/model.safetensors" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read()); b[-5] ^= 0x01; open(p, "wb").write(b)
PY
expect 2 "model.safetensors: checksum mismatch" -- "$KILN" train --config "$TINY" --set logging.dir="$WORK/c" --resume latest
rm -rf "$ck"; cp -r "$WORK/keep" "$ck"
truncate -s 100 "$ck/optimizer.safetensors"
expect 2 "optimizer.safetensors: size 100 bytes" -- "$KILN" train --config "$TINY" --set logging.dir="$WORK/c" --resume latest
rm -rf "$ck"; cp -r "$WORK/keep" "$ck"
expect 2 "checkpoint of model 'fashion_cnn'" -- "$KILN" train --config "$TINY" --set model.name=mlp --set logging.dir="$WORK/c" --resume latest
expect 2 "different model configuration" -- "$KILN" train --config "$TINY" --set model.num_classes=7 --set logging.dir="$WORK/c" --resume latest
# step-N directories without a MANIFEST: --resume latest names what it skips, and with only those
# refuses instead of starting fresh beside them (issue 32).
"$KILN" train --config "$TINY" --set train.steps=4 --set checkpoint.every_steps=2 --set logging.dir="$WORK/m" --quiet > /dev/null 2>&1 || fail "setup run (manifests)"
rm "$WORK/m/checkpoints/step-000004/MANIFEST"
"$KILN" train --config "$TINY" --set train.steps=4 --set checkpoint.every_steps=2 --set logging.dir="$WORK/m" --resume latest > "$WORK/out" 2>&1 || { cat "$WORK/out"; fail "resume beside a directory without a MANIFEST"; }
grep -qF "warning: --resume latest skips 1 checkpoint directory in $WORK/m/checkpoints: $WORK/m/checkpoints/step-000004 (no MANIFEST" "$WORK/out" || { cat "$WORK/out"; fail "the skipped directory is not named"; }
grep -qF "resumed from $WORK/m/checkpoints/step-000002 at step 2" "$WORK/out" || { cat "$WORK/out"; fail "did not resume from step 2"; }
# The readers of "latest" say the same (kiln export; kiln sample shares the store's rule).
rm "$WORK/m/checkpoints/step-000004/MANIFEST"
"$KILN" export --config "$TINY" --set logging.dir="$WORK/m" --onnx "$WORK/m.onnx" > "$WORK/out" 2>&1 || { cat "$WORK/out"; fail "export beside a directory without a MANIFEST"; }
grep -qF "kiln export: warning: --checkpoint latest skips 1 checkpoint directory in $WORK/m/checkpoints: $WORK/m/checkpoints/step-000004 (no MANIFEST" "$WORK/out" || { cat "$WORK/out"; fail "export: the skipped directory is not named"; }
grep -qF "; reading $WORK/m/checkpoints/step-000002" "$WORK/out" || { cat "$WORK/out"; fail "export: not the newest complete checkpoint"; }
rm "$WORK"/m/checkpoints/step-*/MANIFEST
expect 2 "--resume latest: no complete checkpoint in $WORK/m/checkpoints, only $WORK/m/checkpoints/step-000002, $WORK/m/checkpoints/step-000004 (no MANIFEST" -- "$KILN" train --config "$TINY" --set logging.dir="$WORK/m" --resume latest
expect 2 "checkpoint.resume latest: no complete checkpoint" -- "$KILN" train --config "$TINY" --set logging.dir="$WORK/m" --set checkpoint.resume=latest
! grep -q "starting fresh" "$WORK/out" || fail "started fresh beside checkpoint directories"

# model.init_from read strictly: an I32 tensor for a float weight, a NaN weight (issue 32).
python3 - "$WORK/keep/model.safetensors" "$WORK" <<'PY'
import json, struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", b[:8])[0]
header = json.loads(b[8:8 + n])
name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
begin = 8 + n + header[name]["data_offsets"][0]
nan = bytearray(b); nan[begin:begin + 4] = struct.pack("<f", float("nan"))
open(sys.argv[2] + "/nan.safetensors", "wb").write(nan)
i32 = bytearray(b); at = i32.index(b'"F32"', 8); i32[at:at + 5] = b'"I32"'
open(sys.argv[2] + "/i32.safetensors", "wb").write(i32)
PY
expect 2 "non-finite value(s)" -- "$KILN" train --config "$TINY" --set logging.dir="$WORK/nan" --set model.init_from="$WORK/nan.safetensors"
grep -qF "$WORK/nan.safetensors: parameter '" "$WORK/out" || { cat "$WORK/out"; fail "the NaN weight's file and tensor are not named"; }
expect 2 "is i32, the model holds it as f32" -- "$KILN" train --config "$TINY" --set logging.dir="$WORK/i32" --set model.init_from="$WORK/i32.safetensors"
pass "command-line and checkpoint errors"
