#!/usr/bin/env bash
# train.offload OPTIMIZER on the CPU backend (label cpu): the optimizer on host twins of the
# parameters gives the same losses, weights and optimizer state as the optimizer beside them, bit
# for bit (AdamW; O1 bf16 with a loss scaler and an injected inf; bf16 moments; SGD); a run with
# offload resumes bit for bit; more than one rank is refused with exit 2; kiln plan moves the
# masters and moments to host memory.
source "$(dirname "$0")/lib.sh"
run() {  # dir overrides...
  local dir=$1; shift
  local sets=() opt; for opt in "$@"; do sets+=(--set "$opt"); done
  "$KILN" train --config "$TINY" --set logging.dir="$dir" "${sets[@]}" > "$dir.log" 2>&1 \
    || { tail -30 "$dir.log"; fail "run $dir ($*)"; }
}
# Every tensor of both checkpoint files equal byte for byte (the files' metadata left out).
same_tensors() {  # a-dir b-dir step
  python3 - "$1" "$2" "$(printf 'step-%06d' "$3")" <<'PY'
import json, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(n)), f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items()
            if k != "__metadata__"}
a_dir, b_dir, step = sys.argv[1:]
for f in ("model.safetensors", "optimizer.safetensors"):
    a, b = tensors(f"{a_dir}/checkpoints/{step}/{f}"), tensors(f"{b_dir}/checkpoints/{step}/{f}")
    assert a.keys() == b.keys() and a, (f, sorted(a)[:4], sorted(b)[:4])
    changed = [k for k in a if a[k] != b[k]]
    if changed: sys.exit(f"{f}: tensors differ: " + ", ".join(changed[:5]))
PY
}
W=$WORK
SCALED=(precision.opt_level=O1 precision.half=BF16 precision.loss_scale.dynamic=true
        precision.loss_scale.init_scale=1024)
for case in adamw scaled bf16 sgd; do
  case $case in
    adamw) o=() ;;
    scaled) o=("${SCALED[@]}") ;;
    bf16) o=(optimizer.moments_dtype=BF16 precision.opt_level=O1 precision.half=BF16) ;;
    sgd) o=(optimizer.kind=SGD optimizer.lr=0.05 optimizer.momentum=0.9) ;;
  esac
  for offload in OFFLOAD_NONE OPTIMIZER; do
    if [ "$case" = scaled ]; then
      KILN_FAULT_KIND=inf-grad KILN_FAULT_STEP=5 run "$W/$case-$offload" "${o[@]}" train.offload=$offload
      [ "$(grep -c 'step skipped: inf/NaN' "$W/$case-$offload.log")" = 1 ] \
        || { tail -20 "$W/$case-$offload.log"; fail "$case $offload: the injected inf did not skip one step"; }
    else
      run "$W/$case-$offload" "${o[@]}" train.offload=$offload
    fi
  done
  diff <(losses "$W/$case-OFFLOAD_NONE/metrics.jsonl") <(losses "$W/$case-OPTIMIZER/metrics.jsonl") \
    || fail "$case: the losses with offload differ"
  same_tensors "$W/$case-OFFLOAD_NONE" "$W/$case-OPTIMIZER" 20 || fail "$case: the checkpoints with offload differ"
  pass "$case: train.offload OPTIMIZER equals the optimizer on the device bit for bit over 20 steps"
done

# Resume: 10 steps and a checkpoint, a new process, 10 more, equal 20 uninterrupted.
run "$W/resumed" train.offload=OPTIMIZER
rm -rf "$W/resumed/checkpoints/step-000020"
keep_until "$W/resumed/metrics.jsonl" 10
"$KILN" train --config "$TINY" --set logging.dir="$W/resumed" --set train.offload=OPTIMIZER \
  --resume latest > "$W/resumed2.log" 2>&1 || { tail -30 "$W/resumed2.log"; fail "resumed run"; }
same_run "$W/adamw-OPTIMIZER" "$W/resumed" 20
pass "offload: 10 + 10 steps after a resume equal 20 uninterrupted bit for bit"

expect_exit2 "offload runs one rank per run" -- "${MPIRUN[@]}" -np 2 "$KILN" train --config "$TINY" \
  --set logging.dir="$W/np2" --set train.offload=OPTIMIZER
pass "offload with 2 ranks is refused: $(grep -m1 -o 'train.offload = OPTIMIZER with 2 ranks[^;]*' "$WORK/out.log")"

"$KILN" plan --config "$TINY" --world-size 1 --set train.offload=OPTIMIZER --json > "$W/plan.json" 2> "$W/plan.err" \
  || { cat "$W/plan.err"; fail "kiln plan with offload"; }
"$KILN" plan --config "$TINY" --world-size 1 --json > "$W/plan0.json" 2> "$W/plan0.err" || { cat "$W/plan0.err"; fail "kiln plan"; }
python3 - "$W/plan.json" "$W/plan0.json" <<'PY' || fail "kiln plan does not move the optimizer to the host"
import json, sys
off, dev = (json.loads(open(p).read().strip().splitlines()[-1]) for p in sys.argv[1:])
o, d = off["plans"][0], dev["plans"][0]
assert [p["zero_stage"] for p in off["plans"]] == [0, 0], off["plans"]
assert o["master_mb"] == 0 and o["moments_mb"] == 0 and d["moments_mb"] > 0, (o, d)
expected = d["master_mb"] + d["moments_mb"] + d["weights_mb"] + d["gradients_mb"]
assert abs(o["host_mb"] - expected) < 1e-6 and d["host_mb"] == 0, (o, d)
state = lambda p: p["weights_mb"] + p["gradients_mb"] + p["master_mb"] + p["moments_mb"]
assert state(o) == d["weights_mb"] + d["gradients_mb"], (o, d)
PY
pass "kiln plan: with offload the masters and moments are host memory"
