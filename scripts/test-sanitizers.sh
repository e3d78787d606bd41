#!/usr/bin/env bash
# The CPU suite under AddressSanitizer and UndefinedBehaviorSanitizer (clang, errors fatal), and
# every libFuzzer target for a fixed number of executions from the corpus in tests/fuzz/corpus.
# CI runs it after the README's test command; it needs clang (Debian's clang package).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang++ > /dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev > /dev/null
fi
BUILD_DIR=${KILN_SANITIZER_BUILD_DIR:-build-asan}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=OFF -DKILN_BUILD_BENCH=OFF \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DKILN_FUZZ=ON \
  -DKILN_SANITIZE="address;undefined" -DCMAKE_CXX_FLAGS="-fno-sanitize-recover=all -O1 -g1" \
  -DKILN_FUZZ_RUNS="${KILN_FUZZ_RUNS:-20000}"
cmake --build "$BUILD_DIR" -j "$(nproc)"
# Leak checking is on for the fuzz targets only (set per test): Open MPI's plugins, unloaded at
# MPI_Finalize, leave allocations that no suppression can name.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0
export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The quick start's accuracy is a speed test in all but name: it runs in the plain build only.
# The quick starts, the documented commands and the Fashion-MNIST export run whole trainings that
# the other tests cover piece by piece; at ASan's speed they would double this stage.
ctest --test-dir "$BUILD_DIR" -L 'cpu|fuzz' -E 'quickstart|doc_commands|onnx_fashion_mnist' \
  --output-on-failure --no-tests=error \
  -j "$(nproc)" --timeout 1200
