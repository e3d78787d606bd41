#!/usr/bin/env bash
# The JSONL metrics file has the documented keys, and TensorBoard's own reader loads the event
# files with the same scalars.
source "$(dirname "$0")/lib.sh"
"$KILN" train --config "$TINY" --set train.steps=6 --set logging.dir="$WORK/m" \
  --set data.eval_split=train --set train.eval_batches=2 --set train.eval_every=3 > "$WORK/out.log" 2>&1 \
  || { cat "$WORK/out.log"; fail "run"; }
grep -q "^step 6/6 epoch 0 loss [0-9.]* lr [0-9.e-]* scale 1 [0-9]* samples/s" "$WORK/out.log" || { cat "$WORK/out.log"; fail "log line format"; }
grep -q "final test accuracy" "$WORK/out.log" || fail "no final accuracy line"
python3 - "$WORK/m" <<'PY'
import glob, json, sys
d = sys.argv[1]
records = [json.loads(l) for l in open(d + "/metrics.jsonl")]
train = [r for r in records if "loss" in r]
evals = [r for r in records if "eval_loss" in r]
assert len(train) == 6, train
for k in ("step", "loss", "lr", "loss_scale", "samples_per_s"):
    assert all(k in r for r in train), (k, train[0])
assert [r["step"] for r in evals] == [3, 6], evals
assert all("eval_accuracy" in r for r in evals)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(d)
acc.Reload()
tags = acc.Tags()["scalars"]
for t in ("train/loss", "train/lr", "train/samples_per_s", "eval/loss", "eval/accuracy"):
    assert t in tags, (t, tags)
tb = [(e.step, e.value) for e in acc.Scalars("train/loss")]
assert [s for s, _ in tb] == list(range(1, 7)), tb
for (s, v), r in zip(tb, train):
    assert abs(v - r["loss"]) <= 1e-6 * max(1, abs(r["loss"])), (v, r)
print("metrics ok:", len(train), "train records,", len(evals), "eval records, tags", sorted(tags))
PY
pass "JSONL and TensorBoard metrics"

# logging.dir is created without a shell: quotes, spaces, ';' and $(...) are just characters.
odd="$WORK/run's dir; \$(touch $WORK/pwned) \`touch $WORK/pwned2\`"
( cd "$WORK" && "$KILN" train --config "$TINY" --set train.steps=2 --set logging.dir="$odd" > "$WORK/odd.log" 2>&1 ) \
  || { cat "$WORK/odd.log"; fail "run with an odd logging.dir"; }
[ -f "$odd/metrics.jsonl" ] || { ls -la "$WORK"; fail "metrics.jsonl not in the directory named by logging.dir"; }
[ ! -e "$WORK/pwned" ] && [ ! -e "$WORK/pwned2" ] || fail "a shell ran a command from logging.dir"
pass "logging.dir with a quote, spaces, ';' and \$(...) is created as named"
