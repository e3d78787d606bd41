#!/usr/bin/env bash
# Everything GPU-side, in one run on the GPU machine: the gpu (and, with two GPUs, gpu2) test
# suites, the PyTorch comparisons and the benchmark table. Full logs go to $OUT (or ./gpu-check-out);
# a short summary is printed last.
#
#   tools/gpu-check.sh [BUILD_DIR] [--quick] [--no-bench] [--only REGEX]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
shift || true
QUICK=0 BENCH=1 ONLY="" KILN_BENCH=0 PARITY=1
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --no-bench) BENCH=0 ;;
    --only) ONLY="$2"; shift ;;
    --kiln-bench) KILN_BENCH=1 ;;    # one kiln bench per model (no PyTorch), with a per-layer profile
    --no-parity) PARITY=0 ;;
    --no-tests) NO_TESTS=1 ;;
    *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export KILN_SOURCE_DIR=$PWD
SUMMARY="$OUT/summary.txt"
export LD_LIBRARY_PATH=$PWD/$BUILD/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader > "$OUT/gpus.txt" 2>&1
GPUS=$(grep -c . "$OUT/gpus.txt" || echo 0)
note "gpu-check $(date -u +%FT%TZ) on $(hostname): $GPUS GPU(s): $(head -1 "$OUT/gpus.txt")"
"$BUILD/bin/kiln" info > "$OUT/info.txt" 2>&1 && note "kiln info: ok ($(grep -E 'cuDNN|NCCL' "$OUT/info.txt" | tr -s ' ' | tr '\n' ';'))" || { note "kiln info: FAILED"; cat "$OUT/info.txt"; }


# The GPU test binaries are run directly: only they (not the whole build tree) travel to the GPU
# machine, see docs/testing.md.
run_test() {  # label binary [mpirun ranks]
  local label=$1 bin=$2 np=${3:-1} name log
  name=$(basename "$bin"); log="$OUT/test-$name.log"
  [ -x "$bin" ] || { note "$label $name: MISSING ($bin)"; return; }
  local filter=(); [ -n "$ONLY" ] && filter=(--gtest_filter="$ONLY")
  local start=$SECONDS rc
  if [ "$np" = 1 ]; then
    timeout 600 "$bin" "${filter[@]}" > "$log" 2>&1; rc=$?
  else
    timeout 600 mpirun --allow-run-as-root -np "$np" -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH "$bin" "${filter[@]}" > "$log" 2>&1; rc=$?
  fi
  note "$label $name: $(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | tr '\n' ' ')(exit $rc, $((SECONDS - start)) s)"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sort -u | head -10 | sed 's/^/    /' | tee -a "$SUMMARY"
}
export LD_LIBRARY_PATH=$PWD/$BUILD/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
[ "${NO_TESTS:-0}" = 1 ] || for t in core/test_core_gpu layers/test_layers_dense_gpu layers/test_layers_conv_gpu \
         layers/test_layers_transformer_gpu optim/test_optim_gpu data/test_data_loader_gpu \
         comm/test_powersgd_gpu; do
  run_test gpu "$BUILD/tests/$t"
done
if [ "${NO_TESTS:-0}" != 1 ]; then
  # ViT-B/16 (cuDNN's fused attention) resumes bit for bit on one GPU.
  start=$SECONDS
  timeout 300 bash tests/train/test_gpu_attention_resume.sh "$BUILD/bin/kiln" > "$OUT/test-gpu-attention.log" 2>&1
  rc=$?
  note "gpu test_gpu_attention_resume.sh: $(grep -E '^(PASS|FAIL|SKIP)' "$OUT/test-gpu-attention.log" | head -1) (exit $rc, $((SECONDS - start)) s)"
  # train.cuda_graphs: graphed = eager bit for bit, resume, inf skip, partial batch, bench.
  start=$SECONDS
  timeout 420 bash tests/train/test_gpu_graphs.sh "$BUILD/bin/kiln" > "$OUT/test-gpu-graphs.log" 2>&1
  rc=$?
  note "gpu test_gpu_graphs.sh: $(grep -c '^PASS' "$OUT/test-gpu-graphs.log") passed (exit $rc, $((SECONDS - start)) s)"
  grep -E '^(PASS|FAIL)' "$OUT/test-gpu-graphs.log" | sed 's/^/    /' | tee -a "$SUMMARY"
fi
if [ "${NO_TESTS:-0}" != 1 ] && [ -x "$BUILD/tests/comm/test_comm_nccl" ]; then
  # NCCL inside a captured CUDA graph, on a one-rank communicator.
  timeout 120 mpirun --allow-run-as-root -np 1 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
    "$BUILD/tests/comm/test_comm_nccl" --gtest_filter='Nccl.AllReduceReplaysInsideACudaGraph' --gtest_color=no \
    > "$OUT/test-nccl-graph.log" 2>&1
  rc=$?
  note "gpu test_comm_nccl (one rank, CUDA graph): $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/test-nccl-graph.log" | tr '\n' ' ')(exit $rc)"
fi
if [ "${NO_TESTS:-0}" = 1 ]; then :; elif [ "$GPUS" -ge 2 ]; then
  run_test gpu2 "$BUILD/tests/comm/test_comm_nccl" 2
  # The trainer on two GPUs: exact resume with fp16 O2, dead, exiting and hung ranks, an inf.
  start=$SECONDS
  timeout 600 bash tests/train/test_gpu_training.sh "$BUILD/bin/kiln" > "$OUT/test-gpu-training.log" 2>&1
  rc=$?
  note "gpu2 test_gpu_training.sh: $(grep -c '^PASS' "$OUT/test-gpu-training.log") passed (exit $rc, $((SECONDS - start)) s)"
  grep -E '^(PASS|FAIL)' "$OUT/test-gpu-training.log" | sed 's/^/    /' | tee -a "$SUMMARY"
else note "gpu2: not run (one GPU)"; fi

# PyTorch comparisons: each script prints lines starting with PASS or FAIL.
for script in tools/parity/*.py; do
  [ -f "$script" ] || continue
  [ "$QUICK" = 1 ] || [ "$PARITY" = 0 ] && break
  name=$(basename "$script" .py)
  timeout 400 python3 "$script" --build "$BUILD" > "$OUT/parity-$name.log" 2>&1
  rc=$?
  note "parity $name: $(grep -cE '^PASS' "$OUT/parity-$name.log") pass, $(grep -cE '^FAIL' "$OUT/parity-$name.log") fail (exit $rc)"
  grep -E '^FAIL' "$OUT/parity-$name.log" | head -5 | sed 's/^/    /' | tee -a "$SUMMARY"
done

if [ "$KILN_BENCH" = 1 ]; then
  for mb in "resnet50 128" "bert_base 32" "vit_b16 64"; do
    set -- $mb
    timeout 300 "$BUILD/bin/kiln" bench --model "$1" --batch "$2" --amp O2 --steps 20 --warmup 5 --profile \
      > "$OUT/kiln-bench-$1.log" 2>&1
    note "kiln bench $1 $2 O2 fp16 (exit $?): $(sed -n 2,3p "$OUT/kiln-bench-$1.log" | tr -s ' ' | tr '\n' ' ')"
  done
  BENCH=0
fi

if [ "$BENCH" = 1 ] && [ "$QUICK" = 0 ] && [ -x bench/compare-pytorch.sh ]; then
  timeout 1500 bench/compare-pytorch.sh "$BUILD" > "$OUT/bench.log" 2>&1
  note "benchmark table (exit $?):"
  sed -n '/^| model/,/^$/p' "$OUT/bench.log" | tee -a "$SUMMARY"
fi

echo
echo "==== summary ===="
cat "$SUMMARY"
