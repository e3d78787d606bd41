#!/usr/bin/env bash
# FP8 against bf16 on the same token stream (issue 37's loss target): GPT-2 124M (T 1024, 16
# sequences a step, AdamW as configs/gpt2_124m.pbtxt, 200 warmup steps) trained twice for STEPS
# steps on llm.c shards of real text that Python ships (tools/code_corpus.py: the standard
# library's and the installed packages' sources, a BPE trained on them, kiln tokenize), once in
# bf16 and once with precision.fp8; the validation loss every 250 steps of both, and the final
# one's difference. Writes OUT/{bf16,fp8}/metrics.jsonl and OUT/curves.json.
#   bench/fp8-loss.sh [OUT]    (KILN=build/bin/kiln STEPS=2000 EXTRA="--set ..." to change)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/fp8-loss}
KILN=${KILN:-build/bin/kiln}
STEPS=${STEPS:-2000}
read -r -a EXTRA <<< "${EXTRA:-}"
mkdir -p "$OUT"
if [ ! -f "$OUT/shards/code_val_000000.bin" ]; then
  python3 tools/code_corpus.py "$OUT/corpus" ${CORPUS_ARGS:-}
  "$KILN" tokenize --tokenizer "$OUT/corpus/tokenizer.json" --input "$OUT/corpus/corpus.jsonl" \
    --output "$OUT/shards" --name code
fi
for v in bf16 fp8; do
  rm -rf "$OUT/$v"
  fp8=false; [ $v = fp8 ] && fp8=true
  "$KILN" train --config configs/gpt2_124m.pbtxt --quiet --set name=fp8-loss-$v \
    --set data.kind=LLMC_SHARDS --set "data.path=$OUT/shards/code_train_*.bin" \
    --set train.steps="$STEPS" --set train.global_batch=16 --set schedule.warmup_steps=200 \
    --set train.eval_every=250 --set train.eval_batches=20 --set checkpoint.every_steps=0 \
    --set checkpoint.resume= --set logging.tensorboard=false --set logging.dir="$OUT/$v" \
    --set precision.fp8.enabled=$fp8 "${EXTRA[@]}"
done
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
curves = {}
for v in ("bf16", "fp8"):
    recs = [json.loads(l) for l in open(os.path.join(out, v, "metrics.jsonl"))]
    curves[v] = {
        "eval": [(r["step"], r["eval_loss"]) for r in recs if "eval_loss" in r],
        "train": [(r["step"], r["loss"]) for r in recs if "loss" in r and "eval_loss" not in r],
        "samples_per_s": [r["samples_per_s"] for r in recs if "samples_per_s" in r][-1:],
    }
json.dump(curves, open(os.path.join(out, "curves.json"), "w"))
print("step   bf16 val   fp8 val")
for (s, a), (_, b) in zip(curves["bf16"]["eval"], curves["fp8"]["eval"]):
    print(f"{s:5d}  {a:9.4f}  {b:8.4f}")
a, b = curves["bf16"]["eval"][-1][1], curves["fp8"]["eval"][-1][1]
print(f"final validation loss: bf16 {a:.4f}, fp8 {b:.4f} ({100 * (b - a) / a:+.2f} %)")

# OUT/curves.svg: training loss (thin) and validation loss (points) of both runs against steps.
W, H, L, B = 720, 420, 60, 40
series = [(v, c) for v, c in (("bf16", "#1f77b4"), ("fp8", "#d62728"))]
pts = [p for v, _ in series for k in ("train", "eval") for p in curves[v][k]]
x1 = max(s for s, _ in pts)
y0, y1 = min(l for _, l in pts), min(max(l for _, l in pts), 8.0)
X = lambda s: L + (W - L - 20) * s / x1
Y = lambda l: 20 + (H - 20 - B) * (y1 - min(l, y1)) / (y1 - y0)
svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
       f'<rect width="{W}" height="{H}" fill="white"/>',
       f'<line x1="{L}" y1="{H - B}" x2="{W - 20}" y2="{H - B}" stroke="black"/>',
       f'<line x1="{L}" y1="20" x2="{L}" y2="{H - B}" stroke="black"/>']
for i in range(6):
    l = y0 + (y1 - y0) * i / 5
    svg.append(f'<text x="{L - 6}" y="{Y(l) + 4:.1f}" text-anchor="end">{l:.1f}</text>')
    s_ = x1 * i / 5
    svg.append(f'<text x="{X(s_):.1f}" y="{H - B + 16}" text-anchor="middle">{s_:.0f}</text>')
svg.append(f'<text x="{(W + L) / 2}" y="{H - 6}" text-anchor="middle">step</text>')
for n, (v, color) in enumerate(series):
    line = " ".join(f"{X(s):.1f},{Y(l):.1f}" for s, l in curves[v]["train"])
    svg.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1" opacity="0.6"/>')
    for s, l in curves[v]["eval"]:
        svg.append(f'<circle cx="{X(s):.1f}" cy="{Y(l):.1f}" r="3" fill="{color}"/>')
    svg.append(f'<text x="{W - 200}" y="{40 + 18 * n}" fill="{color}">{v}: train (line), validation (dots)</text>')
svg.append("</svg>")
open(os.path.join(out, "curves.svg"), "w").write("\n".join(svg) + "\n")
PY
