#!/usr/bin/env bash
# Packs what the GPU machine needs from a build folder (the kiln binary, its extra libraries and
# the GPU test binaries) into BUILD/carry.tar.xz: compressed, it fits the GPU machine's 64 MiB
# transfer limit with room for a dataset. tools/gpu-session.sh unpacks it there.
#   tools/gpu-pack.sh [BUILD_DIR]
# EXTRA="DIR ..." packs those folders too (paths from the repository root), e.g.
#   EXTRA=build-gpu-extra/llmc tools/gpu-pack.sh build-gpu
# for llm.c's train_gpt2cu, train_gpt2.py and the tiktoken stand-in (the gpt2 stage's peers).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
files=("$BUILD/bin")
for t in core/test_core_gpu layers/test_layers_dense_gpu layers/test_layers_conv_gpu \
         layers/test_layers_transformer_gpu layers/test_layers_packed_documents_gpu layers/test_layers_fp8_projection_gpu optim/test_optim_gpu data/test_data_loader_gpu data/test_data_device_decode_gpu \
         comm/test_comm_nccl comm/test_powersgd_gpu; do
  [ -x "$BUILD/tests/$t" ] && files+=("$BUILD/tests/$t")
done
for extra in ${EXTRA:-}; do
  [ -d "$extra" ] || { echo "gpu-pack: EXTRA folder $extra does not exist" >&2; exit 1; }
  files+=("$extra")
done
tar -cf - "${files[@]}" | xz -6 -T2 > "$BUILD/carry.tar.xz.tmp"
mv "$BUILD/carry.tar.xz.tmp" "$BUILD/carry.tar.xz"
ls -la "$BUILD/carry.tar.xz"
size=$(stat -c %s "$BUILD/carry.tar.xz")
[ "$size" -le $((64 * 1024 * 1024)) ] || echo "gpu-pack: $BUILD/carry.tar.xz is over 64 MiB" >&2
