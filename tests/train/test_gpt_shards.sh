#!/usr/bin/env bash
# GPT on llm.c's token shards, on the CPU (issue 19): a 2-layer, 64-wide GPT with a vocabulary of
# 512 learns a repeating token pattern from shards the test writes (training loss and validation
# loss under 0.1); mpirun -np 2 with the same global batch gives the losses of one process; a run
# resumed at step 50 ends as the uninterrupted one, bit for bit.
source "$(dirname "$0")/lib.sh"
CONFIG=$SRC/tests/train/tiny_gpt.pbtxt
mkdir -p "$WORK/shards"
# llm.c's format: 256 int32 (magic 20240520, version 1, token count), then uint16 tokens. Two
# training shards and one validation shard of the same period-13 pattern, each at another phase.
python3 - "$WORK/shards" <<'PY'
import random, struct, sys
random.seed(11)
pattern = random.sample(range(512), 13)
def write(path, count, phase):
    tokens = [pattern[(i + phase) % len(pattern)] for i in range(count)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, count, *([0] * 253)))
        f.write(struct.pack(f"<{count}H", *tokens))
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

run one 1
python3 - "$WORK/one/metrics.jsonl" <<'PY' || fail "the pattern was not learned"
import json, sys
records = [json.loads(l) for l in open(sys.argv[1])]
losses = [r["loss"] for r in records if "loss" in r]
evals = [r["eval_loss"] for r in records if "eval_loss" in r]
print(f"loss {losses[0]:.3f} -> {losses[-1]:.4f}, validation loss {evals}")
assert len(losses) == 100 and losses[0] > 5.0, losses[:3]
assert losses[-1] < 0.1 and evals and evals[-1] < 0.1, (losses[-1], evals)
PY
pass "a 2-layer GPT learns the pattern from llm.c shards (loss under 0.1)"

run two 2 --set train.batch_per_gpu=4
python3 - "$WORK/one/metrics.jsonl" "$WORK/two/metrics.jsonl" <<'PY' || fail "np 2 differs from np 1"
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == len(b) == 100, (len(a), len(b))
worst = max(abs(x - y) / max(abs(x), 1e-3) for x, y in zip(a, b))
print(f"largest relative loss difference over the 100 steps: {worst:.2e}")
assert worst < 1e-4, worst
PY
pass "mpirun -np 2 (4 per rank) trains as one process with the global batch of 8"

run resumed 1 --set train.steps=100
rm -rf "$WORK/resumed/checkpoints/step-000100"
keep_until "$WORK/resumed/metrics.jsonl" 50
run resumed 1 --resume latest
grep -q "resumed from .*step-000050 at step 50" "$WORK/resumed.log" || { cat "$WORK/resumed.log"; fail "resume message"; }
same_run "$WORK/one" "$WORK/resumed" 100
pass "resumed at step 50 on llm.c shards: the same 100 steps bit for bit"
