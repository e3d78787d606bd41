#!/usr/bin/env bash
# The llama family on llm.c's uint32 token shards, on the CPU (issue 35): a tiny Llama (2 layers,
# GQA 4:2, vocabulary 1000, tied) and a tiny Qwen2 (q/k/v biases, untied) learn a repeating token
# pattern (training and validation loss under 0.1); mpirun -np 2 with the same global batch gives
# the losses of one process, as do ZeRO-2, recomputed blocks and the head in chunks of rows; a run
# resumed at step 50 ends as the uninterrupted one, bit for bit.
source "$(dirname "$0")/lib.sh"
CONFIG=$SRC/tests/train/tiny_llama.pbtxt
mkdir -p "$WORK/shards"
# llm.c's llama3 format: 256 int32 (magic 20240801, version 7, token count), then uint32 tokens.
python3 - "$WORK/shards" <<'PY'
import random, struct, sys
random.seed(12)
pattern = random.sample(range(1000), 13)
def write(path, count, phase):
    tokens = [pattern[(i + phase) % len(pattern)] for i in range(count)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240801, 7, count, *([0] * 253)))
        f.write(struct.pack(f"<{count}I", *tokens))
write(f"{sys.argv[1]}/tiny_train_000001.bin", 20000, 0)
write(f"{sys.argv[1]}/tiny_train_000002.bin", 15000, 5)
write(f"{sys.argv[1]}/tiny_val_000000.bin", 5000, 9)
PY
cd "$WORK"
run() {  # dir np [--set ...]
  local dir=$1 np=$2; shift 2
  local cmd=("$KILN" train --config "$CONFIG" --set logging.dir="$WORK/$dir" "$@")
  if [ "$np" = 1 ]; then "${cmd[@]}"; else "${MPIRUN[@]}" -np "$np" "${cmd[@]}"; fi \
    > "$WORK/$dir.log" 2>&1 || { cat "$WORK/$dir.log"; fail "run $dir (np $np)"; }
}
learned() {  # metrics.jsonl
  python3 - "$1" <<'PY'
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
losses = [r["loss"] for r in records if "loss" in r]
evals = [r["eval_loss"] for r in records if "eval_loss" in r]
print(f"loss {losses[0]:.3f} -> {losses[-1]:.4f}, validation loss {evals}")
assert len(losses) == 100 and losses[0] > 5.0, losses[:3]
assert losses[-1] < 0.1 and evals and evals[-1] < 0.1, (losses[-1], evals)
PY
}
same_losses() {  # a b
  python3 - "$1" "$2" <<'PY'
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) == 100, (len(a), len(b))
worst = max(abs(x - y) / max(abs(x), 1e-3) for x, y in zip(a, b))
print(f"largest relative loss difference over the 100 steps: {worst:.2e}")
assert worst < 1e-4, worst
PY
}

run one 1
learned "$WORK/one/metrics.jsonl" || fail "the Llama did not learn the pattern"
pass "a 2-layer Llama (GQA 4:2, tied) learns the pattern from uint32 llm.c shards (loss under 0.1)"

# kiln sample continues the pattern greedily from three of its tokens (through the KV cache).
read -r P0 P1 P2 <<< "$(python3 -c 'import random; random.seed(12); p = random.sample(range(1000), 13); print(*p[:3])')"
"$KILN" sample --config "$CONFIG" --set logging.dir="$WORK/one" --prompt-tokens "$P0 $P1 $P2" \
  --max-new-tokens 13 --temperature 0 --json > "$WORK/sample.json" 2> "$WORK/sample.err" \
  || { cat "$WORK/sample.err"; fail "kiln sample"; }
python3 - "$WORK/sample.json" <<'PY' || fail "the sample does not continue the pattern"
import json, random, sys
random.seed(12)
pattern = random.sample(range(1000), 13)
got = json.loads(open(sys.argv[1]).read())["tokens"]
want = [pattern[(3 + i) % 13] for i in range(13)]
print("sampled", got, "want", want)
assert got[-13:] == want, (got, want)
PY
pass "kiln sample continues the learned pattern greedily"

run qwen 1 --set model.name=qwen2 --set model.llama.qkv_bias=true \
  --set model.llama.tie_embeddings=false

learned "$WORK/qwen/metrics.jsonl" || fail "the Qwen2 did not learn the pattern"
pass "a 2-layer Qwen2 (q/k/v biases, untied head) learns the pattern too"

run two 2 --set train.batch_per_gpu=4
same_losses "$WORK/one/metrics.jsonl" "$WORK/two/metrics.jsonl" || fail "np 2 differs from np 1"
pass "mpirun -np 2 (4 per rank) trains as one process with the global batch of 8"

run zero 2 --set train.batch_per_gpu=4 --set parallel.zero_stage=2
same_losses "$WORK/one/metrics.jsonl" "$WORK/zero/metrics.jsonl" || fail "ZeRO-2 differs"
pass "ZeRO-2 over 2 ranks trains as one process"

run chunks 1 --set train.lm_head_chunks=3
same_losses "$WORK/one/metrics.jsonl" "$WORK/chunks/metrics.jsonl" || fail "the chunked head differs"
pass "the tied head over 3 chunks of rows (train.lm_head_chunks) trains as the whole logits"

# The untied head's weight is reduced once, after its last chunk, not after the first.
run qwen_chunks 2 --set model.name=qwen2 --set model.llama.qkv_bias=true \
  --set model.llama.tie_embeddings=false --set train.batch_per_gpu=4 --set train.lm_head_chunks=3
same_losses "$WORK/qwen/metrics.jsonl" "$WORK/qwen_chunks/metrics.jsonl" \
  || fail "the chunked untied head over 2 ranks differs"
pass "the untied head over 3 chunks on 2 ranks trains as one process with the whole logits"

run recompute 1 --set train.recompute=BLOCKS
same_losses "$WORK/one/metrics.jsonl" "$WORK/recompute/metrics.jsonl" || fail "recompute differs"
pass "recomputed decoder layers train as stored ones"

run resumed 1 --set train.steps=100
rm -rf "$WORK/resumed/checkpoints/step-000100"
keep_until "$WORK/resumed/metrics.jsonl" 50
run resumed 1 --resume latest
grep -q "resumed from .*step-000050 at step 50" "$WORK/resumed.log" || { cat "$WORK/resumed.log"; fail "resume message"; }
same_run "$WORK/one" "$WORK/resumed" 100
pass "resumed at step 50 on uint32 shards: the same 100 steps bit for bit"
