#!/usr/bin/env bash
# Kiln against PyTorch 2.11 on the same GPU, in one run: the source articles' nine FP16
# configurations (AdamW, fp16), PyTorch's best variant at the largest batch of each model, and
# two-GPU data parallelism. Prints a markdown table (samples/s and the ratio per configuration).
#
#   bench/compare-pytorch.sh [BUILD_DIR] [--quick] [--no-compile | --compile-only] [--amp O2]
#                            [--models "resnet50 ..."] [--p2p-off] [--net] [--compile-batches]
#                            [--compile-modes "default reduce-overhead"]
# --p2p-off adds the two-GPU rows again with NCCL_P2P_DISABLE=1 (NCCL through host memory, as
# between RTX 4090s: ANCHORS.md's 95 % / 90 % targets).
# --net adds them with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (NCCL's socket transport, as between
# two hosts on Ethernet), once per gradient compression: Kiln's parallel.compression NONE, HALF
# and POWERSGD against DDP with no hook, fp16_compress_hook and powerSGD_hook (rank
# POWERSGD_RANK, default 4, from step POWERSGD_START, default 2: both inside the warm-up).
# --quick: 15 timed steps instead of 30 and no torch.compile rows; --compile-only: only the
# torch.compile rows (at --quick's step counts when both are given), for a run that has no room
# for the whole table. --compile-batches: the torch.compile rows at all three batches, not only
# the largest. --compile-modes: torch.compile's modes to run (default: "default"); the mode
# reduce-overhead (PyTorch's CUDA-graph route) runs at each model's smallest batch.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}; shift || true
QUICK=0 COMPILE=1 COMPILE_ONLY=0 COMPILE_BATCHES=0 COMPILE_MODES=default P2P_OFF=0 NET=0 AMP=O2 MODELS="resnet50 bert_base vit_b16" STEPS=30 WARMUP=10
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) QUICK=1; STEPS=15; WARMUP=5 ;;
    --no-compile) COMPILE=0 ;;
    --compile-only) COMPILE_ONLY=1 ;;
    --compile-batches) COMPILE_BATCHES=1 ;;
    --compile-modes) COMPILE_MODES=$2; shift ;;
    --p2p-off) P2P_OFF=1 ;;
    --net) NET=1 ;;
    --amp) AMP=$2; shift ;;
    --models) MODELS=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
export NCCL_NVLS_ENABLE=0
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
RESULTS="$OUT/bench-results.jsonl"
: > "$RESULTS"
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c GPU || echo 1)
batches() { case $1 in resnet50) echo "32 64 128" ;; bert_base) echo "8 16 32" ;; vit_b16) echo "16 32 64" ;; esac; }

POWERSGD_RANK=${POWERSGD_RANK:-4} POWERSGD_START=${POWERSGD_START:-2}
KILN_SETS=()  # extra `--set field=value` for kiln bench (the compression rows)

kiln() {  # model batch gpus
  local args=(bench --model "$1" --batch "$2" --amp "$AMP" --half fp16 --steps $STEPS --warmup $WARMUP --json ${KILN_SETS[@]+"${KILN_SETS[@]}"})
  if [ "$3" = 1 ]; then
    timeout 120 "$BUILD/bin/kiln" "${args[@]}" 2>>"$OUT/bench-kiln.err" | tail -1
  else
    timeout 150 mpirun --allow-run-as-root --bind-to none -np "$3" -x NCCL_NVLS_ENABLE \
      ${NCCL_P2P_DISABLE:+-x NCCL_P2P_DISABLE} ${NCCL_SHM_DISABLE:+-x NCCL_SHM_DISABLE} \
      "$BUILD/bin/kiln" "${args[@]}" 2>>"$OUT/bench-kiln.err" | tail -1
  fi
}
torch_ref() { timeout 150 python3 bench/pytorch_reference.py --steps $STEPS --warmup $WARMUP "$@" 2>>"$OUT/bench-torch.err" | tail -1; }
record() {  # label kiln-json torch-json
  python3 - "$@" >> "$RESULTS" <<'PY'
import json, sys
label, k, t = sys.argv[1], sys.argv[2], sys.argv[3]
def load(s):
    try: return json.loads(s)
    except Exception: return {}
print(json.dumps({"label": label, "kiln": load(k), "torch": load(t)}))
PY
}

compile_row() {  # model batch [mode]: torch.compile (channels_last for ResNet-50) against Kiln
  local mode=${3:-default} extra=(); [ "$1" = resnet50 ] && extra=(--channels-last)
  local t; t=$(torch_ref --model "$1" --batch "$2" --compile --compile-mode "$mode" "${extra[@]}")
  local label="fp16 AMP, torch.compile"; [ "$mode" = default ] || label="$label $mode"
  record "$1|$2|$label|1" "$(kiln "$1" "$2" 1)" "$t"
}
compile_rows() {  # model: the torch.compile rows the options ask for
  local all mode; all=$(batches "$1")
  for mode in $COMPILE_MODES; do
    if [ "$mode" = reduce-overhead ]; then
      compile_row "$1" "$(echo "$all" | awk '{print $1}')" "$mode"
    elif [ "$COMPILE_BATCHES" = 1 ]; then
      for b in $all; do compile_row "$1" "$b" "$mode"; done
    else
      compile_row "$1" "$(echo "$all" | awk '{print $3}')" "$mode"
    fi
  done
}

for m in $MODELS; do
  largest=$(batches "$m" | awk '{print $3}')
  if [ "$COMPILE_ONLY" = 1 ]; then
    compile_rows "$m"
    continue
  fi
  for b in $(batches "$m"); do
    k=$(kiln "$m" "$b" 1); t=$(torch_ref --model "$m" --batch "$b")
    record "$m|$b|fp16 AMP|1" "$k" "$t"
  done
  if [ "$m" = resnet50 ]; then
    t=$(torch_ref --model "$m" --batch "$largest" --channels-last)
    record "$m|$largest|fp16 AMP, channels_last|1" "$(kiln "$m" "$largest" 1)" "$t"
  fi
  if [ "$COMPILE" = 1 ] && [ "$QUICK" = 0 ]; then
    compile_rows "$m"
  fi
done
if [ "$GPUS" -ge 2 ] && [ "$COMPILE_ONLY" = 0 ]; then
  for mb in "resnet50 128" "bert_base 32"; do
    set -- $mb
    record "$1|$2|fp16 AMP, DDP|2" "$(kiln "$1" "$2" 2)" "$(torch_ref --model "$1" --batch "$2" --gpus 2)"
  done
  if [ "$P2P_OFF" = 1 ]; then  # NCCL through host memory, as between RTX 4090s
    for mb in "resnet50 128" "bert_base 32"; do
      set -- $mb
      record "$1|$2|fp16 AMP, DDP, P2P off|2" "$(NCCL_P2P_DISABLE=1 kiln "$1" "$2" 2)" \
        "$(NCCL_P2P_DISABLE=1 torch_ref --model "$1" --batch "$2" --gpus 2)"
    done
  fi
  if [ "$NET" = 1 ]; then  # NCCL over sockets, as between two hosts on Ethernet
    for mb in "resnet50 128" "bert_base 32"; do
      set -- $mb
      for compression in NONE HALF POWERSGD; do
        case $compression in
          NONE) hook=none ;;
          HALF) hook=fp16 ;;
          POWERSGD) hook=powersgd ;;
        esac
        KILN_SETS=(--set parallel.compression=$compression --set parallel.powersgd_rank=$POWERSGD_RANK
                   --set parallel.powersgd_start_step=$POWERSGD_START)
        k=$(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 kiln "$1" "$2" 2)
        KILN_SETS=()
        t=$(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 torch_ref --model "$1" --batch "$2" --gpus 2 \
              --comm-hook $hook --powersgd-rank $POWERSGD_RANK --powersgd-start $POWERSGD_START)
        record "$1|$2|fp16 AMP, DDP, net, $compression / $hook hook|2" "$k" "$t"
      done
    done
  fi
fi

python3 - "$RESULTS" "$AMP" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
amp = sys.argv[2]
single = {}
print(f"\n| model | batch/GPU | PyTorch mode | GPUs | Kiln ({amp}) samples/s | PyTorch samples/s | ratio | Kiln peak GiB | PyTorch peak GiB | Kiln TFLOP/s/GPU | Kiln MFU |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    m, b, mode, g = r["label"].split("|")
    k, t = r["kiln"], r["torch"]
    ks, ts = k.get("samples_per_s"), t.get("samples_per_s")
    ratio = f"{ks / ts:.2f}" if ks and ts else "-"
    f = lambda v, d=1: f"{v:.{d}f}" if isinstance(v, (int, float)) else "-"
    kp = k.get("peak_allocated_bytes", 0) / 2**30 if k else None
    print(f"| {m} | {b} | {mode} | {g} | {f(ks, 0)} | {f(ts, 0)} | {ratio} | {f(kp, 2)} | {f(t.get('peak_gib'), 2)} | {f(k.get('tflops_per_gpu'))} | {f(100 * k['mfu']) + '%' if k.get('mfu') else '-'} |")
    if g == "1" and mode == "fp16 AMP": single[(m, b)] = (ks, ts)
for r in rows:
    m, b, mode, g = r["label"].split("|")
    if g == "2" and (m, b) in single:
        k1, t1 = single[(m, b)]
        k2, t2 = r["kiln"].get("samples_per_s"), r["torch"].get("samples_per_s")
        if k1 and k2: print(f"\nscaling {m} {b}/GPU on 2 GPUs ({mode}): Kiln {100 * k2 / (2 * k1):.1f}%", end="")
        if t1 and t2: print(f", PyTorch {100 * t2 / (2 * t1):.1f}%", end="")
print()
PY
