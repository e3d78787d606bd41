#!/usr/bin/env bash
# A run stopped at step 10 and resumed continues exactly as the uninterrupted one: the same
# losses (bitwise, as printed with full precision) and bitwise the same weights and optimizer
# state at step 20. With NP=2 in the environment the same under mpirun -np 2; EXTRA_SETS adds
# --set overrides to every training run (test_exact_resume_powersgd.sh).
source "$(dirname "$0")/lib.sh"
NP=${NP:-1}
read -r -a EXTRA <<< "${EXTRA_SETS:-}"
run() {
  if [ "$NP" = 1 ]; then "$KILN" "$@" "${EXTRA[@]}"; else "${MPIRUN[@]}" -np "$NP" "$KILN" "$@" "${EXTRA[@]}"; fi
}

# The reference run also proves that checkpoint.resume "latest" in a config starts fresh when
# there is no checkpoint yet (a batch job's first run).
run train --config "$TINY" --set logging.dir="$WORK/a" --set checkpoint.resume=latest --quiet > "$WORK/a.log" 2>&1 \
  || { cat "$WORK/a.log"; fail "reference run"; }
run train --config "$TINY" --set logging.dir="$WORK/b" --set train.steps=20 --quiet > "$WORK/b1.log" 2>&1 || { cat "$WORK/b1.log"; fail "first half"; }
# Keep only the step-10 checkpoint and the log up to step 10, then resume from it.
rm -rf "$WORK/b/checkpoints/step-000020"
keep_until "$WORK/b/metrics.jsonl" 10
run train --config "$TINY" --set logging.dir="$WORK/b" --resume latest > "$WORK/b2.log" 2>&1 || { cat "$WORK/b2.log"; fail "resumed run"; }
grep -q "resumed from .*step-000010 at step 10" "$WORK/b2.log" || { cat "$WORK/b2.log"; fail "resume message"; }

same_run "$WORK/a" "$WORK/b" 20
if [ -n "${EXPECT_FILE:-}" ]; then
  [ -f "$WORK/b/checkpoints/step-000010/$EXPECT_FILE" ] || fail "no $EXPECT_FILE in the step-10 checkpoint"
  cmp "$WORK/a/checkpoints/step-000020/$EXPECT_FILE" "$WORK/b/checkpoints/step-000020/$EXPECT_FILE" \
    || fail "$EXPECT_FILE differs at step 20"
fi
# kiln eval loads the checkpoint in one process, whatever world size wrote it.
"$KILN" eval --config "$TINY" "${EXTRA[@]}" --set logging.dir="$WORK/b" --set data.eval_split=train --set train.eval_batches=2 \
  > "$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail "kiln eval of the step-20 checkpoint"; }
grep -q "^eval: .*step-000020: loss" "$WORK/eval.log" || { cat "$WORK/eval.log"; fail "no eval result line"; }
# --checkpoint DIR picks an older checkpoint; --resume is its other name.
step10="$WORK/b/checkpoints/step-000010"
for flag in --checkpoint --resume; do
  "$KILN" eval --config "$TINY" "${EXTRA[@]}" --set logging.dir="$WORK/b" --set data.eval_split=train --set train.eval_batches=2 \
    "$flag" "$step10" > "$WORK/eval10$flag.log" 2>&1 || { cat "$WORK/eval10$flag.log"; fail "kiln eval $flag $step10"; }
done
cmp "$WORK/eval10--checkpoint.log" "$WORK/eval10--resume.log" || fail "--checkpoint and --resume read different checkpoints"
! cmp -s "$WORK/eval.log" "$WORK/eval10--checkpoint.log" || fail "kiln eval --checkpoint $step10 evaluated the latest checkpoint"
pass "resume at step 10 reproduces 20 uninterrupted steps bit for bit (np=$NP${EXTRA_SETS:+, $EXTRA_SETS})"
