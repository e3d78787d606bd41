#!/usr/bin/env bash
# train.offload OPTIMIZER on the CPU backend: the optimizer on host twins of the parameters
# (HOST_CORES) and the device kernels over state in host memory (DEVICE_KERNELS) give the same
# losses, weights and optimizer state as the optimizer beside the weights, bit for bit (AdamW; O1
# bf16 with a loss scaler and an injected inf; bf16 moments; SGD); a run with offload resumes bit
# for bit; HOST_CORES on 2 ranks (twins of each rank's ZeRO shard) and DEVICE_KERNELS with ZeRO
# train ZeRO-1's weights; DEVICE_KERNELS keeps the resident steps; OPTIMIZER_AND_WEIGHTS (ZeRO-3's
# shards in host memory) on one rank and two; kiln plan moves what each puts in host memory.
source "$(dirname "$0")/lib.sh"
run() {  # dir overrides...
  local dir=$1; shift
  local sets=() opt; for opt in "$@"; do sets+=(--set "$opt"); done
  "$KILN" train --config "$TINY" --set logging.dir="$dir" "${sets[@]}" > "$dir.log" 2>&1 \
    || { tail -30 "$dir.log"; fail "run $dir ($*)"; }
}
# Every tensor of both checkpoints' model and optimizer files equal byte for byte (the files'
# metadata left out; the optimizer file whatever its name: one or a rank's shard).
same_tensors() {  # a-dir b-dir step
  python3 - "$1" "$2" "$(printf 'step-%06d' "$3")" <<'PY'
import glob, json, struct, sys
def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(n)), f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items()
            if k != "__metadata__"}
a_dir, b_dir, step = sys.argv[1:]
for pattern in ("model.safetensors", "optimizer*.safetensors"):
    files = [glob.glob(f"{d}/checkpoints/{step}/{pattern}") for d in (a_dir, b_dir)]
    assert all(len(f) == 1 for f in files), files
    a, b = (tensors(f[0]) for f in files)
    assert a.keys() == b.keys() and a, (pattern, sorted(a)[:4], sorted(b)[:4])
    changed = [k for k in a if a[k] != b[k]]
    if changed: sys.exit(f"{pattern}: tensors differ: " + ", ".join(changed[:5]))
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
  # OPTIMIZER: the host cores' update; DEVICE: the device kernels' update over host memory.
  for offload in OFFLOAD_NONE OPTIMIZER DEVICE; do
    sets=(train.offload=$offload train.offload_update=HOST_CORES)
    [ $offload = DEVICE ] && sets=(train.offload=OPTIMIZER train.offload_update=DEVICE_KERNELS)
    if [ "$case" = scaled ]; then
      KILN_FAULT_KIND=inf-grad KILN_FAULT_STEP=5 run "$W/$case-$offload" "${o[@]}" "${sets[@]}"
      [ "$(grep -c 'step skipped: inf/NaN' "$W/$case-$offload.log")" = 1 ] \
        || { tail -20 "$W/$case-$offload.log"; fail "$case $offload: the injected inf did not skip one step"; }
    else
      run "$W/$case-$offload" "${o[@]}" "${sets[@]}"
    fi
  done
  for offload in OPTIMIZER DEVICE; do
    diff <(losses "$W/$case-OFFLOAD_NONE/metrics.jsonl") <(losses "$W/$case-$offload/metrics.jsonl") \
      || fail "$case: the losses with offload $offload differ"
    same_tensors "$W/$case-OFFLOAD_NONE" "$W/$case-$offload" 20 || fail "$case: the checkpoints with offload $offload differ"
  done
  pass "$case: train.offload OPTIMIZER (host cores, device kernels) equals the optimizer on the device bit for bit over 20 steps"
done

# Resume: 10 steps and a checkpoint, a new process, 10 more, equal 20 uninterrupted.
run "$W/resumed" train.offload=OPTIMIZER train.offload_update=HOST_CORES
rm -rf "$W/resumed/checkpoints/step-000020"
keep_until "$W/resumed/metrics.jsonl" 10
"$KILN" train --config "$TINY" --set logging.dir="$W/resumed" --set train.offload=OPTIMIZER \
  --set train.offload_update=HOST_CORES --resume latest > "$W/resumed2.log" 2>&1 || { tail -30 "$W/resumed2.log"; fail "resumed run"; }
same_run "$W/adamw-OPTIMIZER" "$W/resumed" 20
pass "offload: 10 + 10 steps after a resume equal 20 uninterrupted bit for bit"


# The device kernels' update keeps the steps resident (the CPU's stand-in for CUDA graphs) ...
run "$W/graphs-none" train.cuda_graphs=true
run "$W/graphs-device" train.cuda_graphs=true train.offload=OPTIMIZER train.offload_update=DEVICE_KERNELS
grep -q "cuda_graphs: the CPU" "$W/graphs-device.log" || fail "the device kernels' offload turned the resident steps off"
same_run "$W/graphs-none" "$W/graphs-device" 20
pass "DEVICE_KERNELS keeps the resident steps, bit for bit as without offload"

# ... and ZeRO: each rank's shard of masters and moments in its own host memory.
for dir in z1-none z1-device; do
  sets=(--set parallel.zero_stage=1)
  [ $dir = z1-device ] && sets+=(--set train.offload=OPTIMIZER --set train.offload_update=DEVICE_KERNELS)
  "${MPIRUN[@]}" -np 2 "$KILN" train --config "$TINY" --set logging.dir="$W/$dir" "${sets[@]}" \
    > "$W/$dir.log" 2>&1 || { tail -30 "$W/$dir.log"; fail "ZeRO-1 run $dir"; }
done
diff <(losses "$W/z1-none/metrics.jsonl") <(losses "$W/z1-device/metrics.jsonl") \
  || fail "ZeRO-1 on 2 ranks: the losses with the device kernels' offload differ"
for f in model.safetensors optimizer-rank-00000-of-00002.safetensors optimizer-rank-00001-of-00002.safetensors; do
  cmp "$W/z1-none/checkpoints/step-000020/$f" "$W/z1-device/checkpoints/step-000020/$f" \
    || fail "ZeRO-1 on 2 ranks: $f differs with the device kernels' offload"
done
pass "DEVICE_KERNELS with ZeRO-1 on 2 ranks equals no offload bit for bit"
# A run on 2 ranks with the given settings: the losses and weights of ZeRO-1 without offload.
like_zero1() {  # name what settings...
  local name=$1 what=$2; shift 2
  local sets=() opt; for opt in "$@"; do sets+=(--set "$opt"); done
  "${MPIRUN[@]}" -np 2 "$KILN" train --config "$TINY" --set logging.dir="$W/$name" "${sets[@]}" > "$W/$name.log" 2>&1 \
    || { tail -30 "$W/$name.log"; fail "$what: the run"; }
  diff <(losses "$W/z1-none/metrics.jsonl") <(losses "$W/$name/metrics.jsonl") || fail "$what: the losses differ from ZeRO-1's"
  cmp "$W/z1-none/checkpoints/step-000020/model.safetensors" "$W/$name/checkpoints/step-000020/model.safetensors" \
    || fail "$what: the weights differ from ZeRO-1's"
}
# ZeRO-3: the offloaded pieces update the weights' shards in place; the same weights as ZeRO-1.
like_zero1 z3-device "ZeRO-3 with the device kernels' offload" parallel.zero_stage=3 train.offload=OPTIMIZER \
  train.offload_update=DEVICE_KERNELS
pass "DEVICE_KERNELS with ZeRO-3 on 2 ranks trains the weights of ZeRO-1 without offload bit for bit"
# HOST_CORES on 2 ranks: with ZeRO each rank's host cores update host twins of its shard only
# (HostShardGroup); at stage 0 each rank the whole. Every stage trains ZeRO-1's weights bit for bit,
# and stage 1 writes its optimizer shards byte for byte.
for stage in 0 1 2 3; do
  like_zero1 host-z$stage "HOST_CORES on 2 ranks at stage $stage" parallel.zero_stage=$stage train.offload=OPTIMIZER \
    train.offload_update=HOST_CORES
done
for f in optimizer-rank-00000-of-00002.safetensors optimizer-rank-00001-of-00002.safetensors; do
  cmp "$W/z1-none/checkpoints/step-000020/$f" "$W/host-z1/checkpoints/step-000020/$f" \
    || fail "HOST_CORES with ZeRO-1 on 2 ranks: $f differs"
done
pass "HOST_CORES on 2 ranks at stages 0-3 trains ZeRO-1's weights bit for bit (stage 1: its optimizer shards too)"

# OPTIMIZER_AND_WEIGHTS: ZeRO-3's shards of the weights and of the reduced gradients in host
# memory too (on the CPU they are host memory as everything is: the arithmetic is what is tested).
# One rank with ZeRO-3 writes optimizer-rank-00000-of-00001.safetensors: same_tensors matches it.
WEIGHTS=(parallel.zero_stage=3 train.offload=OPTIMIZER_AND_WEIGHTS)
same_resumed() {  # reference-dir resumed-dir: 20 steps, the same losses and checkpoint tensors
  diff <(losses "$1/metrics.jsonl") <(losses "$2/metrics.jsonl") || fail "losses differ after resume"
  [ "$(losses "$1/metrics.jsonl" | wc -l)" = 20 ] || fail "expected 20 loss records"
  same_tensors "$1" "$2" 20 || fail "$2: the checkpoint differs from $1's"
}
for case in adamw scaled accumulated; do
  case $case in
    adamw) o=() ;;
    scaled) o=("${SCALED[@]}") ;;
    # Whole gradient buffers across the micro-steps: the order of additions of no offload.
    accumulated) o=(train.global_batch=32 parallel.zero_accumulate_in_shards=false) ;;
  esac
  if [ $case = scaled ]; then
    KILN_FAULT_KIND=inf-grad KILN_FAULT_STEP=5 run "$W/w-$case" "${o[@]}" "${WEIGHTS[@]}"
    [ "$(grep -c 'step skipped: inf/NaN' "$W/w-$case.log")" = 1 ] || fail "weights offload: the injected inf did not skip one step"
  else
    [ $case = accumulated ] && run "$W/$case-OFFLOAD_NONE" train.global_batch=32
    run "$W/w-$case" "${o[@]}" "${WEIGHTS[@]}"
  fi
  diff <(losses "$W/$case-OFFLOAD_NONE/metrics.jsonl") <(losses "$W/w-$case/metrics.jsonl") \
    || fail "$case: the losses with train.offload OPTIMIZER_AND_WEIGHTS differ"
  same_tensors "$W/$case-OFFLOAD_NONE" "$W/w-$case" 20 || fail "$case: the checkpoints with OPTIMIZER_AND_WEIGHTS differ"
  grep -q '"zero3_gathers_per_step"' "$W/w-$case/metrics.jsonl" || fail "$case: no zero3_gathers_per_step in metrics.jsonl"
done
pass "OPTIMIZER_AND_WEIGHTS on one rank (ZeRO-3's shards in host memory) equals no offload bit for bit: AdamW, O1 with an injected inf, accumulation"

# Its default with accumulation: each micro-step's gradients added into the shards, the losses
# no offload's within rounding (a micro-batch's gradient is summed before it is added).
run "$W/w-accumulated-shards" train.global_batch=32 "${WEIGHTS[@]}"
grep -q "zero_accumulate_in_shards: true" "$W/w-accumulated-shards/experiment.pbtxt" \
  || fail "OPTIMIZER_AND_WEIGHTS did not default parallel.zero_accumulate_in_shards to true"
python3 - "$W/accumulated-OFFLOAD_NONE/metrics.jsonl" "$W/w-accumulated-shards/metrics.jsonl" <<'PY' \
  || fail "accumulation in the shards: the losses differ from no offload's"
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"accumulation in the shards: largest relative loss difference {worst:.2e}")
assert len(a) == len(b) == 20 and worst <= 1e-5, worst
PY
pass "OPTIMIZER_AND_WEIGHTS accumulates in the shards by default, no offload's losses within 1e-5"

# Resumed on one rank; and its checkpoint (one rank's ZeRO-3 shards) resumed without offload.
run "$W/w-resumed" "${WEIGHTS[@]}"
rm -rf "$W/w-resumed/checkpoints/step-000020"
cp -r "$W/w-resumed" "$W/w-plain"
keep_until "$W/w-resumed/metrics.jsonl" 10
"$KILN" train --config "$TINY" --set logging.dir="$W/w-resumed" --set parallel.zero_stage=3 \
  --set train.offload=OPTIMIZER_AND_WEIGHTS --resume latest > "$W/w-resumed2.log" 2>&1 || { tail -30 "$W/w-resumed2.log"; fail "resumed run with weights offload"; }
same_resumed "$W/w-adamw" "$W/w-resumed"
keep_until "$W/w-plain/metrics.jsonl" 10
"$KILN" train --config "$TINY" --set logging.dir="$W/w-plain" --resume latest > "$W/w-plain2.log" 2>&1 \
  || { tail -30 "$W/w-plain2.log"; fail "the weights offload's checkpoint resumed without offload"; }
same_resumed "$W/adamw-OFFLOAD_NONE" "$W/w-plain"
pass "OPTIMIZER_AND_WEIGHTS: 10 + 10 steps after a resume equal 20 uninterrupted, with it and without it"

# Two ranks: the weights of ZeRO-1 without offload.
like_zero1 z3-weights "OPTIMIZER_AND_WEIGHTS on 2 ranks" "${WEIGHTS[@]}"
pass "OPTIMIZER_AND_WEIGHTS with ZeRO-3 on 2 ranks trains the weights of ZeRO-1 without offload bit for bit"

expect_exit2 "train.offload = OPTIMIZER_AND_WEIGHTS: keeps ZeRO-3's shards of the weights in host memory and parallel.zero_stage is 1" \
  -- "$KILN" train --config "$TINY" --set logging.dir="$W/bad" --set parallel.zero_stage=1 --set train.offload=OPTIMIZER_AND_WEIGHTS
expect_exit2 "train.offload_update = HOST_CORES: is not supported with train.offload OPTIMIZER_AND_WEIGHTS" \
  -- "$KILN" train --config "$TINY" --set logging.dir="$W/bad" --set parallel.zero_stage=3 --set train.offload=OPTIMIZER_AND_WEIGHTS --set train.offload_update=HOST_CORES
pass "OPTIMIZER_AND_WEIGHTS without ZeRO-3, or with the host cores' update, is refused naming the field"

# kiln plan: the masters and moments leave the device's columns for host memory; the host cores'
# update plans stage 0 only and pins twins of the weights and gradients too.
plan() {  # name overrides...
  local name=$1; shift
  local sets=() opt; for opt in "$@"; do sets+=(--set "$opt"); done
  "$KILN" plan --config "$TINY" --world-size 2 "${sets[@]}" --json > "$W/$name.json" 2> "$W/$name.err" \
    || { cat "$W/$name.err"; fail "kiln plan $name"; }
}
plan none
plan host train.offload=OPTIMIZER train.offload_update=HOST_CORES
plan device train.offload=OPTIMIZER train.offload_update=DEVICE_KERNELS
python3 - "$W/none.json" "$W/host.json" "$W/device.json" <<'PY' || fail "kiln plan does not move the optimizer to the host"
import json, sys
none, host, device = ({(p["zero_stage"], p["recompute"]): p for p in
                       json.loads(open(f).read().strip().splitlines()[-1])["plans"]} for f in sys.argv[1:])
state = lambda p: p["weights_mb"] + p["gradients_mb"] + p["master_mb"] + p["moments_mb"]
assert sorted({k[0] for k in host}) == sorted({k[0] for k in device}) == [0, 1, 2, 3], (host, device)
for key, d in none.items():
    assert d["moments_mb"] > 0 and d["host_mb"] == 0, d
    # HOST_CORES' twins: of the whole weights and gradients at stage 0, of a rank's half with ZeRO.
    base = none[(0, key[1])]
    twins = (base["weights_mb"] + base["gradients_mb"]) / (1 if key[0] == 0 else 2)
    for plan, twins in ((device.get(key), 0), (host.get(key), twins)):
        if plan is None: continue
        assert plan["master_mb"] == 0 and plan["moments_mb"] == 0, plan
        assert state(plan) == d["weights_mb"] + d["gradients_mb"], (plan, d)
        assert abs(plan["host_mb"] - (d["master_mb"] + d["moments_mb"] + twins)) < 1e-6, (plan, d)
PY
pass "kiln plan: with offload the masters and moments (ZeRO's shard of them) are host memory, plus twins (of the shard) for HOST_CORES"
plan weights parallel.zero_stage=3 train.offload=OPTIMIZER_AND_WEIGHTS
python3 - "$W/none.json" "$W/weights.json" <<'PY' || fail "kiln plan does not move ZeRO-3's shards to the host"
import json, sys
none, weights = ([p for p in json.loads(open(f).read().strip().splitlines()[-1])["plans"]] for f in sys.argv[1:])
assert weights and all(p["zero_stage"] == 3 and p["offload"] and p["offload_weights"] for p in weights), weights
d = next(p for p in none if p["zero_stage"] == 0 and p["recompute"] == "NONE")
for p in weights:
    assert p["master_mb"] == 0 and p["moments_mb"] == 0 and p["weights_mb"] <= d["weights_mb"], p
    host = (d["master_mb"] + d["moments_mb"] + d["weights_mb"] + d["gradients_mb"]) / 2
    assert abs(p["host_mb"] - host) < 1e-6, (p, host)
PY
pass "kiln plan: OPTIMIZER_AND_WEIGHTS plans stage 3 with the shards of weights and gradients in host memory too"

# --host-memory-mb: the rows with offload follow the device's and count every rank's pinned share
# of a node: 26 MiB per GPU fits only with offload; 5 MiB of host memory for 2 ranks fits stage 1's
# 1.6 MiB shares, not stage 0's 3.2; 2 MiB none.
host_plan() {  # host-mb exit-code expected-verdict
  local code=0
  "$KILN" plan --config "$TINY" --world-size 2 --memory-mb 26 --host-memory-mb "$1" > "$W/hp.txt" 2>&1 || code=$?
  [ "$code" = "$2" ] || { cat "$W/hp.txt"; fail "kiln plan --host-memory-mb $1: exit $code, not $2"; }
  grep -q "$3" "$W/hp.txt" || { cat "$W/hp.txt"; fail "kiln plan --host-memory-mb $1: no '$3'"; }
}
host_plan 1000 0 "^batch 16 fits with parallel.zero_stage 0, train.recompute NONE, train.offload OPTIMIZER"
grep -q "(train.offload OPTIMIZER_AND_WEIGHTS)$" "$W/hp.txt" || { cat "$W/hp.txt"; fail "kiln plan --host-memory-mb: no OPTIMIZER_AND_WEIGHTS rows"; }
host_plan 5 0 "^batch 16 fits with parallel.zero_stage 1, train.recompute NONE, train.offload OPTIMIZER"
host_plan 2 1 "^batch 16 fits in no combination"
expect_exit2 "--host-memory-mb must be positive" -- "$KILN" plan --config "$TINY" --world-size 2 --host-memory-mb 0
expect_exit2 "--gpus-per-node must be between 1 and --world-size 2" -- "$KILN" plan --config "$TINY" --world-size 2 --gpus-per-node 3
pass "kiln plan --host-memory-mb: offload rows after the device's, the first that fits both limits"
