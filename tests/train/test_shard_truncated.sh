#!/usr/bin/env bash
# An llm.c shard truncated while a run reads it (issue 32): it used to be mapped, and the run died
# of SIGBUS. Now the read fails with an error naming the shard, the steps done since the last
# checkpoint are saved first (one rank), kiln train exits 2, and once the shard is back
# --resume latest continues from that checkpoint.
source "$(dirname "$0")/lib.sh"
CONFIG=$SRC/tests/train/tiny_gpt.pbtxt
mkdir -p "$WORK/shards"
python3 - "$WORK/shards" <<'PY'
import struct, sys
def write(path, count, phase):
    tokens = [(7 * i + phase) % 512 for i in range(count)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, count, *([0] * 253)))
        f.write(struct.pack(f"<{count}H", *tokens))
write(f"{sys.argv[1]}/tiny_train_000001.bin", 20000, 0)
write(f"{sys.argv[1]}/tiny_train_000002.bin", 20000, 5)
PY
cp "$WORK/shards/tiny_train_000001.bin" "$WORK/shard1.bin"
cd "$WORK"
# Steps of 2 s from step 2 (the slow-step fault); one worker and one batch ahead, so the
# truncation reaches a batch within a few steps.
ARGS=(--config "$CONFIG" --set train.steps=30 --set checkpoint.every_steps=0 --set data.workers=1
      --set data.prefetch=1 --set train.eval_every=0 --set data.eval_split=none --set logging.dir="$WORK/run")
KILN_FAULT_KIND=slow-step KILN_FAULT_STEP=2 timeout 120 "$KILN" train "${ARGS[@]}" > "$WORK/cut.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  [ -f "$WORK/run/metrics.jsonl" ] && [ "$(wc -l < "$WORK/run/metrics.jsonl")" -ge 2 ] && break
  sleep 0.1
done
truncate -s 1124 "$WORK/shards/tiny_train_000001.bin"  # the header and 50 tokens of 20000
code=0; wait "$pid" || code=$?
[ "$code" = 2 ] || { cat "$WORK/cut.log"; fail "exit $code after truncating a shard, expected 2 (138/135: SIGBUS)"; }
grep -qF "kiln train: shards/tiny_train_000001.bin: the file ends before bytes" "$WORK/cut.log" \
  || { cat "$WORK/cut.log"; fail "the message does not name the truncated shard"; }
grep -qF "it had 41024 bytes when opened and is now 1124 bytes (truncated or rewritten while in use?)" "$WORK/cut.log" \
  || { cat "$WORK/cut.log"; fail "the message does not give the sizes"; }
step=$(sed -n 's/^data error at step \([0-9]*\): checkpointing the \([0-9]*\) steps done$/\2/p' "$WORK/cut.log")
[ -n "$step" ] && [ "$step" -ge 2 ] || { cat "$WORK/cut.log"; fail "no checkpoint of the steps done"; }
ck=$WORK/run/checkpoints/$(printf 'step-%06d' "$step")
[ -f "$ck/MANIFEST" ] || { ls -R "$WORK/run"; fail "no complete checkpoint $ck"; }
grep -qF "the steps done are kept in $ck: restore the file, then continue with --resume latest" "$WORK/cut.log" \
  || { cat "$WORK/cut.log"; fail "no hint to resume"; }
! grep -qiE "bus error|terminate called|Segmentation" "$WORK/cut.log" || fail "crash output"
took=$(grep -c '"loss"' "$WORK/run/metrics.jsonl")
pass "truncated shard: exit 2 naming it, the $step steps done checkpointed ($took logged)"

cp "$WORK/shard1.bin" "$WORK/shards/tiny_train_000001.bin"
timeout 120 "$KILN" train "${ARGS[@]}" --resume latest > "$WORK/resume.log" 2>&1 \
  || { cat "$WORK/resume.log"; fail "--resume latest after the shard was restored"; }
grep -qF "resumed from $ck at step $step" "$WORK/resume.log" || { cat "$WORK/resume.log"; fail "did not resume from $ck"; }
[ -d "$WORK/run/checkpoints/step-000030" ] || fail "the resumed run did not finish"
pass "restored shard: --resume latest continued from step $step to 30"
