#!/usr/bin/env bash
# Installs the dependencies, builds Kiln (CUDA code included when the toolkit is present, since CI
# must compile and link it even without a GPU) with warnings as errors, and runs the cpu, mpi and
# slurm test suites. This is the README's test command, and what CI runs. The slurm suite needs
# the one-node cluster of scripts/start-slurm.sh (CI starts it) and fails without it;
# KILN_TEST_LABELS='cpu|mpi' leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
python3 tools/check-kernel-launches.py .  # every <<<...>>> is followed by its launch check
python3 tools/check-structure.py .  # file sizes and DESIGN.md's folder rule (also a ctest)
BUILD_DIR=${KILN_BUILD_DIR:-build}
extra=()
if [ -n "${KILN_CUDA_ARCHS:-}" ]; then extra+=("-DCMAKE_CUDA_ARCHITECTURES=${KILN_CUDA_ARCHS}"); fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WERROR=ON "${extra[@]}"
cmake --build "$BUILD_DIR" -j "$(nproc)"
ctest --test-dir "$BUILD_DIR" -L "${KILN_TEST_LABELS:-cpu|mpi|slurm}" --output-on-failure --no-tests=error -j "$(nproc)"
