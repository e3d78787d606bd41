#!/usr/bin/env bash
# How long GPU training steps wait for data (target: under 2 % of the step), with the ready
# configs as users run them: Fashion-MNIST (real files), CIFAR-10 (files of the real format,
# random pixels: the GPU machine has no copy of the dataset) and synthetic data (ResNet-50 and
# BERT-base). Each line gives the mean and worst data-wait fraction over the log intervals after
# the first (warm-up), from the trainer's metrics.jsonl.
#   tools/data-wait.sh [BUILD_DIR] [FASHION_MNIST_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
FASHION=${2:-/usr/share/datasets/fashion-mnist}
OUT=${OUT:-$PWD/data-wait-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
WORK=$(mktemp -d /tmp/kiln-data-wait.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

python3 - "$WORK/cifar" <<'PY'
import os, sys
import numpy as np
d = sys.argv[1]
os.makedirs(d)
rng = np.random.default_rng(0)
for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
    records = rng.integers(0, 256, (10000, 3073), dtype=np.uint8)
    records[:, 0] %= 10
    records.tofile(os.path.join(d, name))
PY

summary() {  # metrics.jsonl label
  python3 - "$1" "$2" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in records if "data_wait_fraction" in r][1:]
if not steps:
    sys.exit(f"{sys.argv[2]}: no step records")
wait = [r["data_wait_fraction"] for r in steps]
rate = sorted(r["samples_per_s"] for r in steps)[len(steps) // 2]
acc = [r["eval_accuracy"] for r in records if "eval_accuracy" in r]
line = (f"{sys.argv[2]}: data wait mean {100 * sum(wait) / len(wait):.2f} %, worst interval "
        f"{100 * max(wait):.2f} % ({len(wait)} intervals), {rate:.0f} samples/s")
if acc:
    line += f", final test accuracy {100 * acc[-1]:.2f} %"
print(line)
PY
}

train() {  # label, then kiln train arguments
  local label=$1 start=$SECONDS
  shift
  timeout 240 "$BUILD/bin/kiln" train "$@" --set train.device=CUDA --set logging.dir="$WORK/$label" \
    --set logging.progress=OFF --set checkpoint.every_steps=0 > "$OUT/wait-$label.log" 2>&1
  local rc=$?
  echo "$label (exit $rc, $((SECONDS - start)) s): $(summary "$WORK/$label/metrics.jsonl" "$label" 2>&1)"
  [ $rc = 0 ] || tail -5 "$OUT/wait-$label.log"
}

train fashion_mnist --config configs/fashion_mnist.pbtxt --set data.path="$FASHION" --set train.log_every=25
train cifar10_resnet18 --config configs/cifar10_resnet18.pbtxt --set data.path="$WORK/cifar" \
  --set train.steps=400 --set train.log_every=25 --set train.eval_every=0
train synthetic_resnet50 --config configs/resnet50.pbtxt --set train.steps=120 --set train.log_every=10
train synthetic_bert_base --config configs/bert_base.pbtxt --set train.global_batch=64 --set train.steps=120 --set schedule.warmup_steps=10 \
  --set train.log_every=10 --set train.eval_every=0
