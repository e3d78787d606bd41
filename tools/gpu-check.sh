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
QUICK=0 BENCH=1 ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --no-bench) BENCH=0 ;;
    --only) ONLY="$2"; shift ;;
    *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
export KILN_SOURCE_DIR=$PWD
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader > "$OUT/gpus.txt" 2>&1
GPUS=$(grep -c . "$OUT/gpus.txt" || echo 0)
note "gpu-check $(date -u +%FT%TZ) on $(hostname): $GPUS GPU(s): $(head -1 "$OUT/gpus.txt")"
"$BUILD/bin/kiln" info > "$OUT/info.txt" 2>&1 && note "kiln info: ok" || note "kiln info: FAILED"

run_ctest() {  # label
  local label=$1 log="$OUT/ctest-$1.log"
  local args=(-L "^$label\$" --output-on-failure --no-tests=error --timeout 900)
  [ -n "$ONLY" ] && args+=(-R "$ONLY")
  (cd "$BUILD" && ctest "${args[@]}") > "$log" 2>&1
  local rc=$?
  note "ctest -L $label: $(grep -E 'tests passed|No tests were found' "$log" | tail -1) (exit $rc)"
  grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)' "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
}

run_ctest gpu
if [ "$GPUS" -ge 2 ]; then run_ctest gpu2; else note "ctest -L gpu2: not run (one GPU)"; fi

# PyTorch comparisons: each script prints lines starting with PASS or FAIL.
for script in tools/parity/*.py; do
  [ -f "$script" ] || continue
  [ "$QUICK" = 1 ] && break
  name=$(basename "$script" .py)
  timeout 900 python3 "$script" --build "$BUILD" > "$OUT/parity-$name.log" 2>&1
  rc=$?
  note "parity $name: $(grep -cE '^PASS' "$OUT/parity-$name.log") pass, $(grep -cE '^FAIL' "$OUT/parity-$name.log") fail (exit $rc)"
  grep -E '^FAIL' "$OUT/parity-$name.log" | head -5 | sed 's/^/    /' | tee -a "$SUMMARY"
done

if [ "$BENCH" = 1 ] && [ "$QUICK" = 0 ] && [ -x bench/compare-pytorch.sh ]; then
  timeout 1500 bench/compare-pytorch.sh "$BUILD" > "$OUT/bench.log" 2>&1
  note "benchmark table (exit $?):"
  sed -n '/^| model/,/^$/p' "$OUT/bench.log" | tee -a "$SUMMARY"
fi

echo
echo "==== summary ===="
cat "$SUMMARY"
