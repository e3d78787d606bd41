#!/usr/bin/env bash
# A run directory holds one run (docs/training.md, "The run directory"): a fresh run in a
# logging.dir with another run's metrics.jsonl, or a checkpoint.dir with its checkpoints, exits 2
# naming the directory and --resume latest, and leaves the first run's files as they were;
# --resume latest continues it, and a new logging.dir starts beside it. (.kiln-lock names its
# last holder, so each run rewrites it.)
source "$(dirname "$0")/lib.sh"
ARGS=(--config "$TINY" --set train.steps=4 --set checkpoint.every_steps=2 --quiet)

"$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/a" > "$WORK/a.log" 2>&1 \
  || { cat "$WORK/a.log"; fail "first run"; }
before=$(cd "$WORK/a" && find . -type f ! -name .kiln-lock -exec md5sum {} + | sort)

expect_refused() {  # pattern -- command...
  expect_exit2 "$@"
  grep -qF -- "--resume latest" "$WORK/out.log" || { cat "$WORK/out.log"; fail "message does not name --resume latest"; }
  [ "$(cd "$WORK/a" && find . -type f ! -name .kiln-lock -exec md5sum {} + | sort)" = "$before" ] \
    || fail "a refused run changed the first run's files"
  pass "$(tail -1 "$WORK/out.log" | head -c 200)"
}
# The same directory, with another step count (its checkpoints would be pruned by the old ones).
expect_refused "logging.dir $WORK/a already holds another run's metrics" -- \
  "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/a" --set train.steps=3
# Another logging.dir, the first run's checkpoint.dir.
expect_refused "checkpoint.dir $WORK/a/checkpoints already holds another run's checkpoints" -- \
  "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/b" --set checkpoint.dir="$WORK/a/checkpoints"
# checkpoint.resume latest in the config finds nothing to resume in an empty directory: fresh.
"$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/c" --set checkpoint.resume=latest \
  > "$WORK/c.log" 2>&1 || { cat "$WORK/c.log"; fail "a first run with checkpoint.resume latest"; }

# Continuing it is what --resume latest is for: metrics.jsonl grows, the checkpoints stay in order.
"$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/a" --set train.steps=6 --resume latest \
  > "$WORK/r.log" 2>&1 || { cat "$WORK/r.log"; fail "--resume latest"; }
[ "$(losses "$WORK/a/metrics.jsonl" | wc -l)" = 6 ] || fail "the resumed run did not append to metrics.jsonl"
[ -d "$WORK/a/checkpoints/step-000006" ] || fail "the resumed run wrote no final checkpoint"
# A new directory starts beside it.
"$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/d" > "$WORK/d.log" 2>&1 \
  || { cat "$WORK/d.log"; fail "a run in a new logging.dir"; }
pass "a fresh run never reuses another run's directory; --resume latest and a new logging.dir work"
