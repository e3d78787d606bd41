#!/usr/bin/env bash
# One GPU-machine session under a time budget: a Kiln smoke benchmark first (so a broken GPU path
# shows at once), the gpu/gpu2 test binaries, the Kiln vs PyTorch table (quick: 15 timed steps),
# then the PyTorch parity checks while time remains. Everything is logged under $OUT.
#   tools/gpu-session.sh [BUILD_DIR] [SECONDS]
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
BUDGET=${2:-480}
DEADLINE=$((SECONDS + BUDGET))
OUT=${OUT:-$PWD/gpu-session-out}
export OUT NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/$BUILD/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
left() { echo $((DEADLINE - SECONDS)); }
echo "== smoke: kiln bench resnet50 32 O2 (left $(left) s)"
timeout 120 "$BUILD/bin/kiln" bench --model resnet50 --batch 32 --amp O2 --steps 10 --warmup 3 2>&1 | tee "$OUT/smoke.log" | tail -6
echo "== tests (left $(left) s)"
timeout $(( $(left) - 60 )) bash tools/gpu-check.sh "$BUILD" --no-bench --no-parity > "$OUT/tests.log" 2>&1
sed -n '/==== summary/,$p' "$OUT/tests.log"
echo "== comparison table (left $(left) s)"
if [ "$(left)" -gt 120 ]; then
  timeout $(( $(left) - 20 )) bash bench/compare-pytorch.sh "$BUILD" --quick > "$OUT/bench.log" 2>&1
  echo "exit $?"; tail -25 "$OUT/bench.log"
fi
if [ "$(left)" -gt 90 ]; then
  echo "== parity (left $(left) s)"
  timeout $(( $(left) - 10 )) python3 tools/parity/models.py --build "$BUILD" --steps 10 > "$OUT/parity.log" 2>&1
  cat "$OUT/parity.log" | tail -20
fi
echo "== done (left $(left) s)"
