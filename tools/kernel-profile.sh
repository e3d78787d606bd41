#!/usr/bin/env bash
# GPU time per kernel of Kiln's training step, from Nsight Compute (ncu): it times each kernel
# alone (serialised), so the sum per step is the step's GPU work without any host stall, and
# the gap to the measured step time is host time. Kernels are grouped by name; the number of
# steps in the window is the number of optimizer (adamw_kernel) launches in it. The bench runs 46
# steps; SKIP must land inside them (kernels launched before the window run unprofiled, fast).
#   tools/kernel-profile.sh BUILD_DIR MODEL BATCH [SKIP] [COUNT]   (on the GPU machine)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=$1 MODEL=$2 BATCH=$3 SKIP=${4:-8000} COUNT=${5:-3000}
OUT=${OUT:-$PWD/kernel-profile-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/$BUILD/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "kernel-profile: ncu not found"; exit 1; }
csv="$OUT/ncu-$MODEL-$BATCH.csv"
"$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip "$SKIP" \
  --launch-count "$COUNT" "$BUILD/bin/kiln" bench --model "$MODEL" --batch "$BATCH" --amp O2 \
  --steps 40 --warmup 6 --optimizer adamw > "$csv" 2> "$OUT/ncu-$MODEL-$BATCH.err"
python3 - "$csv" "$MODEL" "$BATCH" <<'PY'
import csv, sys, collections
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    unit = r["Metric Unit"]
    v = float(r["Metric Value"].replace(",", ""))
    v *= {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}.get(unit, 1e-6)
    rows.append((r["Kernel Name"], v))
if not rows:
    sys.exit("no kernels profiled: SKIP is past the run's last launch (ViT-B/16 makes about 400 "
             "per step; the run has 46 steps)")
steps = max(1, sum(1 for n, _ in rows if "adamw_kernel" in n))
total = sum(v for _, v in rows)
by = collections.defaultdict(lambda: [0.0, 0])
for n, v in rows:
    key = n.split("(")[0][:90]
    by[key][0] += v
    by[key][1] += 1
print(f"{sys.argv[2]} batch {sys.argv[3]}: {len(rows)} kernels over {steps} step(s) ({len(rows)/steps:.0f} per step), "
      f"GPU time {total/steps:.2f} ms per step")
for n, (v, c) in sorted(by.items(), key=lambda kv: -kv[1][0])[:30]:
    print(f"  {v/steps:8.3f} ms {100*v/total:5.1f} %  x{c/steps:6.1f}  {n}")
PY
