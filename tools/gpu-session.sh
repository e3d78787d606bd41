#!/usr/bin/env bash
# One GPU-machine session under a time budget, in stages run in the order given:
#   smoke     a short kiln bench (a broken GPU path shows at once)
#   tests     the gpu/gpu2 test binaries and the two-GPU trainer tests (tools/gpu-check.sh)
#   profile   kiln bench --profile for ResNet-50 128, BERT-base 32 and ViT-B/16 64
#             (PROFILE="model batch,..." picks others)
#   datawait  data-wait fractions of GPU training (tools/data-wait.sh; FASHION_MNIST_DIR)
#   table     the Kiln vs PyTorch table (bench/compare-pytorch.sh --quick; TABLE_MODELS orders
#             the models, ViT-B/16 first by default, so a cut run keeps the rows that matter most;
#             TABLE_ARGS=--p2p-off adds the two-GPU rows without NVLink peer-to-peer)
#   compile   the torch.compile rows alone (--quick --compile-only; about 330 s; COMPILE_ARGS adds
#             options, e.g. "--compile-batches" or "--compile-modes reduce-overhead")
#   kbench    Kiln alone on the nine seed configurations (kiln bench --json, 15 timed steps;
#             KBENCH="model batch,..." picks others; KBENCH_GRAPHS="true false" runs each with
#             train.cuda_graphs on and off)
#   hang      the two-GPU hung-rank test alone (tests/train/test_gpu_training.sh, part hang;
#             HANG_PARTS="inf hang" adds others)
#   scaling   data-parallel scaling on every GPU of the machine (bench/scaling.sh), with the
#             same-result check and the dead/hung-rank tests at that many ranks
#   parity    Kiln vs PyTorch from the same weights (tools/parity/models.py, 20 steps)
#   gpt2      GPT-2 124M: Kiln vs llm.c vs llm.c's PyTorch reference, eager and torch.compile,
#             batches 16 and 32 (bench/compare-gpt2.sh; about 6 minutes). LLMC_DIR (default
#             build-gpu-extra/llmc: llm.c's train_gpt2cu and train_gpt2.py); GPT2_ARGS adds
#             options, e.g. "--xl" (GPT-2 XL at batch 4 on Kiln and llm.c), "--quick" or
#             "--compile-batches 32"; rows that no longer fit the time left are skipped
#   parity-gpt2  GPT-2 from transformers' GPT2LMHeadModel weights (tools/parity/gpt2.py):
#             logits, gradients and 20 AdamW steps, fp32 and bf16; GPT2_PARITY_ARGS adds options
#   sanitize  compute-sanitizer memcheck and racecheck over the GPU kernels' tests
#   kernels   GPU time per kernel of one training step (tools/kernel-profile.sh, Nsight Compute;
#             KERNELS="model batch launch-skip launch-count,..." picks others)
#   memory    kiln plan's prediction against the measured peak (kiln bench) for GPT-2 124M x16,
#             GPT-2 XL x4 and BERT-base x32, recompute NONE and BLOCKS, and the 24 GiB cap
#             (train.max_memory_mb 24576): GPT-2 124M fits, GPT-2 XL fails naming what to change
#             (tools/memory-check.py)
#   doctor    kiln doctor --json on this machine's GPUs
# Logs go to $OUT/logs, packed into $OUT/logs.tar.gz at the end (few files travel back).
#   tools/gpu-session.sh BUILD_DIR SECONDS [STAGE ...]   (default: smoke tests table parity)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
BUDGET=${2:-480}
shift 2 || true
STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=(smoke tests table parity)
DEADLINE=$((SECONDS + BUDGET))
RESULTS=${OUT:-$PWD/gpu-session-out}
export OUT=$RESULTS/logs
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/$BUILD/bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
left() { echo $((DEADLINE - SECONDS)); }
upto() { local l=$(( $(left) - 10 )); echo $(( l < $1 ? l : $1 )); }  # seconds for a stage: at most $1
# What tools/gpu-pack.sh packed (the binaries, compressed to fit the transfer limit).
if [ -f "$BUILD/carry.tar.xz" ]; then
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall()' "$BUILD/carry.tar.xz" \
    || { echo "gpu-session: cannot unpack $BUILD/carry.tar.xz"; exit 1; }
fi

for stage in "${STAGES[@]}"; do
  echo "== $stage (left $(left) s)"
  [ "$(left)" -gt 30 ] || { echo "skipped: out of time"; continue; }
  case "$stage" in
    smoke)
      timeout 120 "$BUILD/bin/kiln" bench --model resnet50 --batch 32 --amp O2 --steps 10 --warmup 3 2>&1 \
        | tee "$OUT/smoke.log" | tail -6 ;;
    tests)
      timeout $(( $(left) - 20 )) bash tools/gpu-check.sh "$BUILD" --no-bench --no-parity > "$OUT/tests.log" 2>&1
      sed -n '/==== summary/,$p' "$OUT/tests.log" ;;
    profile)
      IFS=, read -ra configs <<< "${PROFILE:-resnet50 128,bert_base 32,vit_b16 64}"
      for mb in "${configs[@]}"; do
        set -- $mb
        timeout 120 "$BUILD/bin/kiln" bench --model "$1" --batch "$2" --amp O2 --steps 20 --warmup 5 --profile \
          > "$OUT/profile-$1.log" 2>&1
        echo "exit $?"; cat "$OUT/profile-$1.log"
      done ;;
    datawait)
      timeout "$(upto 120)" bash tools/data-wait.sh "$BUILD" "${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}" ;;
    kbench)
      IFS=, read -ra configs <<< "${KBENCH:-resnet50 32,resnet50 64,resnet50 128,bert_base 8,bert_base 16,bert_base 32,vit_b16 16,vit_b16 32,vit_b16 64}"
      for mb in "${configs[@]}"; do
        set -- $mb
        [ "$(left)" -gt 25 ] || break
        for graphs in ${KBENCH_GRAPHS:-default}; do
          set_graphs=(); [ "$graphs" = default ] || set_graphs=(--set train.cuda_graphs=$graphs)
          timeout 60 "$BUILD/bin/kiln" bench --model "$1" --batch "$2" --amp O2 --half fp16 --steps 15 \
            --warmup 5 --json "${set_graphs[@]}" 2>> "$OUT/kbench.err" | tail -1 >> "$OUT/kbench.jsonl"
          python3 - "$OUT/kbench.jsonl" <<'PY' 2>&1 | tail -1
import json, sys
r = json.loads(open(sys.argv[1]).readlines()[-1])
print(f"{r['model']} {r['batch_per_gpu']}: {r['samples_per_s']:.0f} samples/s, step {r['median_step_ms']:.2f} ms, "
      f"graph {r.get('graph')}, host {r.get('host_ms_per_step', 0):.2f} ms/step, {r['tflops_per_gpu']:.1f} "
      f"TFLOP/s, peak {r['peak_allocated_bytes'] / 2**30:.2f} GiB, data wait {100 * r['data_wait_fraction']:.2f} %")
PY
        done
      done ;;
    hang)
      KILN_SOURCE_DIR=$PWD KILN_GPU_TRAINING_PARTS=${HANG_PARTS:-hang} timeout "$(upto 200)" \
        bash tests/train/test_gpu_training.sh "$BUILD/bin/kiln" > "$OUT/hang.log" 2>&1
      echo "exit $?"; tail -40 "$OUT/hang.log" ;;
    scaling)
      timeout "$(upto 580)" bash bench/scaling.sh "$BUILD" > "$OUT/scaling.log" 2>&1
      echo "exit $?"; grep -vE '^\s*$' "$OUT/scaling.log" | tail -25 ;;
    table)
      timeout $(( $(left) - 10 )) bash bench/compare-pytorch.sh "$BUILD" --quick ${TABLE_ARGS:-} \
        --models "${TABLE_MODELS:-vit_b16 bert_base resnet50}" > "$OUT/bench.log" 2>&1
      echo "exit $?"; tail -25 "$OUT/bench.log" ;;
    compile)
      OUT=$OUT/compile timeout $(( $(left) - 10 )) bash bench/compare-pytorch.sh "$BUILD" --quick \
        --compile-only ${COMPILE_ARGS:-} --models "${TABLE_MODELS:-vit_b16 bert_base resnet50}" \
        > "$OUT/compile.log" 2>&1
      echo "exit $?"; tail -12 "$OUT/compile.log" ;;
    parity)
      timeout "$(upto 200)" python3 tools/parity/models.py --build "$BUILD" --steps 20 > "$OUT/parity.log" 2>&1
      echo "exit $?"; grep -E '^(PASS|FAIL| )' "$OUT/parity.log" | tail -40 ;;
    gpt2)
      limit=$(upto 560)
      timeout "$limit" bash bench/compare-gpt2.sh "$BUILD" "${LLMC_DIR:-build-gpu-extra/llmc}" \
        --budget $((limit - 5)) ${GPT2_ARGS:-} > "$OUT/gpt2.log" 2>&1
      echo "exit $?"; grep -E '^(\||GPT-2|Kiln.s own)' "$OUT/gpt2.log" | tail -20 ;;
    parity-gpt2)
      timeout "$(upto 240)" python3 tools/parity/gpt2.py --build "$BUILD" --steps 20 \
        ${GPT2_PARITY_ARGS:-} > "$OUT/parity-gpt2.log" 2>&1
      echo "exit $?"; grep -E '^(PASS|FAIL|SKIP| )' "$OUT/parity-gpt2.log" | tail -40 ;;
    kernels)
      IFS=, read -ra configs <<< "${KERNELS:-resnet50 128 8000 5000,vit_b16 64 3000 800,bert_base 32 3000 800}"
      for mbsc in "${configs[@]}"; do
        timeout $(( $(left) - 10 )) bash tools/kernel-profile.sh "$BUILD" $mbsc
      done ;;
    sanitize)
      timeout $(( $(left) - 10 )) bash tools/gpu-sanitize.sh "$BUILD" ;;
    memory)
      timeout "$(upto 420)" python3 tools/memory-check.py "$BUILD" "$OUT" 2>&1 | tee "$OUT/memory.log" | tail -20 ;;
    doctor)
      timeout "$(upto 120)" "$BUILD/bin/kiln" doctor --json > "$OUT/doctor.json" 2> "$OUT/doctor.err"
      echo "exit $?"; cat "$OUT/doctor.json"; tail -5 "$OUT/doctor.err" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
tar -czf "$RESULTS/logs.tar.gz" -C "$RESULTS" logs && rm -rf "$OUT"
echo "== done (left $(left) s)"
