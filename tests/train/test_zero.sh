#!/usr/bin/env bash
# ZeRO (parallel.zero_stage 1, 2 and 3) under mpirun -np $NP (default 2) on the CPU: after 20 steps
# the weights equal stage 0's (SGD and AdamW bit for bit: the reduce-scatter folds ranks in the
# order the all-reduce does; LAMB with clipping within 1e-6 relative: its norms add up partial
# sums), with gradient accumulation, an injected inf and tied weights (GPT-2); the per-rank optimizer state falls by
# the world size; a sharded checkpoint resumes bit for bit on NP ranks and with equal weights and
# optimizer state on other world sizes (np 2: 1 and 3; np 3: 1 and 2).
source "$(dirname "$0")/lib.sh"
NP=${NP:-2}
run() {  # np dir overrides...
  local np=$1 dir=$2; shift 2
  local sets=() opt; for opt in "$@"; do sets+=(--set "$opt"); done
  local cmd=("$KILN" train --config "${CONFIG:-$TINY}" --set logging.dir="$dir" "${sets[@]}")
  if [ "$np" = 1 ]; then "${cmd[@]}" > "$dir.log" 2>&1; else "${MPIRUN[@]}" -np "$np" "${cmd[@]}" > "$dir.log" 2>&1; fi \
    || { tail -30 "$dir.log"; fail "run $dir ($*)"; }
}
# Max relative difference of the parameters of two model.safetensors (buffers left out).
compare() {  # a-dir b-dir tolerance (0 = bitwise)
  python3 - "$1/checkpoints/step-000020/model.safetensors" "$2/checkpoints/step-000020/model.safetensors" "$3" <<'PY'
import json, struct, sys
import numpy as np
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h, data = json.loads(f.read(n)), f.read()
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], np.float32)
            for k, v in h.items() if k != "__metadata__" and v["dtype"] == "F32" and "running_" not in k}
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys() and a
worst = max(float(np.max(np.abs(a[k] - b[k]) / np.maximum(np.abs(a[k]), 1e-3))) for k in a)
if tol == 0 and any(a[k].tobytes() != b[k].tobytes() for k in a): sys.exit(f"not bitwise equal (max rel {worst:.3g})")
if worst > tol: sys.exit(f"max relative difference {worst:.3g} > {tol}")
PY
}
W=$WORK
SCALED=(precision.opt_level=O1 precision.half=BF16 precision.loss_scale.dynamic=true precision.loss_scale.init_scale=1024)

# Each case one run per stage: AdamW (the default) with accumulation, SGD with momentum, LAMB with
# its global clip norm, an inf injected on the last rank at step 5 under the loss scaler, and
# AdamW with bf16 moments (each shard's stochastic rounding draws the whole parameter's bits).
# Stages 1 and 2 share the optimizer path (stage 2 only frees the full gradient buffers), so the
# cases other than SGD check one of them: 20-step runs cost seconds each on CI's 2 cores.
for case in ${CASES:-accum sgd lamb inf bf16}; do
  case $case in
    accum) o=(train.accumulation_steps=2); tol=0; stages="0 1 3" ;;
    sgd) o=(optimizer.kind=SGD optimizer.lr=0.05 optimizer.momentum=0.9); tol=0; stages="0 1 2 3" ;;
    lamb) o=(optimizer.kind=LAMB optimizer.max_grad_norm=0.5); tol=1e-6; stages="0 2 3" ;;
    inf) o=("${SCALED[@]}"); tol=0; stages="0 2 3" ;;
    bf16) o=(optimizer.moments_dtype=BF16); tol=0; stages="0 2 3" ;;
  esac
  [ "$NP" != 2 ] && [ "$case" = sgd ] && stages="0 2 3"
  for z in $stages; do
    if [ "$case" = inf ]; then
      KILN_FAULT_KIND=inf-grad KILN_FAULT_STEP=5 KILN_FAULT_RANK=$((NP - 1)) run "$NP" "$W/$case$z" "${o[@]}" parallel.zero_stage=$z
      [ "$(grep -c 'step skipped: inf/NaN' "$W/$case$z.log")" = 1 ] \
        || { tail -20 "$W/$case$z.log"; fail "$case stage $z: the injected inf did not skip one step"; }
    else
      run "$NP" "$W/$case$z" "${o[@]}" parallel.zero_stage=$z
    fi
    [ "$z" = 0 ] || compare "$W/${case}0" "$W/$case$z" "$tol" || fail "$case: stage $z differs from stage 0 (np $NP)"
  done
  pass "$case: stages $stages agree after 20 steps (tolerance $tol, np $NP)"
  [ "$case" = accum ] || continue
  # ZeRO-3 gathering each unit's weights once per step instead of for every forward and backward
  # of each micro-batch: the same weights, a quarter of the gathers or fewer (2 micro-steps).
  run "$NP" "$W/accum3once" "${o[@]}" parallel.zero_stage=3 parallel.zero3_gather_once_per_step=true
  compare "$W/accum0" "$W/accum3once" 0 || fail "stage 3 gathering once per step differs from stage 0 (np $NP)"
  python3 - "$W/accum3/metrics.jsonl" "$W/accum3once/metrics.jsonl" <<'PY' || fail "gathering once per step did not gather less (np $NP)"
import json, sys
def gathers(path):
    rows = [json.loads(l) for l in open(path) if '"zero3_gathers_per_step"' in l]
    assert rows, f"{path}: no zero3_gathers_per_step"
    return rows[-1]["zero3_gathers_per_step"]
every, once = gathers(sys.argv[1]), gathers(sys.argv[2])
print(f"weight buckets gathered per step: {every} for each use, {once} once per step")
assert 0 < once <= every / 3, (every, once)
PY
  pass "stage 3 gathering once per step: stage 0's weights bit for bit, fewer gathers (np $NP)"
  # Each micro-step reduced and added into the shards: stage 0's losses within rounding (the
  # ranks' sums added in another order; SGD, since AdamW's normalised steps magnify a last bit
  # of a gradient near zero).
  sgd=("${o[@]}" optimizer.kind=SGD optimizer.lr=0.05 optimizer.momentum=0.9)
  run "$NP" "$W/accum-sgd0" "${sgd[@]}"
  for z in 2 3; do
    run "$NP" "$W/accum${z}shards" "${sgd[@]}" parallel.zero_stage=$z parallel.zero_accumulate_in_shards=true
    python3 - "$W/accum-sgd0/metrics.jsonl" "$W/accum${z}shards/metrics.jsonl" <<'PY' \
      || fail "stage $z accumulating in the shards: the losses differ from stage 0's (np $NP)"
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) == 20 and max(abs(x - y) / abs(x) for x, y in zip(a, b)) <= 1e-6, (a, b)
PY
  done
  pass "stages 2 and 3 accumulating in the shards: stage 0's losses within 1e-6 (SGD, np $NP)"
done

# Tied weights: GPT-2's embedding is also its output head (one parameter, two uses), with the
# global clip norm, on llm.c token shards written here.
mkdir -p "$W/shards"
python3 - "$W/shards" <<'PY'
import random, struct, sys
random.seed(11)
pattern = random.sample(range(512), 13)
tokens = [pattern[i % 13] for i in range(20000)]
with open(f"{sys.argv[1]}/tiny_train_000001.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
    f.write(struct.pack(f"<{len(tokens)}H", *tokens))
PY
GPT=(data.path="$W/shards/tiny_train_*.bin" data.eval_split=none train.steps=20 train.global_batch=24
     train.batch_per_gpu=$((24 / NP)))
for z in 0 1 3; do CONFIG=$SRC/tests/train/tiny_gpt.pbtxt run "$NP" "$W/gpt$z" "${GPT[@]}" parallel.zero_stage=$z; done
# ZeRO-3 gathers each block's weights again for the recomputed forward inside its backward.
CONFIG=$SRC/tests/train/tiny_gpt.pbtxt run "$NP" "$W/gpt3r" "${GPT[@]}" parallel.zero_stage=3 train.recompute=BLOCKS
# ... and not when it gathers once per step: the recomputed forward finds the block still whole.
CONFIG=$SRC/tests/train/tiny_gpt.pbtxt run "$NP" "$W/gpt3ro" "${GPT[@]}" parallel.zero_stage=3 train.recompute=BLOCKS \
  parallel.zero3_gather_once_per_step=true
for z in 1 3 3r; do
  compare "$W/gpt0" "$W/gpt$z" 1e-6 || fail "tied weights (GPT-2): stage $z differs from stage 0 (np $NP)"
done
compare "$W/gpt3" "$W/gpt3r" 0 || fail "tied weights (GPT-2): stage 3 with recompute differs from without (np $NP)"
compare "$W/gpt3" "$W/gpt3ro" 0 || fail "tied weights (GPT-2): stage 3 with recompute, gathering once per step, differs (np $NP)"
pass "tied weights (GPT-2, clipped AdamW): stages 1 and 3 (and 3 with recompute, gathering per use or once per step) agree with stage 0 (np $NP)"

# FP8 projections (the CPU twin's casts, delayed scaling merged across ranks) with the weights
# sharded: a gathered weight is cast as the whole one is, so stages 2 and 3 give stage 0's
# weights bit for bit (no clipping: its norm adds up partial sums in another order).
FP8=("${GPT[@]}" precision.fp8.enabled=true optimizer.max_grad_norm=0)
for z in 0 2 3; do CONFIG=$SRC/tests/train/tiny_gpt.pbtxt run "$NP" "$W/fp8_$z" "${FP8[@]}" parallel.zero_stage=$z; done
for z in 2 3; do
  compare "$W/fp8_0" "$W/fp8_$z" 0 || fail "FP8 (GPT-2): stage $z differs from stage 0 (np $NP)"
done
pass "FP8 projections (GPT-2): stages 2 and 3 give stage 0's weights bit for bit (np $NP)"

# Per-rank optimizer state (allocator statistics, rank 0): stage 1 holds about 1/NP of stage 0's.
b0=$(sed -n 's/.*optimizer state: \([0-9]*\) bytes.*/\1/p' "$W/accum0.log" | head -1)
b1=$(sed -n 's/.*optimizer state: \([0-9]*\) bytes.*/\1/p' "$W/accum1.log" | head -1)
python3 -c "import sys; r = $b1 * $NP / $b0; sys.exit(0 if 0.9 < r < 1.1 else f'stage 1 {$b1} B vs stage 0 {$b0} B on rank 0: ratio x np = {r:.3f}')" \
  || fail "optimizer memory did not fall by the world size"
pass "optimizer state per rank: $b0 B at stage 0, $b1 B at stage 1 (np $NP)"

# Sharded checkpoints: a fixed global batch, so any world size resumes at the same data position.
G=(train.global_batch=48 train.batch_per_gpu=$((48 / NP)) parallel.zero_stage=1)
run "$NP" "$W/ref" "${G[@]}"
ls "$W/ref/checkpoints/step-000020" | grep -q "optimizer-rank-00000-of-0000$NP.safetensors" || fail "no shard files"
mkdir -p "$W/half/checkpoints" && cp -r "$W/ref/checkpoints/step-000010" "$W/half/checkpoints/"
run "$NP" "$W/half" "${G[@]}" checkpoint.resume=latest
grep -q "resumed from .*step-000010 at step 10" "$W/half.log" || { tail "$W/half.log"; fail "no resume at step 10"; }
for f in model.safetensors $(cd "$W/ref/checkpoints/step-000020" && ls optimizer-rank-*); do
  cmp "$W/ref/checkpoints/step-000020/$f" "$W/half/checkpoints/step-000020/$f" || fail "$f differs after resume on $NP ranks"
done
pass "a $NP-rank sharded checkpoint resumes on $NP ranks bit for bit"
# Resharded: resume step 20 on other world sizes and save again; the state must be the same.
full_state() {  # checkpoint-dir: every optimizer tensor reassembled whole, as a .npz
  python3 - "$1" "$2" <<'PY'
import glob, json, struct, sys
import numpy as np
kinds = {"F32": np.float32, "I64": np.int64, "F64": np.float64}
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h, data = json.loads(f.read(n)), f.read()
    meta = h.pop("__metadata__", {})
    return meta, {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], kinds[v["dtype"]]) for k, v in h.items()}
files = sorted(glob.glob(sys.argv[1] + "/optimizer*.safetensors"))
out, sizes = {}, {}
_, model = load(sys.argv[1] + "/model.safetensors")
for path in files:
    meta, tensors = load(path)
    for name, t in tensors.items():
        if name == "optimizer.step": out[name] = t; continue
        param = name.rsplit(".", 1)[0]
        off = int(meta["piece:" + param].split()[0]) if "zero_world_size" in meta else 0
        whole = out.setdefault(name, np.full(model[param].size, np.nan, t.dtype))
        whole[off:off + t.size] = t
assert out and not any(np.isnan(v).any() for v in out.values() if v.dtype.kind == "f"), "holes in the state"
np.savez(sys.argv[2], **out)
PY
}
full_state "$W/ref/checkpoints/step-000020" "$W/ref.npz"
others="1 3"; [ "$NP" = 2 ] || others="1 2"
for np2 in $others; do
  # Onto several ranks at stage 3: the stage-1 shards become stage 3's (another bucket layout).
  z=3; [ "$np2" = 1 ] && z=1
  run "$np2" "$W/re$np2" train.global_batch=48 train.batch_per_gpu=$((48 / np2)) parallel.zero_stage=$z \
    checkpoint.resume="$W/ref/checkpoints/step-000020"
  grep -q "resumed from .*step-000020" "$W/re$np2.log" || { tail "$W/re$np2.log"; fail "no resume on $np2 ranks"; }
  compare "$W/ref" "$W/re$np2" 0 || fail "weights differ after resharding onto $np2 ranks"
  full_state "$W/re$np2/checkpoints/step-000020" "$W/re$np2.npz"
  python3 -c "
import numpy as np, sys
a, b = np.load('$W/ref.npz'), np.load('$W/re$np2.npz')
assert sorted(a.files) == sorted(b.files), (a.files, b.files)
bad = [k for k in a.files if a[k].tobytes() != b[k].tobytes()]
sys.exit('optimizer state differs: ' + ', '.join(bad[:5]) if bad else 0)" || fail "optimizer state differs after resharding onto $np2 ranks"
done
pass "the $NP-rank checkpoint resumes on ${others/ / and } ranks (stage 3 on several) with the same weights and optimizer state"

# ZeRO-3's own checkpoints: stage 1's weights, resumed bit for bit on $NP ranks, and on one rank.
G3=(train.global_batch=48 train.batch_per_gpu=$((48 / NP)) parallel.zero_stage=3)
run "$NP" "$W/ref3" "${G3[@]}"
compare "$W/ref" "$W/ref3" 0 || fail "stage 3 differs from stage 1 (np $NP)"
mkdir -p "$W/half3/checkpoints" && cp -r "$W/ref3/checkpoints/step-000010" "$W/half3/checkpoints/"
run "$NP" "$W/half3" "${G3[@]}" checkpoint.resume=latest
for f in model.safetensors $(cd "$W/ref3/checkpoints/step-000020" && ls optimizer-rank-*); do
  cmp "$W/ref3/checkpoints/step-000020/$f" "$W/half3/checkpoints/step-000020/$f" || fail "stage 3: $f differs after resume on $NP ranks"
done
run 1 "$W/one3" train.global_batch=48 train.batch_per_gpu=48 checkpoint.resume="$W/ref3/checkpoints/step-000020"
compare "$W/ref3" "$W/one3" 0 || fail "stage 3's checkpoint: weights differ on one rank"
full_state "$W/ref3/checkpoints/step-000020" "$W/ref3.npz"
full_state "$W/one3/checkpoints/step-000020" "$W/one3.npz"
python3 -c "
import numpy as np, sys
a, b = np.load('$W/ref3.npz'), np.load('$W/one3.npz')
bad = [k for k in a.files if a[k].tobytes() != b[k].tobytes()]
sys.exit('optimizer state differs: ' + ', '.join(bad[:5]) if bad or sorted(a.files) != sorted(b.files) else 0)" \
  || fail "stage 3's checkpoint: optimizer state differs on one rank"
pass "stage 3 trains as stage 1; its $NP-rank checkpoint resumes bit for bit, and on one rank with the same state"
