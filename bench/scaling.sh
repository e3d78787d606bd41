#!/usr/bin/env bash
# Data-parallel scaling on the GPUs of one node, in one run: ResNet-50 at 128 per GPU and
# BERT-base at 32 per GPU, fp16 O2 (PyTorch: fp16 autocast + DDP), on 1, 2, 4, ... GPUs;
# efficiency = samples/s on N / (N x samples/s on 1). Then, at the largest N, the same-result
# check (NCCL data parallelism equal to one process with the global batch:
# test_comm_nccl's DataParallelMatchesSingleProcess under N ranks) and the dead- and hung-rank
# tests of tests/train/test_gpu_training.sh at N ranks. Prints a markdown table.
#
#   bench/scaling.sh [BUILD_DIR] [--gpus "1 2 4 8"] [--steps N] [--no-torch] [--no-checks]
# KILN_BENCH_ARGS adds kiln bench options, e.g. "--set train.cuda_graphs=false" for the rows
# without CUDA graphs (the two-GPU issue compares both).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
shift || true
AVAILABLE=$(nvidia-smi -L 2>/dev/null | grep -c GPU || echo 0)
GPU_COUNTS="" STEPS=20 WARMUP=5 TORCH=1 CHECKS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --gpus) GPU_COUNTS=$2; shift ;;
    --steps) STEPS=$2; shift ;;
    --no-torch) TORCH=0 ;;
    --no-checks) CHECKS=0 ;;
    *) echo "scaling: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "$GPU_COUNTS" ]; then
  for n in 1 2 4 8; do [ "$n" -le "$AVAILABLE" ] && GPU_COUNTS="$GPU_COUNTS $n"; done
fi
export NCCL_NVLS_ENABLE=0 KILN_SOURCE_DIR=$PWD
export LD_LIBRARY_PATH=$PWD/$BUILD/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
OUT=${OUT:-$PWD/scaling-out}
mkdir -p "$OUT"
RESULTS="$OUT/scaling.jsonl"
: > "$RESULTS"
NCCL_VERSION=$("$BUILD/bin/kiln" info 2>/dev/null | grep -m1 -oE 'NCCL [0-9.]+' || echo "NCCL ?")

for mb in "resnet50 128" "bert_base 32"; do
  set -- $mb
  for n in $GPU_COUNTS; do
    k=$(timeout 300 mpirun --allow-run-as-root --bind-to none -np "$n" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
          "$BUILD/bin/kiln" bench --model "$1" --batch "$2" --amp O2 --half fp16 --steps "$STEPS" \
          --warmup "$WARMUP" --json ${KILN_BENCH_ARGS:-} 2>> "$OUT/kiln.err" | tail -1)
    t="{}"
    if [ "$TORCH" = 1 ]; then
      t=$(timeout 300 python3 bench/pytorch_reference.py --model "$1" --batch "$2" --gpus "$n" \
            --steps "$STEPS" --warmup "$WARMUP" 2>> "$OUT/torch.err" | tail -1)
    fi
    python3 -c 'import json, sys
def load(s):
    try: return json.loads(s)
    except Exception: return {}
print(json.dumps({"model": sys.argv[1], "batch": int(sys.argv[2]), "gpus": int(sys.argv[3]),
                  "kiln": load(sys.argv[4]), "torch": load(sys.argv[5])}))' "$1" "$2" "$n" "$k" "$t" >> "$RESULTS"
  done
done

python3 - "$RESULTS" "$NCCL_VERSION" <<'PY'
import datetime, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
one = {(r["model"], "kiln"): r["kiln"].get("samples_per_s") for r in rows if r["gpus"] == 1}
one.update({(r["model"], "torch"): r["torch"].get("samples_per_s") for r in rows if r["gpus"] == 1})
print(f"\n{datetime.date.today()}, {sys.argv[2]}, fp16, batch per GPU fixed\n")
print("| model | batch/GPU | GPUs | Kiln samples/s | Kiln efficiency | PyTorch DDP samples/s | PyTorch efficiency |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    n, m = r["gpus"], r["model"]
    cells = []
    for side in ("kiln", "torch"):
        s, base = r[side].get("samples_per_s"), one.get((m, side))
        cells.append(f"{s:.0f}" if s else "-")
        cells.append(f"{100 * s / (n * base):.1f} %" if s and base else "-")
    print(f"| {m} | {r['batch']} | {n} | " + " | ".join(cells) + " |")
PY

if [ "$CHECKS" = 1 ]; then
  N=$(echo $GPU_COUNTS | awk '{print $NF}')
  if [ "${N:-1}" -ge 2 ]; then
    timeout 300 mpirun --allow-run-as-root -np "$N" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
      "$BUILD/tests/comm/test_comm_nccl" --gtest_filter='*DataParallelMatchesSingleProcess*:*UsesOneGpuPerRank*' \
      > "$OUT/same-result.log" 2>&1
    echo "same-result check on $N GPUs: exit $? ($(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/same-result.log" | tr '\n' ' '))"
    KILN_GPU_TRAINING_NP=$N KILN_GPU_TRAINING_PARTS="faults hang" timeout 600 \
      bash tests/train/test_gpu_training.sh "$BUILD/bin/kiln" > "$OUT/faults.log" 2>&1
    echo "dead/hung-rank tests at $N ranks: exit $?"
    grep -E '^(PASS|FAIL)' "$OUT/faults.log"
  fi
fi
