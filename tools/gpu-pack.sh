#!/usr/bin/env bash
# Packs what the GPU machine needs from a build folder (the kiln binary, its extra libraries and
# the GPU test binaries) into BUILD/carry.tar.xz: compressed, it fits the GPU machine's 64 MiB
# transfer limit with room for a dataset. tools/gpu-session.sh unpacks it there.
#   tools/gpu-pack.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
files=("$BUILD/bin")
for t in core/test_core_gpu layers/test_layers_dense_gpu layers/test_layers_conv_gpu \
         layers/test_layers_transformer_gpu optim/test_optim_gpu data/test_data_loader_gpu \
         comm/test_comm_nccl; do
  [ -x "$BUILD/tests/$t" ] && files+=("$BUILD/tests/$t")
done
tar -cf - "${files[@]}" | xz -6 -T2 > "$BUILD/carry.tar.xz.tmp"
mv "$BUILD/carry.tar.xz.tmp" "$BUILD/carry.tar.xz"
ls -la "$BUILD/carry.tar.xz"
