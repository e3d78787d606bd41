#!/usr/bin/env bash
# Faults during training, each on real processes under mpirun (fault injection through
# KILN_FAULT_KIND / KILN_FAULT_STEP / KILN_FAULT_RANK, read by the trainer):
#   dead rank (SIGKILL) and a rank exiting with code 3: the job ends non-zero within 60 s, naming
#   the rank; resuming from the last checkpoint reproduces the reference losses bit for bit;
#   an inf in one rank's gradients: every rank skips the step, weights unchanged, scale halved;
#   an overflow every step: a clear error once the scale reaches its minimum;
#   a NaN loss without a loss scaler: the run ends at that step, naming step and rank;
#   an experiment differing between ranks: refused before training;
#   an impossible batch: every rank exits within 60 s with requested and in-use bytes.
source "$(dirname "$0")/lib.sh"
np2() { "${MPIRUN[@]}" -np 2 "$@"; }
STEPS=60
np2 "$KILN" train --config "$TINY" --set train.steps=$STEPS --set logging.dir="$WORK/ref" --quiet > "$WORK/ref.log" 2>&1 \
  || { cat "$WORK/ref.log"; fail "reference run"; }

# Dead rank at step 50, then resume from the step-50 checkpoint.
took=$(KILN_FAULT_KIND=kill KILN_FAULT_STEP=50 KILN_FAULT_RANK=1 timed 60 1 "$WORK/kill.log" -- \
  np2 "$KILN" train --config "$TINY" --set train.steps=$STEPS --set logging.dir="$WORK/k")
grep -qiE "rank 1 .*(signal 9|killed)|process rank 1" "$WORK/kill.log" || { cat "$WORK/kill.log"; fail "the log does not name rank 1"; }
[ -d "$WORK/k/checkpoints/step-000050" ] || fail "no step-50 checkpoint"
np2 "$KILN" train --config "$TINY" --set train.steps=$STEPS --set logging.dir="$WORK/k" --resume latest --quiet > "$WORK/k2.log" 2>&1 \
  || { cat "$WORK/k2.log"; fail "resume after the dead rank"; }
diff <(losses "$WORK/ref/metrics.jsonl") <(losses "$WORK/k/metrics.jsonl") || fail "losses after resume differ"
pass "dead rank: job ended in ${took}s naming rank 1; resume matches the reference"

took=$(KILN_FAULT_KIND=exit3 KILN_FAULT_STEP=5 KILN_FAULT_RANK=1 timed 60 1 "$WORK/exit3.log" -- \
  np2 "$KILN" train --config "$TINY" --set logging.dir="$WORK/e")
pass "rank 1 exiting with code 3: job ended non-zero in ${took}s"

# Mixed precision on the CPU: bf16 O1 with a dynamic scaler (init 2^16).
AMP=(--set model.name=mlp --set precision.opt_level=O1 --set precision.half=BF16 --set precision.loss_scale.dynamic=true
     --set checkpoint.every_steps=1 --set train.steps=8)
KILN_FAULT_KIND=inf-grad KILN_FAULT_STEP=4 KILN_FAULT_RANK=1 np2 "$KILN" train --config "$TINY" "${AMP[@]}" \
  --set logging.dir="$WORK/inf" --quiet > "$WORK/inf.log" 2>&1 || { cat "$WORK/inf.log"; fail "inf run"; }
python3 - "$WORK/inf/metrics.jsonl" <<'PY' || fail "scale after the injected inf"
import json, sys
scales = {r["step"]: r["loss_scale"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r}
assert scales[5] == 65536 and scales[6] == 32768, scales
PY
cmp "$WORK/inf/checkpoints/step-000004/model.safetensors" "$WORK/inf/checkpoints/step-000005/model.safetensors" \
  || fail "weights changed on the skipped step"
pass "inf in rank 1's gradients at step 5: skipped on every rank, weights unchanged, scale halved"

timed 60 1 "$WORK/always.log" -- env KILN_FAULT_KIND=inf-grad-always KILN_FAULT_STEP=0 KILN_FAULT_RANK=0 \
  "$KILN" train --config "$TINY" "${AMP[@]}" --set train.steps=40 --set checkpoint.every_steps=0 --set logging.dir="$WORK/al" > /dev/null
grep -qi "min" "$WORK/always.log" || { cat "$WORK/always.log"; fail "no minimum-scale message"; }
pass "overflow every step: stopped with '$(grep -i min "$WORK/always.log" | head -1 | cut -c1-120)'"

timed 60 1 "$WORK/nan.log" -- env KILN_FAULT_KIND=nan-input KILN_FAULT_STEP=3 KILN_FAULT_RANK=1 \
  "${MPIRUN[@]}" -np 2 "$KILN" train --config "$TINY" --set precision.opt_level=O1 --set precision.half=BF16 \
  --set model.name=mlp --set logging.dir="$WORK/nan" > /dev/null
grep -q "at step 4 on rank" "$WORK/nan.log" || { cat "$WORK/nan.log"; fail "NaN message lacks step and rank"; }
pass "NaN loss in bf16 ended the run at step 4, naming the rank"

timed 30 1 "$WORK/differ.log" -- "${MPIRUN[@]}" -np 1 "$KILN" train --config "$TINY" --set logging.dir="$WORK/d" --set optimizer.lr=1e-3 \
  : -np 1 "$KILN" train --config "$TINY" --set logging.dir="$WORK/d" --set optimizer.lr=2e-3 > /dev/null
grep -qi "differ" "$WORK/differ.log" || { cat "$WORK/differ.log"; fail "no message about differing experiments"; }
pass "an experiment differing between ranks is refused before training"

timed 60 1 "$WORK/oom.log" -- np2 "$KILN" train --config "$TINY" --set train.max_memory_mb=16 \
  --set train.batch_per_gpu=100000 --set logging.dir="$WORK/o" > /dev/null
grep -q "out of memory allocating" "$WORK/oom.log" && grep -q "in use" "$WORK/oom.log" || { cat "$WORK/oom.log"; fail "out-of-memory message"; }
pass "impossible batch: every rank ended with the out-of-memory message"
