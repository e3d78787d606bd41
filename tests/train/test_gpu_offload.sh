#!/usr/bin/env bash
# train.offload on one GPU (label gpu): a small Llama in bf16 O2, 10 deterministic steps with
# AdamW and clipping. DEVICE_KERNELS (the update kernels over masters and moments in pinned host
# memory, CUDA graphs on) equals no offload bit for bit: the same kernels, the state elsewhere.
# HOST_CORES (the update on the host's cores, eager steps) gives the same losses and fp32 state
# within 1e-6 relative: the host and the kernels share the element rules, the kernels built
# without fused multiply-adds. bf16 moments (stochastic rounding) too. OPTIMIZER_AND_WEIGHTS
# (ZeRO-3 on one GPU, its shards of weights and gradients in pinned host memory too) within 1e-6
# (the gradient norm is summed over the shard's pieces), and a step's peak device memory below
# OPTIMIZER's by most of the weights and gradients (kiln bench).
source "$(dirname "$0")/lib.sh"
export NCCL_NVLS_ENABLE=0
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
[ "$GPUS" -ge 1 ] || { echo "SKIP: needs a GPU"; exit 0; }
ARGS=(--config "$SRC/tests/train/tiny_llama.pbtxt" --set model.llama.hidden_size=256
      --set model.llama.seq_len=128 --set model.llama.max_positions=128
      --set model.llama.intermediate_size=512 --set data.kind=SYNTHETIC --set data.path=
      --set train.device=CUDA --set train.deterministic=true --set precision.opt_level=O2
      --set precision.half=BF16 --set train.steps=10 --set train.batch_per_gpu=4
      --set train.global_batch=4 --set train.eval_every=0 --set data.eval_split=none
      --set checkpoint.every_steps=10 --set checkpoint.resume= --set optimizer.max_grad_norm=1.0)
# Largest relative difference of the fp32 tensors of two checkpoints' optimizer files
# (optimizer.safetensors, or one rank's ZeRO shard file).
compare() {  # a-dir b-dir tolerance (0: bit for bit)
  python3 - "$(ls "$1"/checkpoints/step-000010/optimizer*.safetensors)" \
    "$(ls "$2"/checkpoints/step-000010/optimizer*.safetensors)" "$3" <<'PY'
import json, struct, sys
import numpy as np
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h, data = json.loads(f.read(n)), f.read()
    return {k: (v["dtype"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in h.items() if k != "__metadata__"}
a, b, tol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys() and any(k.endswith(".master") for k in a), sorted(a)[:5]
worst = 0.0
for k in a:
    if a[k][0] != "F32": continue
    x, y = (np.frombuffer(t[1], np.float32).astype(np.float64) for t in (a[k], b[k]))
    worst = max(worst, float(np.max(np.abs(x - y) / np.maximum(np.abs(x), 1e-6))) if x.size else 0.0)
bitwise = all(a[k][1] == b[k][1] for k in a)
print(f"largest relative difference of the fp32 state {worst:.3g}; bit for bit: {bitwise}")
if tol == 0 and not bitwise: sys.exit("not bit for bit")
if worst > tol: sys.exit(f"{worst:.3g} > {tol}")
PY
}
close_losses() {  # a-dir b-dir
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"losses {a}\n       {b}\nlargest relative difference {worst:.2e}")
assert len(a) == len(b) == 10 and worst <= 1e-6, worst
PY
}
for moments in FP32 BF16; do
  for offload in none host device weights; do
    sets=(--set optimizer.moments_dtype=$moments)
    case $offload in
      host) sets+=(--set train.offload=OPTIMIZER --set train.offload_update=HOST_CORES) ;;
      device) sets+=(--set train.offload=OPTIMIZER --set train.offload_update=DEVICE_KERNELS) ;;
      weights) sets+=(--set train.offload=OPTIMIZER_AND_WEIGHTS --set parallel.zero_stage=3) ;;
    esac
    d=$WORK/$moments-$offload
    "$KILN" train "${ARGS[@]}" "${sets[@]}" --set logging.dir="$d" > "$d.log" 2>&1 \
      || { cat "$d.log"; fail "$moments $offload"; }
  done
  grep -q "cuda_graphs: off" "$WORK/$moments-device.log" && fail "DEVICE_KERNELS turned CUDA graphs off"
  same_run "$WORK/$moments-none" "$WORK/$moments-device" 10
  compare "$WORK/$moments-none" "$WORK/$moments-device" 0 || fail "$moments: DEVICE_KERNELS state differs"
  pass "$moments moments: DEVICE_KERNELS (state in pinned host memory, CUDA graphs) equals no offload bit for bit"
  close_losses "$WORK/$moments-none" "$WORK/$moments-host" || fail "$moments: HOST_CORES losses"
  compare "$WORK/$moments-none" "$WORK/$moments-host" 1e-6 || fail "$moments: HOST_CORES state"
  pass "$moments moments: HOST_CORES equals the device's update within 1e-6"
  close_losses "$WORK/$moments-none" "$WORK/$moments-weights" || fail "$moments: OPTIMIZER_AND_WEIGHTS losses"
  compare "$WORK/$moments-none" "$WORK/$moments-weights" 1e-6 || fail "$moments: OPTIMIZER_AND_WEIGHTS state"
  pass "$moments moments: OPTIMIZER_AND_WEIGHTS (ZeRO-3's shards in pinned host memory) equals no offload within 1e-6"
done

# The device's share: Llama-3.2-1B cut to 4 blocks (about 0.5 B parameters, 1 GB of bf16
# weights), one step's peak with the optimizer offloaded and with the weights too.
BIG=(--model llama3_2_1b --set model.llama.num_layers=4 --set model.llama.seq_len=512
     --amp O2 --half bf16 --set parallel.bucket_mb=64)
for offload in OPTIMIZER OPTIMIZER_AND_WEIGHTS; do
  sets=(--set train.offload=$offload)
  [ $offload = OPTIMIZER_AND_WEIGHTS ] && sets+=(--set parallel.zero_stage=3)
  "$KILN" bench "${BIG[@]}" "${sets[@]}" --batch 4 --steps 3 --warmup 1 --json > "$WORK/peak-$offload.json" \
    2> "$WORK/peak-$offload.err" || { cat "$WORK/peak-$offload.err"; fail "kiln bench with train.offload $offload"; }
done
python3 - "$WORK/peak-OPTIMIZER.json" "$WORK/peak-OPTIMIZER_AND_WEIGHTS.json" <<'PY' || fail "OPTIMIZER_AND_WEIGHTS does not lower the device's peak"
import json, sys
a, b = (json.loads([l for l in open(f) if l.startswith("{")][-1])["peak_allocated_bytes"] for f in sys.argv[1:])
print(f"peak allocated: OPTIMIZER {a / 2**20:.1f} MiB, OPTIMIZER_AND_WEIGHTS {b / 2**20:.1f} MiB")
assert b < a - 500 * 2**20, (a, b)  # most of 1 GB of weights and as much of gradients gone
PY
pass "OPTIMIZER_AND_WEIGHTS: a step's peak device memory below OPTIMIZER's by most of the weights and gradients"
