#!/usr/bin/env bash
# The trainer on two GPUs with NCCL (label gpu2; run by tools/gpu-check.sh on the two-GPU
# machine). With deterministic algorithms and NCCL_ALGO=Ring, fp16 O2 with a dynamic scaler:
#   exact resume: 100 steps, a checkpoint, new processes, 100 more: every loss, the weights,
#     the optimizer moments and the training state (loss scale and growth counter, RNG, data
#     position) bitwise equal to 200 uninterrupted steps;
#   dead rank (SIGKILL at step 50): the job ends non-zero within 60 s naming rank 1, and the
#     resumed run reproduces the reference losses bit for bit; rank 1 exiting with code 3;
#   an inf in rank 1's gradients: every rank skips the step, weights unchanged, scale halved;
#   ZeRO stage 2 (AdamW, LAMB) equals stage 0, and its sharded checkpoint reloads on one GPU;
#   hung rank (SIGSTOP) with a 30 s collective timeout: rank 0's watchdog names the
#     operation, its sequence number and the time waited, and the job ends within 90 s.
#   train.cuda_graphs (on by default with CUDA; every part runs graphed): 20 steps with graphs
#     equal 20 without them bit for bit, NCCL collectives inside the graphs;
# KILN_GPU_TRAINING_PARTS (default "resume graphs faults inf zero hang") selects parts; KILN_GPU_TRAINING_NP
# (default 2) the number of ranks, one GPU each (bench/scaling.sh runs the faults at 8).
source "$(dirname "$0")/lib.sh"
export NCCL_NVLS_ENABLE=0 NCCL_ALGO=Ring
PARTS=" ${KILN_GPU_TRAINING_PARTS:-resume graphs faults inf zero hang} "
want() { [[ "$PARTS" == *" $1 "* ]]; }
NP=${KILN_GPU_TRAINING_NP:-2}
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
[ "$GPUS" -ge "$NP" ] || { echo "SKIP: needs $NP GPUs ($GPUS found)"; exit 0; }
GPU=(--set train.device=CUDA --set train.deterministic=true --set precision.opt_level=O2
     --set precision.half=FP16 --set precision.loss_scale.growth_interval=30)
run_np() { "${MPIRUN[@]}" -np "$NP" "$KILN" train --config "$TINY" "${GPU[@]}" "$@"; }
# The training state of a checkpoint without what names the run's directory (its paths, and
# the experiment's hash, which covers them).
state() { grep -vE '^ *(dir|experiment_hash): ' "$1/state.pbtxt"; }
# Graphed against eager on every rank: 20 steps, accumulation 2, the bucket all-reduces inside.
if want graphs; then
for g in false true; do
  run_np --set train.steps=20 --set checkpoint.every_steps=20 --set train.global_batch=$((32 * NP)) \
    --set train.cuda_graphs=$g --set logging.dir="$WORK/graphs-$g" > "$WORK/graphs-$g.log" 2>&1 \
    || { cat "$WORK/graphs-$g.log"; fail "cuda_graphs $g run"; }
done
grep -q "cuda_graphs: captured" "$WORK/graphs-true.log" || { cat "$WORK/graphs-true.log"; fail "nothing captured"; }
same_run "$WORK/graphs-false" "$WORK/graphs-true" 20
pass "$NP GPUs: graphed = eager bit for bit over 20 steps (accumulation 2, NCCL inside the graphs)"
fi
# 1. Exact resume with mixed precision: 200 steps against 100 + 100.
if want resume; then
LONG=(--set train.steps=200 --set checkpoint.every_steps=100)
run_np "${LONG[@]}" --set logging.dir="$WORK/a" --quiet > "$WORK/a.log" 2>&1 || { cat "$WORK/a.log"; fail "reference run"; }
run_np "${LONG[@]}" --set logging.dir="$WORK/b" --quiet > "$WORK/b1.log" 2>&1 || { cat "$WORK/b1.log"; fail "first run"; }
rm -rf "$WORK/b/checkpoints/step-000200"
keep_until "$WORK/b/metrics.jsonl" 100
run_np "${LONG[@]}" --set logging.dir="$WORK/b" --resume latest > "$WORK/b2.log" 2>&1 || { cat "$WORK/b2.log"; fail "resumed run"; }
grep -q "resumed from .*step-000100 at step 100" "$WORK/b2.log" || { cat "$WORK/b2.log"; fail "resume message"; }
same_run "$WORK/a" "$WORK/b" 200
diff <(state "$WORK/a/checkpoints/step-000200") <(state "$WORK/b/checkpoints/step-000200") || fail "state differs at step 200"
scales=$(python3 -c 'import json,sys; print(sorted({r["loss_scale"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r}))' "$WORK/a/metrics.jsonl")
pass "fp16 O2 on $NP GPUs: 100 + 100 steps equal 200 uninterrupted bit for bit (losses, weights, moments, state; scales seen $scales)"
fi

# 2. Dead rank at step 50, then resume from the step-50 checkpoint; rank 1 exiting with code 3.
if want faults; then
STEPS=(--set train.steps=60)
run_np "${STEPS[@]}" --set logging.dir="$WORK/ref" --quiet > "$WORK/ref.log" 2>&1 || { cat "$WORK/ref.log"; fail "reference run"; }
took=$(KILN_FAULT_KIND=kill KILN_FAULT_STEP=50 KILN_FAULT_RANK=1 timed 60 1 "$WORK/kill.log" -- \
  run_np "${STEPS[@]}" --set logging.dir="$WORK/k")
grep -qiE "rank 1 .*(signal 9|killed)|process rank 1" "$WORK/kill.log" || { cat "$WORK/kill.log"; fail "the log does not name rank 1"; }
[ -d "$WORK/k/checkpoints/step-000050" ] || fail "no step-50 checkpoint"
run_np "${STEPS[@]}" --set logging.dir="$WORK/k" --resume latest --quiet > "$WORK/k2.log" 2>&1 || { cat "$WORK/k2.log"; fail "resume after the dead rank"; }
diff <(losses "$WORK/ref/metrics.jsonl") <(losses "$WORK/k/metrics.jsonl") || fail "losses after resume differ"
pass "dead rank on NCCL: job ended in ${took}s naming rank 1; resume matches the reference bit for bit"

took=$(KILN_FAULT_KIND=exit3 KILN_FAULT_STEP=5 KILN_FAULT_RANK=1 timed 60 1 "$WORK/exit3.log" -- \
  run_np --set logging.dir="$WORK/e")
pass "rank 1 exiting with code 3 on NCCL: job ended non-zero in ${took}s"
fi

# 3. An inf in rank 1's gradients at step 5: skipped everywhere, weights unchanged, scale halved.
if want inf; then
KILN_FAULT_KIND=inf-grad KILN_FAULT_STEP=4 KILN_FAULT_RANK=1 run_np --set train.steps=8 --set checkpoint.every_steps=1 \
  --set logging.dir="$WORK/inf" --quiet > "$WORK/inf.log" 2>&1 || { cat "$WORK/inf.log"; fail "inf run"; }
python3 - "$WORK/inf/metrics.jsonl" <<'PY' || fail "scale after the injected inf"
import json, sys
scales = {r["step"]: r["loss_scale"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r}
assert scales[6] == scales[5] / 2, scales
PY
same_parameters "$WORK/inf/checkpoints/step-000004/model.safetensors" \
  "$WORK/inf/checkpoints/step-000005/model.safetensors" || fail "weights changed on the skipped step"
pass "inf in rank 1's gradients at step 5 on NCCL: skipped on every rank, weights unchanged, scale halved"
fi

# 3b. ZeRO on NCCL (fp16 O2: fp32 masters sharded): stages 2 and 3 against stage 0 after 20 steps with
# AdamW and LAMB (clipped), weights within a few half-precision ulps; the sharded checkpoint
# reloads on one GPU.
if want zero; then
  for opt in ADAMW LAMB; do
    for z in 0 2 3; do
      run_np --set optimizer.kind=$opt --set optimizer.max_grad_norm=1 --set parallel.zero_stage=$z \
        --set logging.dir="$WORK/z$opt$z" > "$WORK/z$opt$z.log" 2>&1 || { cat "$WORK/z$opt$z.log"; fail "zero_stage $z $opt"; }
    done
    for z in 2 3; do
    python3 - "$WORK/z${opt}0/checkpoints/step-000020/model.safetensors" "$WORK/z${opt}$z/checkpoints/step-000020/model.safetensors" <<'PY' \
      || fail "$opt: zero_stage $z differs from 0 on NCCL"
import json, struct, sys
import numpy as np
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h, data = json.loads(f.read(n)), f.read()
    kinds = {"F16": np.float16, "F32": np.float32}
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], kinds[v["dtype"]]).astype(np.float64)
            for k, v in h.items() if k != "__metadata__" and v["dtype"] in kinds and "running_" not in k}
a, b = load(sys.argv[1]), load(sys.argv[2])
worst = max(float(np.max(np.abs(a[k] - b[k]) / np.maximum(np.abs(a[k]), 1e-2))) for k in a)
sys.exit(0 if worst < 4e-3 else f"max relative difference {worst:.3g}")
PY
    done
  done
  "$KILN" eval --config "$TINY" "${GPU[@]}" --set logging.dir="$WORK/zADAMW2" --set data.eval_split=train \
    --set train.eval_batches=2 > "$WORK/zeval.log" 2>&1 || { cat "$WORK/zeval.log"; fail "kiln eval of a sharded checkpoint"; }
  pass "ZeRO stages 2 and 3 on $NP GPUs (fp16 O2, AdamW and LAMB) match stage 0; a stage-2 checkpoint reloads on one GPU"
fi

# 4. Hung rank: SIGSTOP with a 30 s collective timeout (last: it is the slowest part).
if want hang; then
  took=$(KILN_FAULT_KIND=hang KILN_FAULT_STEP=5 KILN_FAULT_RANK=1 timed 90 1 "$WORK/hang.log" -- \
    timeout -s KILL 150 "${MPIRUN[@]}" -np "$NP" "$KILN" train --config "$TINY" "${GPU[@]}" \
    --set parallel.collective_timeout_s=30 --set logging.dir="$WORK/h")
  grep -qE "#[0-9]+ .*did not finish within 30 s \(waited [0-9.]+ s\)" "$WORK/hang.log" \
    || { cat "$WORK/hang.log"; fail "rank 0's watchdog message (operation, sequence number, time waited) is missing"; }
  pass "hung rank on NCCL: '$(grep -m1 -oE "[a-z_]+ #[0-9]+ .*waited [0-9.]+ s\)" "$WORK/hang.log")'; job ended in ${took}s"
fi
