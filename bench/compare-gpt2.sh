#!/usr/bin/env bash
# GPT-2 124M training throughput on one GPU, in one run: Kiln (`kiln bench`), llm.c
# (`train_gpt2cu`, cuDNN attention, its default recompute of GELU) and llm.c's PyTorch reference
# (`train_gpt2.py --flash 1 --dtype bfloat16`, eager and torch.compile). Random init, random
# tokens (vocab 50257), T = 1024, bf16, AdamW, no gradient accumulation, batches 16 and 32.
# Prints one markdown table; logs go to $OUT/gpt2/.
#
#   bench/compare-gpt2.sh BUILD_DIR LLMC_DIR [--quick] [--batches "16 32"] [--xl]
#                         [--no-compile] [--compile-batches "32"] [--budget SECONDS]
#                         [--kiln-set "train.recompute=KEEP_ALL train.lm_head_chunks=4"]
# LLMC_DIR holds llm.c's train_gpt2cu (built for sm_90 as shared/DEVICE.md says) and
# train_gpt2.py; bench/llmc/tiktoken.py stands in for tiktoken, which the GPU machine lacks
# (train_gpt2.py imports it; nothing here samples or writes a tokenizer). --quick: fewer steps and no
# torch.compile rows. --xl adds GPT-2 XL (1.56B) at batch 4 x 1024 on Kiln and llm.c.
# --budget: the whole run's seconds; a row that would not fit is skipped (and listed), each
# command's timeout is cut to what is left, and the table is printed in any case. --kiln-set: settings
# of the Kiln rows (`kiln bench --set` each), e.g. GELU's output kept and the head in 4 chunks.
# Order: per batch Kiln, llm.c, PyTorch eager; then the XL rows; then torch.compile (slowest).
#
# Step time: the median of the steps after the warm-up ones, as each system times its step
# (Kiln: CUDA events; llm.c: CUDA events around forward+backward+update; train_gpt2.py:
# time.time() around the step after a synchronize, data loading included).
# FLOPs, one formula for all three (PaLM's, attention counted without the causal half):
#   per token 6*N + 12*L*C*T, N = the parameters as transformers' GPT2LMHeadModel counts them
#   (tied head: 124,439,808 for GPT-2 124M, 1,557,611,200 for XL), L layers, C width, T = 1024.
# MFU against the H200's dense bf16 peak, 989.4 TFLOP/s. (Each system's own TFLOP/s or MFU, which
# count differently, stays in its log.)
# Peak memory, two columns: what the system reports (Kiln: peak allocated by its allocator;
# llm.c: device memory in use after it allocated everything, "device memory usage"; PyTorch:
# torch.cuda.max_memory_allocated) and the peak of nvidia-smi's memory.used sampled every
# 200 ms during the run less the value before it (the whole process: context, caches, pools).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BUILD=${1:-build-gpu}
LLMC=${2:-build-gpu-extra/llmc}
shift 2 || true
BATCHES="16 32" XL=0 COMPILE=1 COMPILE_BATCHES="" BUDGET=0 KILN_SETS=()
KILN_STEPS=20 KILN_WARMUP=5 LLMC_STEPS=30 LLMC_SKIP=5 EAGER_STEPS=15 EAGER_SKIP=3
COMPILE_STEPS=20 COMPILE_SKIP=5
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) COMPILE=0; KILN_STEPS=10; KILN_WARMUP=3; LLMC_STEPS=15; LLMC_SKIP=3; EAGER_STEPS=8
             EAGER_SKIP=2 ;;
    --batches) BATCHES=$2; shift ;;
    --xl) XL=1 ;;
    --no-compile) COMPILE=0 ;;
    --compile-batches) COMPILE_BATCHES=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --kiln-set) for s in $2; do KILN_SETS+=(--set "$s"); done; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$COMPILE_BATCHES" ] || COMPILE_BATCHES=$BATCHES
LLMC=$(realpath "$LLMC")
BUILD_ABS=$(realpath "$BUILD")
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-$PWD/bench-out}/gpt2
mkdir -p "$OUT"
RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
T=1024
# Token shards outside $OUT (they are not results): llm.c's format, 256 int32 of header (magic
# 20240520, version 1, token count), then uint16 tokens below 50257.
DATA=${GPT2_DATA:-${TMPDIR:-/tmp}/kiln-gpt2-tokens}
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/kiln-gpt2-run.XXXXXX")  # cwd of llm.c and train_gpt2.py
trap 'rm -rf "$SCRATCH"' EXIT

log() { echo "[compare-gpt2 $(date +%H:%M:%S)] $*" >&2; }

make_data() {
  mkdir -p "$DATA"
  timeout 120 python3 - "$DATA" <<'PY'
import os, sys
import numpy as np
d = sys.argv[1]
rng = np.random.default_rng(20240520)
for name, n in (("train_000000.bin", 2_500_000), ("train_000001.bin", 2_500_000),
                ("val_000000.bin", 300_000)):
    path = os.path.join(d, name)
    if os.path.exists(path) and os.path.getsize(path) == 1024 + 2 * n:
        continue
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, n)
    tokens = rng.integers(0, 50257, size=n, dtype=np.uint16)
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    os.replace(path + ".tmp", path)
print("token shards in", d)
PY
}

# nvidia-smi's memory.used (MiB) every 200 ms in the background, during one command.
SMI_PID="" SMI_BASE=0
smi_start() {
  SMI_BASE=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1)
  [[ "$SMI_BASE" =~ ^[0-9]+$ ]] || SMI_BASE=0
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 200 > "$1" 2>/dev/null &
  SMI_PID=$!
}
smi_stop() {  # prints the peak above the baseline, MiB (empty when nothing was sampled)
  if [ -n "$SMI_PID" ]; then kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null; fi
  SMI_PID=""
  awk -v base="$SMI_BASE" '$1 ~ /^[0-9]+$/ { if ($1 > m) m = $1 } END { if (m != "") print m - base }' "$1"
}

record() {  # system model batch rc log smi_peak_mib [kind]
  python3 - "$@" >> "$RESULTS" <<'PY'
import json, re, statistics, sys
system, model, batch, rc, log, smi = sys.argv[1:7]
kind = sys.argv[7] if len(sys.argv) > 7 else ""
skip = int(sys.argv[8]) if len(sys.argv) > 8 else 0
batch, rc, T = int(batch), int(rc), 1024
row = {"system": system, "model": model, "batch": batch, "rc": rc,
       "smi_peak_mib": float(smi) if smi else None}
try:
    text = open(log, errors="replace").read()
except OSError:
    text = ""
if kind == "kiln":
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            row["step_ms"] = j.get("median_step_ms")
            if j.get("samples_per_s"):
                row["tokens_per_s"] = j["samples_per_s"] * T
            if j.get("peak_allocated_bytes") is not None:
                row["reported_peak_mib"] = j["peak_allocated_bytes"] / 2**20
            row["own_tflops"] = j.get("tflops_per_gpu")
            row["own_mfu"] = j.get("mfu")
            break
else:
    if kind == "llmc":
        pat = re.compile(r"^step\s+(\d+)/\d+ \| loss .*\|\s*([\d.]+) ms \|")
        mem = re.search(r"device memory usage: (\d+) MiB", text)
    else:
        pat = re.compile(r"^step\s+(\d+)/\d+ \| train loss .*\(([\d.]+) ms \|")
        mem = re.search(r"peak memory consumption: (\d+) MiB", text)
    times = [float(m.group(2)) for m in map(pat.match, text.splitlines()) if m]
    row["steps_seen"] = len(times)
    timed = times[skip:] if len(times) > skip else []
    if timed:
        row["step_ms"] = statistics.median(timed)
        row["tokens_per_s"] = batch * T / (row["step_ms"] / 1000)
    if mem:
        row["reported_peak_mib"] = float(mem.group(1))
print(json.dumps(row))
PY
}

DEADLINE=$((SECONDS + BUDGET))
run_row() {  # system model batch kind skip timeout_s command...
  local system=$1 model=$2 batch=$3 kind=$4 skip=$5 limit=$6; shift 6
  local tag; tag=$(echo "$system-$model-$batch" | tr ' ,.()' '_____')
  if [ "$BUDGET" -gt 0 ]; then
    local left=$((DEADLINE - SECONDS - 15))  # 15 s kept for the table
    # A row needs at least a third of its timeout (torch.compile: two thirds) to be worth it.
    local need=$((limit / 3)); [ "$system" = "PyTorch compile" ] && need=$((2 * limit / 3))
    if [ "$left" -lt "$need" ]; then
      log "$system $model batch $batch skipped: $left s left of the budget"
      echo "{\"system\": \"$system\", \"model\": \"$model\", \"batch\": $batch, \"rc\": -1}" >> "$RESULTS"
      return
    fi
    [ "$limit" -le "$left" ] || limit=$left
  fi
  local log="$OUT/$tag.log"
  log "$system $model batch $batch: $*"
  smi_start "$OUT/$tag.smi"
  (cd "$SCRATCH" && timeout --kill-after=10 "$limit" "$@") > "$log" 2>&1
  local rc=$?
  local smi; smi=$(smi_stop "$OUT/$tag.smi")
  [ "$rc" = 0 ] || log "$system $model batch $batch exited $rc (log $log)"
  record "$system" "$model" "$batch" "$rc" "$log" "$smi" "$kind" "$skip"
}

kiln_row() {  # kiln-model batch
  run_row "Kiln" "$1" "$2" kiln 0 180 "$BUILD_ABS/bin/kiln" bench --model "$1" --batch "$2" \
    --amp O2 --half bf16 --steps $KILN_STEPS --warmup $KILN_WARMUP --json ${KILN_SETS[@]+"${KILN_SETS[@]}"}
}
llmc_row() {  # llmc-descriptor model batch steps
  # -e dNN: random init of that depth; -d B*T: no gradient accumulation; -v: validation only at
  # the first and last step (it can't be 0: llm.c takes step % v), one batch of it (-m 1);
  # -s 0: no sampling; no -o: no log or checkpoint files; -z 0; recompute (-r) at its default.
  run_row "llm.c" "$2" "$3" llmc $LLMC_SKIP 180 "$LLMC/train_gpt2cu" -i "$DATA/train_*.bin" \
    -j "$DATA/val_*.bin" -e "$1" -b "$3" -t $T -d $(( $3 * T )) -x "$4" -v 1000000 -m 1 -s 0 \
    -z 0 -n 0
}
torch_row() {  # label batch compile steps skip timeout
  PYTHONPATH="$LLMC:$PWD/bench/llmc${PYTHONPATH:+:$PYTHONPATH}" run_row "$1" gpt2 "$2" torch "$5" "$6" \
    python3 "$LLMC/train_gpt2.py" --input_bin "$DATA/train_*.bin" --model d12 --batch_size "$2" \
    --sequence_length $T --total_batch_size $(( $2 * T )) --num_iterations "$4" \
    --dtype bfloat16 --flash 1 --compile "$3" --tensorcores 1 --write_tensors 0 \
    --overfit_single_batch 0 --val_loss_every 0 --sample_every 0
}

log "data: $DATA"
make_data > "$OUT/data.log" 2>&1 || { log "cannot write the token shards: $(tail -3 "$OUT/data.log")"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
[ -x "$BUILD/bin/kiln" ] || log "no $BUILD/bin/kiln: the Kiln rows will fail"
[ -x "$LLMC/train_gpt2cu" ] || log "no $LLMC/train_gpt2cu: the llm.c rows will fail"
[ -f "$LLMC/train_gpt2.py" ] || log "no $LLMC/train_gpt2.py: the PyTorch rows will fail"

for b in $BATCHES; do
  kiln_row gpt2 "$b"
  llmc_row d12 gpt2 "$b" $LLMC_STEPS
  torch_row "PyTorch eager" "$b" 0 $EAGER_STEPS $EAGER_SKIP 150
done
if [ "$XL" = 1 ]; then
  kiln_row gpt2_xl 4
  llmc_row d48 gpt2_xl 4 $LLMC_STEPS
fi
if [ "$COMPILE" = 1 ]; then
  for b in $COMPILE_BATCHES; do
    torch_row "PyTorch compile" "$b" 1 $COMPILE_STEPS $COMPILE_SKIP 300
  done
fi

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
T, PEAK = 1024, 989.4e12
SHAPES = {"gpt2": (12, 768), "gpt2_xl": (48, 1600)}  # layers, width
V = 50257
def params(L, C):  # GPT2LMHeadModel's count, tied head
    return V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
def flops_per_token(model):
    L, C = SHAPES[model]
    return 6 * params(L, C) + 12 * L * C * T
kiln = {(r["model"], r["batch"]): r.get("tokens_per_s") for r in rows if r["system"] == "Kiln"}
f = lambda v, d=0: f"{v:,.{d}f}" if isinstance(v, (int, float)) else "-"
print(f"\nGPT-2 training, T = {T}, bf16, AdamW, random tokens; FLOPs per token 6N + 12LCT; "
      f"MFU of {PEAK / 1e12:.1f} TFLOP/s")
print("\n| system | model | batch | tokens/s | step ms | TFLOP/s | MFU | reported peak GiB "
      "| nvidia-smi peak GiB | Kiln / this |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for r in rows:
    tps = r.get("tokens_per_s")
    tf = tps * flops_per_token(r["model"]) / 1e12 if tps else None
    mfu = f"{100 * tf * 1e12 / PEAK:.1f}%" if tf else "-"
    k = kiln.get((r["model"], r["batch"]))
    ratio = f"{k / tps:.2f}" if k and tps and r["system"] != "Kiln" else "-"
    status = "" if r["rc"] == 0 else " (skipped: no time left)" if r["rc"] == -1 \
        else f" (exit {r['rc']})"
    rep = r.get("reported_peak_mib")
    smi = r.get("smi_peak_mib")
    print(f"| {r['system']}{status} | {r['model']} | {r['batch']} | {f(tps)} | {f(r.get('step_ms'), 2)} "
          f"| {f(tf, 1)} | {mfu} | {f(rep / 1024 if rep else None, 2)} "
          f"| {f(smi / 1024 if smi else None, 2)} | {ratio} |")
for r in rows:
    if r["system"] == "Kiln" and r.get("own_tflops") is not None:
        print(f"\nKiln's own count ({r['model']} x{r['batch']}): {r['own_tflops']:.1f} TFLOP/s, "
              f"MFU {100 * (r.get('own_mfu') or 0):.1f}%", end="")
print()
PY
