#!/usr/bin/env bash
# Installs the dependencies, builds Kiln and runs the quick start: the small CNN on Fashion-MNIST
# (Debian's dataset-fashion-mnist package), printing the test accuracy at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$(nproc)"
if build/bin/kiln --help | grep -q '^  train'; then
  build/bin/kiln train --config configs/fashion_mnist.pbtxt "$@"
else
  build/bin/kiln info
fi
