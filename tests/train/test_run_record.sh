#!/usr/bin/env bash
# What a run says about itself (issue "nothing lost, nothing misread", item 1): a language model's
# log line gives tokens/s and ms per step, every line elapsed time and an ETA; every metrics.jsonl
# record has a wall-clock "time" and "elapsed_s"; the effective experiment is written to
# <logging.dir>/experiment.pbtxt at a fresh start and kept on resume; kiln eval names the
# checkpoint it read.
source "$(dirname "$0")/lib.sh"
GPT=$SRC/tests/infer/tiny_gpt2.pbtxt
before=$(date +%s)
"$KILN" train --config "$GPT" --set logging.dir="$WORK/g" --set train.steps=3 \
  --set optimizer.lr=5e-3 > "$WORK/g.log" 2>&1 || { cat "$WORK/g.log"; fail "train the tiny GPT-2"; }
after=$(date +%s)
# step 3/3 ... 96 samples/s 3072 tokens/s ... TFLOP/s 41.6 ms/step elapsed 0s ETA 0s
grep -qE "^step 2/3 .* samples/s [0-9]+ tokens/s .* [0-9.]+ ms/step elapsed [0-9hms]+ ETA [0-9hms?]+" "$WORK/g.log" \
  || { cat "$WORK/g.log"; fail "a language model's log line lacks tokens/s, ms/step, elapsed or ETA"; }
python3 - "$WORK/g/metrics.jsonl" "$before" "$after" <<'PY' || fail "metrics.jsonl records"
import json, sys
path, before, after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
records = [json.loads(l) for l in open(path)]
assert len(records) == 3, records
previous = 0
for r in records:
    assert isinstance(r["time"], float) and before - 1 <= r["time"] <= after + 1, r
    assert r["elapsed_s"] >= previous, r
    previous = r["elapsed_s"]
    assert r["tokens_per_s"] > 0 and abs(r["tokens_per_s"] - 32 * r["samples_per_s"]) < 1e-3 * r["tokens_per_s"], r
    assert r["ms_per_step"] > 0, r
print("metrics.jsonl: time, elapsed_s, tokens_per_s, ms_per_step in", len(records), "records")
PY
# An image model counts samples, not tokens; its lines still show ms/step, elapsed and ETA.
"$KILN" train --config "$TINY" --set logging.dir="$WORK/i" --set train.steps=2 > "$WORK/i.log" 2>&1 \
  || { cat "$WORK/i.log"; fail "train the tiny CNN"; }
grep -q "^step 1/2 .*samples/s.* ms/step elapsed .* ETA " "$WORK/i.log" || { cat "$WORK/i.log"; fail "image model's line"; }
! grep -q "tokens/s" "$WORK/i.log" || fail "an image model reports tokens/s"

# experiment.pbtxt: the effective experiment (defaults filled, --set applied, enums shown), which
# kiln config reads back to the same experiment.
exp="$WORK/g/experiment.pbtxt"
[ -f "$exp" ] || { ls -la "$WORK/g"; fail "no experiment.pbtxt in the run directory"; }
grep -q "lr: 0.005" "$exp" && grep -q "steps: 3" "$exp" || { cat "$exp"; fail "the --set values are not recorded"; }
grep -q "kind: ADAMW" "$exp" && grep -q "device: CPU" "$exp" || { cat "$exp"; fail "enum fields missing"; }
! ls "$WORK/g" | grep -q "tmp" || { ls -la "$WORK/g"; fail "a temporary file was left"; }
"$KILN" config --config "$exp" > "$WORK/reread.txt" 2>&1 || { cat "$WORK/reread.txt"; fail "experiment.pbtxt does not load"; }
diff <(grep -v '^#' "$WORK/reread.txt" | grep -v '^name:') <(grep -v '^name:' "$exp") \
  || fail "experiment.pbtxt does not read back as the same experiment"
# A resumed run keeps the first experiment and says that its own differs.
cp "$exp" "$WORK/first.pbtxt"
"$KILN" train --config "$GPT" --set logging.dir="$WORK/g" --set train.steps=5 \
  --set optimizer.lr=5e-3 --resume latest > "$WORK/r.log" 2>&1 || { cat "$WORK/r.log"; fail "resume"; }
cmp "$exp" "$WORK/first.pbtxt" || fail "the resumed run rewrote experiment.pbtxt"
grep -q "differs from .*experiment.pbtxt" "$WORK/r.log" || { cat "$WORK/r.log"; fail "no note that the experiment differs"; }
# Only kiln train writes it: kiln eval reads, and leaves no logging.dir behind.
"$KILN" eval --config "$GPT" --set logging.dir="$WORK/g" --set data.eval_split=train \
  --set train.eval_batches=2 > "$WORK/e.log" 2>&1 || { cat "$WORK/e.log"; fail "eval"; }
grep -q "^eval: $WORK/g/checkpoints/step-000005: loss" "$WORK/e.log" || { cat "$WORK/e.log"; fail "kiln eval does not name its checkpoint"; }
"$KILN" eval --config "$GPT" --set logging.dir="$WORK/g" --set data.eval_split=train --json \
  --set train.eval_batches=2 --checkpoint "$WORK/g/checkpoints/step-000005" > "$WORK/e.json" 2>/dev/null || fail "eval --json"
python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["weights"].endswith("step-000005")' "$WORK/e.json" \
  || { cat "$WORK/e.json"; fail "eval --json lacks the checkpoint read"; }
pass "tokens/s, ms/step, elapsed and ETA; time and elapsed_s in metrics.jsonl; experiment.pbtxt; kiln eval names its checkpoint"
