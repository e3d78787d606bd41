#!/usr/bin/env bash
# train.cuda_graphs on the CPU (label cpu): nothing is captured there, but the optimizer's step
# state goes resident exactly as on CUDA (the skip decision, the loss scale, the step counts and
# the learning rate read from memory, no host read inside a step). It must change nothing: the
# same losses, weights, optimizer and scaler state as without it, with a dynamic loss scaler that
# grows and backs off, gradient accumulation, an injected inf (the same step skipped) and an exact
# resume. Without a loss scaler an inf/NaN gradient still stops the run naming its step.
source "$(dirname "$0")/lib.sh"
BASE=(--config "$TINY" --set train.steps=6 --set checkpoint.every_steps=3
      --set precision.opt_level=O1 --set precision.half=BF16 --set precision.loss_scale.dynamic=true
      --set precision.loss_scale.init_scale=1024 --set precision.loss_scale.growth_interval=2
      --set optimizer.max_grad_norm=0.5 --set train.global_batch=32 --set model.dropout=0.1)
# A checkpoint's state.pbtxt without the experiment it embeds (which names the setting itself).
state() { sed -e '/^experiment_hash:/d' -e '/^experiment {/,/^}/d' "$1/checkpoints/step-000006/state.pbtxt"; }
run() {  # name cuda_graphs [env...]
  local name=$1 graphs=$2; shift 2
  env "$@" "$KILN" train "${BASE[@]}" --set train.cuda_graphs="$graphs" \
    --set logging.dir="$WORK/$name" > "$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "run $name"; }
}
run eager false
run resident true
grep -q "cuda_graphs: the CPU has nothing to capture" "$WORK/resident.log" || { cat "$WORK/resident.log"; fail "no cuda_graphs line"; }
grep -q "cuda_graphs" "$WORK/eager.log" && fail "cuda_graphs line without the setting"
same_run "$WORK/eager" "$WORK/resident" 6
diff <(state "$WORK/eager") <(state "$WORK/resident") || fail "scaler or step state differs"
pass "resident step state: 6 steps (accumulation 2, dynamic scaler, clipping) equal the host path bit for bit"

run eager_inf false KILN_FAULT_KIND=inf-grad KILN_FAULT_STEP=2
run resident_inf true KILN_FAULT_KIND=inf-grad KILN_FAULT_STEP=2
same_run "$WORK/eager_inf" "$WORK/resident_inf" 6
grep -q "skipped_steps: 1" "$WORK/resident_inf/checkpoints/step-000006/state.pbtxt" \
  || { cat "$WORK/resident_inf/checkpoints/step-000006/state.pbtxt"; fail "the injected inf was not skipped"; }
diff <(state "$WORK/eager_inf") <(state "$WORK/resident_inf") || fail "scaler state differs after the skipped step"
pass "an injected inf: the same step skipped, the same weights and scaler state"

# Resume: 3 steps, a new process, 3 more, against the 6 uninterrupted resident steps.
run resumed true
rm -rf "$WORK/resumed/checkpoints/step-000006"
keep_until "$WORK/resumed/metrics.jsonl" 3
"$KILN" train "${BASE[@]}" --set train.cuda_graphs=true --set logging.dir="$WORK/resumed" --resume latest \
  > "$WORK/resumed2.log" 2>&1 || { cat "$WORK/resumed2.log"; fail "resumed run"; }
same_run "$WORK/resident" "$WORK/resumed" 6
pass "resident step state resumes bit for bit"

# No scaler (bf16 O1 without loss scaling): the inf stops the run, naming the step.
code=0
env KILN_FAULT_KIND=inf-grad KILN_FAULT_STEP=1 "$KILN" train "${BASE[@]}" --set train.cuda_graphs=true \
  --set precision.loss_scale.dynamic=false --set logging.dir="$WORK/noscaler" > "$WORK/noscaler.log" 2>&1 || code=$?
[ "$code" != 0 ] || { cat "$WORK/noscaler.log"; fail "no error for an inf without a scaler"; }
grep -q "non-finite gradients (inf/NaN) at step 2" "$WORK/noscaler.log" || { cat "$WORK/noscaler.log"; fail "error does not name step 2"; }
pass "without a scaler an inf gradient stops the run naming its step"

# Two ranks over MPI: the found-inf flag is all-reduced inside the resident step, so every rank
# skips the same steps without asking the host.
mpi_run() {  # name cuda_graphs
  env KILN_FAULT_KIND=inf-grad KILN_FAULT_STEP=2 KILN_FAULT_RANK=1 "${MPIRUN[@]}" -np 2 "$KILN" train \
    "${BASE[@]}" --set train.cuda_graphs="$2" --set logging.dir="$WORK/$1" > "$WORK/$1.log" 2>&1 \
    || { cat "$WORK/$1.log"; fail "run $1 (2 ranks)"; }
}
mpi_run eager_np2 false
mpi_run resident_np2 true
same_run "$WORK/eager_np2" "$WORK/resident_np2" 6
diff <(state "$WORK/eager_np2") <(state "$WORK/resident_np2") || fail "2 ranks: scaler state differs"
grep -q "skipped_steps: 1" "$WORK/resident_np2/checkpoints/step-000006/state.pbtxt" \
  || fail "2 ranks: rank 1's inf was not skipped on both"
pass "2 ranks, an inf on rank 1: resident = host path bit for bit, the step skipped on both"
