#!/usr/bin/env bash
# The GPU half of the ONNX export checks (docs/deploy.md), for the GPU machine: ResNet-50 (224x224,
# 1000 classes) and BERT-base (seq 128) trained two steps on the GPU, evaluated by Kiln in fp32
# (--dump-logits), exported in fp32 and with --half, and run by ONNX Runtime's CUDA provider on
# Kiln's inputs: fp32 within 1e-3 of the logits' scale (TF32 and cuDNN's algorithms differ from
# Kiln's), fp16 within 2e-2. With trtexec on the PATH, TensorRT also builds an FP16 engine of each.
#
#   tools/onnx-gpu-check.sh [BUILD_DIR]     (default build-gpu; logs in $OUT, default ./onnx-gpu-out)
#
# Needs ONNX Runtime with the CUDA provider (pip install onnxruntime-gpu==1.20.1 for CUDA 12) and
# onnx; says which runtime it found, and exits 3 when none can run on the GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
KILN=$BUILD/bin/kiln
OUT=${OUT:-$PWD/onnx-gpu-out}
mkdir -p "$OUT"
CHECK=tests/infer/onnx_check.py
TINY=tests/infer/tiny_export.pbtxt
[ -x "$KILN" ] || { echo "onnx-gpu-check: no $KILN (build with -DKILN_CUDA=ON first)" >&2; exit 2; }

runtime=$(python3 - <<'PY' 2>&1
try:
    import onnxruntime as ort
except ImportError:
    print("none: no onnxruntime module")
    raise SystemExit(1)
import onnx  # noqa: F401  (the checker)
providers = ort.get_available_providers()
print(f"onnxruntime {ort.__version__} ({ort.__file__}), providers {providers}")
raise SystemExit(0 if "CUDAExecutionProvider" in providers else 1)
PY
)
found=$?
echo "onnx-gpu-check: runtime found: $runtime"
if [ "$found" != 0 ]; then
  echo "onnx-gpu-check: no ONNX Runtime with the CUDA provider here (PyTorch alone cannot run an" >&2
  echo "  ONNX file). Install it, e.g. python3 -m pip install onnxruntime-gpu==1.20.1 onnx==1.17.0" >&2
  echo "  (CUDA 12, cuDNN 9), in a virtual environment if the system Python is managed." >&2
  exit 3
fi
if command -v trtexec > /dev/null; then echo "onnx-gpu-check: TensorRT: $(command -v trtexec)"; else echo "onnx-gpu-check: no trtexec: TensorRT engines not built"; fi
export KILN_ORT_PROVIDER=CUDAExecutionProvider

failures=0
check() {  # name -- kiln --set arguments
  local name=$1; shift 2
  local args=("$@" --set logging.dir="$OUT/$name" --set train.device=CUDA)
  rm -rf "$OUT/$name"
  if ! "$KILN" train --config "$TINY" "${args[@]}" --quiet > "$OUT/$name.train.log" 2>&1 ||
     ! "$KILN" eval --config "$TINY" "${args[@]}" --dump-logits "$OUT/$name.logits.npy" \
         --dump-inputs "$OUT/$name.inputs.npy" > "$OUT/$name.eval.log" 2>&1 ||
     ! "$KILN" export --config "$TINY" "${args[@]}" --onnx "$OUT/$name.onnx" > "$OUT/$name.export.log" 2>&1 ||
     ! "$KILN" export --config "$TINY" "${args[@]}" --half --onnx "$OUT/$name.half.onnx" >> "$OUT/$name.export.log" 2>&1; then
    echo "FAIL $name: kiln (logs in $OUT/$name.*.log)"; failures=$((failures + 1)); return
  fi
  for variant in "onnx 1e-3" "half.onnx 2e-2"; do
    set -- $variant
    if python3 "$CHECK" logits "$OUT/$name.$1" "$OUT/$name.inputs.npy" "$OUT/$name.logits.npy" --tolerance "$2"; then
      echo "PASS $name.$1 on ONNX Runtime CUDA (tolerance $2)"
    else
      echo "FAIL $name.$1 on ONNX Runtime CUDA"; failures=$((failures + 1))
    fi
  done
  if command -v trtexec > /dev/null; then
    local shape
    shape=$(python3 -c 'import numpy, sys; x = numpy.load(sys.argv[1]); print(sys.argv[2] + ":" + "x".join(map(str, x.shape)))' \
      "$OUT/$name.inputs.npy" "$( [ "$name" = bert_base ] && echo input_ids || echo input)")
    if trtexec --onnx="$OUT/$name.onnx" --fp16 --shapes="$shape" > "$OUT/$name.trtexec.log" 2>&1; then
      echo "PASS $name: TensorRT FP16 engine built ($(grep -m1 'GPU Compute Time' "$OUT/$name.trtexec.log"))"
    else
      echo "FAIL $name: trtexec --fp16 (log $OUT/$name.trtexec.log)"; failures=$((failures + 1))
    fi
  fi
}

check resnet50 -- --set model.name=resnet50 --set model.image_size=224 --set model.image_channels=3 \
  --set model.num_classes=1000 --set data.augmentation.normalize_mean=0.485,0.456,0.406 \
  --set data.augmentation.normalize_std=0.229,0.224,0.225 --set train.batch_per_gpu=16
check bert_base -- --set model.name=bert_base --set model.bert.vocab_size=30522 --set model.bert.seq_len=128 \
  --set train.batch_per_gpu=8 --set train.eval_batches=1
echo "onnx-gpu-check: $failures failure(s); logs in $OUT"
[ "$failures" = 0 ]
