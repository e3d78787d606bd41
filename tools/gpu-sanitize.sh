#!/usr/bin/env bash
# compute-sanitizer over the GPU tests: memcheck (out-of-bounds and misaligned accesses, errors
# of CUDA calls) on every GPU test binary, and racecheck (shared-memory hazards) on the tests of
# the kernels that use shared memory (reductions, batch norm, layernorm, softmax, cross-entropy,
# embedding, the optimizers' multi-tensor kernels). Full-size models are left out: under the sanitizer they
# take many minutes and run no kernel the small tests do not.
#   tools/gpu-sanitize.sh [BUILD_DIR]     (on the GPU machine; logs under $OUT; SANITIZE_ONLY=regex)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
OUT=${OUT:-$PWD/gpu-sanitize-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/$BUILD/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$CS" ] || { echo "sanitize: compute-sanitizer not found"; exit 1; }
status=0
check() {  # tool binary gtest-filter [compute-sanitizer option...]
  # SANITIZE_ONLY (a bash regex over "tool binary filter") picks checks, for a short GPU call.
  if [ -n "${SANITIZE_ONLY:-}" ] && ! [[ "$1 $2 $3" =~ $SANITIZE_ONLY ]]; then return 0; fi
  local tool=$1 bin=$BUILD/tests/$2 filter=$3 log start=$SECONDS
  log="$OUT/sanitize-$tool-$(basename "$2")${4:+-api}.log"
  local extra=("${@:4}"); [ "$tool" = racecheck ] && extra+=(--racecheck-report hazard)
  timeout 300 "$CS" --tool "$tool" "${extra[@]}" --error-exitcode 99 "$bin" --gtest_filter="$filter" > "$log" 2>&1
  local rc=$?
  echo "$tool $(basename "$2") [$filter]: exit $rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1), $(grep -E '^\[  PASSED  \]' "$log"), $((SECONDS - start)) s"
  [ $rc = 0 ] || { status=1; grep -m5 -E "Invalid|Race|hazard|error" "$log" | sed 's/^/    /'; }
}
check memcheck core/test_core_gpu '-*OutOfMemory*'
# The allocator's out-of-memory test makes cudaMalloc fail on purpose: its API errors are expected.
check memcheck core/test_core_gpu '*OutOfMemory*' --report-api-errors no
check memcheck layers/test_layers_dense_gpu '*'
check memcheck layers/test_layers_transformer_gpu '-*FullSize*'
check memcheck layers/test_layers_conv_gpu '-*ResNet*'
check memcheck optim/test_optim_gpu '*'
check memcheck data/test_data_loader_gpu '*'
check racecheck core/test_core_gpu '*Reductions*'
check racecheck layers/test_layers_conv_gpu '*BatchNorm*'
check racecheck layers/test_layers_transformer_gpu '*LayerNormLaunchers*:*SoftmaxLaunchers*:*EmbeddingLaunchers*'
# Kiln's flash kernels (racecheck cannot model the mbarriers of cuDNN's sm90 attention kernels).
KILN_ATTENTION_CUDNN=0 check racecheck layers/test_layers_transformer_gpu '*FusedAttention*/f16'
check racecheck layers/test_layers_dense_gpu '*SoftmaxCrossEntropy*'
check racecheck optim/test_optim_gpu '*AdamW*:*GlobalNorm*:*Unscale*'
exit $status
