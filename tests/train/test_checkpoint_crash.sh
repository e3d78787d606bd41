#!/usr/bin/env bash
# Crashes during checkpoint writing: SIGKILL at 20 random moments of a run that checkpoints
# every step, and a full disk. A partial checkpoint is never loaded (resume uses the newest
# complete one), and the full disk gives a clear message and a non-zero exit.
source "$(dirname "$0")/lib.sh"
RUN=(--set checkpoint.every_steps=1 --set checkpoint.keep_last=3 --set train.steps=100000 --set logging.dir="$WORK/c")
EVAL=(--set data.eval_split=train --set train.eval_batches=1 --set logging.dir="$WORK/c")
kills=0 partial_seen=0
# A first complete checkpoint, so that every later round has one to fall back on.
"$KILN" train --config "$TINY" "${RUN[@]}" --set train.steps=2 --quiet > "$WORK/run.log" 2>&1 || { cat "$WORK/run.log"; fail "first run"; }
for i in $(seq 1 20); do
  "$KILN" train --config "$TINY" "${RUN[@]}" --resume latest --quiet > "$WORK/run.log" 2>&1 &
  pid=$!
  sleep "$(python3 -c "import random; print(round(random.uniform(0.4, 1.6), 2))")"
  kill -KILL "$pid" 2>/dev/null && kills=$((kills + 1))
  wait "$pid" 2>/dev/null || true
  ls -a "$WORK/c/checkpoints" | grep -q '^\.tmp-' && partial_seen=$((partial_seen + 1))
  # The newest complete checkpoint loads and verifies; partial directories are ignored.
  "$KILN" eval --config "$TINY" "${EVAL[@]}" --resume latest > "$WORK/eval.log" 2>&1 \
    || { cat "$WORK/eval.log"; ls -la "$WORK/c/checkpoints"; fail "round $i: the latest checkpoint does not load"; }
done
latest=$(ls -d "$WORK/c/checkpoints"/step-* | tail -1)
pass "20 SIGKILLs during checkpointing ($kills landed, $partial_seen left a partial directory): every resume loaded a complete checkpoint (last $(basename "$latest"))"

# A full disk: a 1 MiB tmpfs cannot hold the checkpoint.
mkdir -p "$WORK/full"
if ! mount -t tmpfs -o size=1m tmpfs "$WORK/full" 2>/dev/null; then
  fail "cannot mount a tmpfs (the test needs root)"
fi
trap 'umount "$WORK/full" 2>/dev/null; rm -rf "$WORK"' EXIT
code=0
"$KILN" train --config "$TINY" --set train.steps=2 --set logging.dir="$WORK/logs" \
  --set checkpoint.dir="$WORK/full/ckpt" > "$WORK/full.log" 2>&1 || code=$?
[ "$code" != 0 ] || fail "a full disk went unnoticed"
grep -q "disk is full" "$WORK/full.log" || { cat "$WORK/full.log"; fail "no full-disk message"; }
grep -q "$WORK/full/ckpt" "$WORK/full.log" || fail "the message does not name the file"
[ -z "$(ls "$WORK/full/ckpt" | grep '^step-')" ] || fail "a checkpoint directory was left under a final name"
pass "full disk: '$(grep -m1 'disk is full' "$WORK/full.log" | cut -c1-140)' (exit $code)"
