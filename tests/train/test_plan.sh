#!/usr/bin/env bash
# kiln plan on the shipped GPT-2 124M and BERT-base experiments (made CPU-sized): the table for
# 1, 2 and 4 GPUs, ZeRO's sharding dividing exactly what it shards, a memory limit's verdicts;
# bad command lines exit 2 naming the problem.
source "$(dirname "$0")/lib.sh"
# CPU-sized: the probes run at half the batch and the batch, so the batch is small too.
CPU=(--set train.device=CPU --set parallel.backend=AUTO --set precision.opt_level=O0
     --set data.workers=1 --set logging.dir="$WORK/log" --set train.batch_per_gpu=4)
GPT=(--config "$SRC/configs/gpt2_124m.pbtxt" "${CPU[@]}" --set model.gpt.num_layers=2
     --set model.gpt.hidden_size=64 --set model.gpt.num_heads=2 --set model.gpt.seq_len=64)
BERT=(--config "$SRC/configs/bert_base.pbtxt" "${CPU[@]}" --set model.bert.num_layers=2 --set model.bert.hidden_size=64
      --set model.bert.num_heads=2 --set model.bert.intermediate_size=128
      --set model.bert.seq_len=32 --set model.bert.vocab_size=1024)

"$KILN" plan "${GPT[@]}" --world-size 2 --memory-mb 2048 > "$WORK/table" 2>&1 ||
  { cat "$WORK/table"; fail "kiln plan failed"; }
cat "$WORK/table"
[ "$(grep -cE '^[0123] +(NONE|BLOCKS) ' "$WORK/table")" = 8 ] || fail "expected 8 rows (4 stages x 2)"
grep -q "fits" "$WORK/table" || fail "no verdict under --memory-mb"

for name in GPT BERT; do
  declare -n args=$name
  for n in 1 2 4; do
    "$KILN" plan "${args[@]}" --world-size $n --json > "$WORK/$name-$n.json" 2> "$WORK/err" ||
      { cat "$WORK/err"; fail "kiln plan --json for $name on $n GPUs failed"; }
  done
  python3 - "$WORK" "$name" <<'PY' || fail "$name: the plans do not shard as ZeRO does"
import json, sys
work, name = sys.argv[1:3]
plans = {n: json.load(open(f"{work}/{name}-{n}.json")) for n in (1, 2, 4)}
def row(p, stage, recompute):
    return next(r for r in p["plans"] if r["zero_stage"] == stage and r["recompute"] == recompute)
def close(a, b):
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))
base = row(plans[1], 0, "NONE")
assert base["weights_mb"] > 0 and base["gradients_mb"] > 0 and base["moments_mb"] > 0, base
assert base["activations_per_sample_mb"] > 0, base
# AdamW in fp32: two moments of 4 bytes per parameter; fp32 gradients like the weights.
assert close(base["moments_mb"], 2 * base["weights_mb"]), base
assert close(base["gradients_mb"], base["weights_mb"]), base
for n, p in plans.items():
    assert p["world_size"] == n
    for rec in ("NONE", "BLOCKS"):
        s0, s1, s2, s3 = (row(p, s, rec) for s in (0, 1, 2, 3))
        for r in (s0, s1, s2):
            assert close(r["weights_mb"], base["weights_mb"]), r  # never sharded
            assert r["nccl_mb"] == 0, r  # MPI on the CPU: no NCCL buffers
        assert close(s0["moments_mb"], base["moments_mb"]) and close(s0["gradients_mb"], base["gradients_mb"])
        assert close(s1["moments_mb"], base["moments_mb"] / n), (n, s1)          # stage 1: moments
        # Sharded on more than one rank: the full buffers and the reduced shard; stage 2 the
        # shard and, with accumulation (global_batch 512), every full buffer until the last
        # micro-step's reduction.
        shard = base["gradients_mb"] / n if n > 1 else 0
        assert close(s1["gradients_mb"], base["gradients_mb"] + shard), (n, s1)
        grads = shard + base["gradients_mb"]
        assert close(s2["gradients_mb"], grads), (n, s2)                          # stage 2: + grads
        assert close(s2["moments_mb"], base["moments_mb"] / n), (n, s2)
        assert s2["total_mb"] <= s1["total_mb"] + 1e-9 or n == 1, (s1, s2)
        # stage 3: stage 2's, and the weights' shard plus two units whole (the largest here is
        # the embedding the head shares)
        assert close(s3["gradients_mb"], s2["gradients_mb"]) and close(s3["moments_mb"], s2["moments_mb"]), s3
        if n == 1:  # nothing to shard
            assert close(s3["weights_mb"], base["weights_mb"]), s3
        else:
            assert base["weights_mb"] / n < s3["weights_mb"] <= base["weights_mb"] / n + base["weights_mb"] + 1e-9, (n, s3)
    blocks, none = row(p, 0, "BLOCKS"), row(p, 0, "NONE")
    assert blocks["activations_per_sample_mb"] <= none["activations_per_sample_mb"], (none, blocks)
print(name, "shards as ZeRO does on 1, 2, 4 GPUs")
PY
done

# The prediction against a measured step at another batch: the plan's total at batch 16 from its
# probes at 2 and 4, against the peak kiln autobatch measures running batch 16.
"$KILN" autobatch "${GPT[@]}" --max-batch 16 > "$WORK/autobatch" 2>&1 || { cat "$WORK/autobatch"; fail "autobatch failed"; }
python3 - "$WORK" <<'PY' || { cat "$WORK/autobatch"; fail "the prediction at batch 16 is more than 10 % off"; }
import json, re, sys
work = sys.argv[1]
units = {"B": 1 / 1048576, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024}
m = re.search(r"batch +16: fits \(peak ([\d.]+) (\w+)\)", open(f"{work}/autobatch").read())
measured = float(m.group(1)) * units[m.group(2)]
r = next(r for r in json.load(open(f"{work}/GPT-1.json"))["plans"] if r["zero_stage"] == 0 and r["recompute"] == "NONE")
predicted = r["total_mb"] + 12 * r["activations_per_sample_mb"]
print(f"batch 16: predicted {predicted:.1f} MiB, measured {measured:.1f} MiB")
assert abs(predicted - measured) <= 0.1 * measured
PY

# A limit below what anything needs: every row "does not fit", the verdict says nothing fits and
# what to change, and the exit is 1 (not 0 with "lower train.batch_per_gpu" and every largest 0).
code=0
"$KILN" plan "${BERT[@]}" --world-size 1 --memory-mb 1 > "$WORK/tiny" 2>&1 || code=$?
[ "$code" = 1 ] || { cat "$WORK/tiny"; fail "plan under 1 MiB exited $code, expected 1"; }
[ "$(grep -c 'does not fit' "$WORK/tiny")" = 8 ] || { cat "$WORK/tiny"; fail "1 MiB: expected 8 rows that do not fit"; }
grep -q "^nothing fits under 1 MiB on 1 GPU: .*raise --memory-mb" "$WORK/tiny" || { cat "$WORK/tiny"; fail "1 MiB: no verdict naming what to change"; }
! grep -q "lower train.batch_per_gpu" "$WORK/tiny" || fail "1 MiB: advises a lower batch while none fits"
# The experiment's batch too large, a smaller one fitting: exit 1, naming the batch to set.
code=0
"$KILN" plan "${BERT[@]}" --world-size 1 --memory-mb 30 --set train.batch_per_gpu=64 --set train.global_batch=64 \
  > "$WORK/large" 2>&1 || code=$?
[ "$code" = 1 ] && grep -q "^batch 64 fits in no combination: lower train.batch_per_gpu to [0-9]" "$WORK/large" \
  || { cat "$WORK/large"; fail "a batch too large: exit $code"; }
# The largest batch divides train.global_batch / ranks: 24 / 2 = 12 has divisors 1, 2, 3, 4, 6, 12.
"$KILN" plan "${BERT[@]}" --world-size 2 --memory-mb 6 --set train.global_batch=24 --json > "$WORK/div.json" 2>&1 \
  || { cat "$WORK/div.json"; fail "plan with a global batch"; }
python3 - "$WORK/div.json" <<'PY' || fail "a largest batch that does not divide train.global_batch"
import json, sys
plan = json.load(open(sys.argv[1]))
largest = [r["largest_batch"] for r in plan["plans"]]
assert all(b in (0, 1, 2, 3, 4, 6, 12) for b in largest), largest
assert any(b > 0 for b in largest), largest
print("largest batches dividing 24 / 2:", largest)
PY
# A login node: train.device CUDA without a GPU here plans the counted parts (nothing measured).
"$KILN" plan "${BERT[@]}" --set train.device=CUDA --world-size 2 --memory-mb 24576 > "$WORK/login" 2>&1 \
  || { cat "$WORK/login"; fail "a login node cannot plan a GPU job"; }
grep -q "counted only: no GPU here" "$WORK/login" || { cat "$WORK/login"; fail "the counted-only plan does not say so"; }
[ "$(grep -cE '^[0123] +(NONE|BLOCKS) ' "$WORK/login")" = 8 ] || { cat "$WORK/login"; fail "no counted rows"; }
# ZeRO-3 gathering once per step holds every unit whole besides its shard.
"$KILN" plan "${GPT[@]}" --set parallel.zero_stage=3 --set parallel.zero3_gather_once_per_step=true \
  --world-size 2 --json > "$WORK/once.json" 2> "$WORK/err" || { cat "$WORK/err"; fail "plan gathering once per step"; }
python3 - "$WORK/once.json" "$WORK/GPT-2.json" <<'PY' || fail "stage 3 gathering once per step: not the whole weights plus the shard"
import json, sys
once, each = (json.load(open(p))["plans"] for p in sys.argv[1:3])
row = lambda p, s: next(r for r in p if r["zero_stage"] == s and r["recompute"] == "NONE")
whole = row(once, 0)["weights_mb"]
assert abs(row(once, 3)["weights_mb"] - 1.5 * whole) <= 1e-6 * whole, (row(once, 3), whole)
assert row(each, 3)["weights_mb"] <= row(once, 3)["weights_mb"], (row(each, 3), row(once, 3))
PY
# train.recompute KEEP_ALL: the rows without BLOCKS are the experiment's own choice, named so.
"$KILN" plan "${GPT[@]}" --set train.device=CUDA --set train.recompute=KEEP_ALL --world-size 1 \
  > "$WORK/keep" 2>&1 || { cat "$WORK/keep"; fail "plan with train.recompute KEEP_ALL"; }
[ "$(grep -cE '^[0123] +KEEP_ALL ' "$WORK/keep")" = 4 ] && [ "$(grep -cE '^[0123] +NONE ' "$WORK/keep")" = 0 ] \
  || { cat "$WORK/keep"; fail "KEEP_ALL rows not named KEEP_ALL"; }

expect_bad() {  # message-part args...
  local want=$1; shift
  local code=0
  "$KILN" plan "$@" > "$WORK/bad" 2>&1 || code=$?
  [ "$code" = 2 ] || { cat "$WORK/bad"; fail "kiln plan $* exited $code, expected 2"; }
  grep -q -- "$want" "$WORK/bad" || { cat "$WORK/bad"; fail "kiln plan $*: message lacks '$want'"; }
}
expect_bad "config" --world-size 2
expect_bad "world-size" --config "$SRC/configs/bert_base.pbtxt"
expect_bad "world-size must be at least 1" "${BERT[@]}" --world-size 0
expect_bad "unrecognised\|unrecognized" "${BERT[@]}" --world-size 1 --no-such-flag
expect_bad "memory-mb must be positive" "${BERT[@]}" --world-size 1 --memory-mb -5
expect_bad "memory-mb inf: must be a finite number of MiB" "${BERT[@]}" --world-size 1 --memory-mb inf
expect_bad "memory-mb must be positive" "${BERT[@]}" --world-size 1 --memory-mb nan
expect_bad "no_such.pbtxt" --config "$WORK/no_such.pbtxt" --world-size 1
pass "kiln plan: tables for GPT-2 and BERT on 1, 2, 4 GPUs, ZeRO sharding, limits, KEEP_ALL rows, bad command lines"
