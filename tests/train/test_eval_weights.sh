#!/usr/bin/env bash
# The weights kiln eval and kiln sample read (issue "nothing lost, nothing misread", item 2):
# kiln eval evaluates model.init_from when there is no checkpoint, as kiln sample samples from it;
# its errors name the options the user typed (--checkpoint), never --resume; and a checkpoint's
# recorded experiment gives the model's shape, so the --set it was trained with need not be
# typed again.
source "$(dirname "$0")/lib.sh"
GPT=$SRC/tests/infer/tiny_gpt2.pbtxt
EVAL=(--set data.eval_split=train --set train.eval_batches=2)
# Trained with a shape the config does not have: one layer instead of two.
"$KILN" train --config "$GPT" --set logging.dir="$WORK/one" --set model.gpt.num_layers=1 --quiet \
  > "$WORK/train.log" 2>&1 || { cat "$WORK/train.log"; fail "train"; }
ck="$WORK/one/checkpoints/step-000003"
"$KILN" sample --config "$GPT" --checkpoint "$ck" --prompt-tokens "1 2" --max-new-tokens 2 > "$WORK/s.log" 2>&1 \
  || { cat "$WORK/s.log"; fail "kiln sample --checkpoint DIR needs the training's --set again"; }
grep -q "come from the experiment recorded in $ck/state.pbtxt" "$WORK/s.log" || { cat "$WORK/s.log"; fail "sample: no note"; }
"$KILN" eval --config "$GPT" --checkpoint "$ck" "${EVAL[@]}" > "$WORK/e.log" 2>&1 \
  || { cat "$WORK/e.log"; fail "kiln eval --checkpoint DIR needs the training's --set again"; }
grep -q "^eval: $ck: loss" "$WORK/e.log" || { cat "$WORK/e.log"; fail "eval of the checkpoint"; }
# The run's own directory, found by --set logging.dir alone.
"$KILN" eval --config "$GPT" --set logging.dir="$WORK/one" "${EVAL[@]}" > "$WORK/e2.log" 2>&1 \
  || { cat "$WORK/e2.log"; fail "kiln eval of the latest checkpoint needs the training's --set again"; }
# A model.* --set typed now still applies on top (here: a shape the checkpoint does not have).
code=0
"$KILN" eval --config "$GPT" --checkpoint "$ck" --set model.gpt.num_layers=2 "${EVAL[@]}" > "$WORK/e3.log" 2>&1 || code=$?
[ "$code" = 2 ] && grep -q "different model configuration" "$WORK/e3.log" || { cat "$WORK/e3.log"; fail "a typed model.* --set was ignored"; }

# model.init_from, no checkpoint: evaluated (a checkpoint's model.safetensors is such a file).
"$KILN" train --config "$GPT" --set logging.dir="$WORK/two" --quiet > /dev/null 2>&1 || fail "train two layers"
cp "$WORK/two/checkpoints/step-000003/model.safetensors" "$WORK/w.safetensors"
"$KILN" eval --config "$GPT" --set logging.dir="$WORK/none" --set model.init_from="$WORK/w.safetensors" "${EVAL[@]}" \
  > "$WORK/i.log" 2>&1 || { cat "$WORK/i.log"; fail "kiln eval of model.init_from"; }
grep -q "^eval: model.init_from $WORK/w.safetensors: loss" "$WORK/i.log" || { cat "$WORK/i.log"; fail "init_from not named"; }
[ ! -e "$WORK/none" ] || { ls -la "$WORK/none"; fail "kiln eval created logging.dir (it only reads)"; }
# Neither: the error names what to do, in the options of kiln eval.
expect_exit2 "no complete checkpoint in $WORK/none/checkpoints (checkpoint.dir) and no model.init_from" -- \
  "$KILN" eval --config "$GPT" --set logging.dir="$WORK/none" "${EVAL[@]}"
grep -q -- "--checkpoint DIR" "$WORK/out.log" || { cat "$WORK/out.log"; fail "no --checkpoint in the advice"; }
! grep -q -- "--resume" "$WORK/out.log" || { cat "$WORK/out.log"; fail "names --resume, which kiln eval was not given"; }
expect_exit2 "--checkpoint latest: no complete checkpoint" -- \
  "$KILN" eval --config "$GPT" --set logging.dir="$WORK/none" --checkpoint latest "${EVAL[@]}"
! grep -q -- "--resume" "$WORK/out.log" || { cat "$WORK/out.log"; fail "names --resume after --checkpoint latest"; }
expect_exit2 "--resume latest: no complete checkpoint" -- \
  "$KILN" eval --config "$GPT" --set logging.dir="$WORK/none" --resume latest "${EVAL[@]}"
pass "kiln eval reads model.init_from; errors name --checkpoint; checkpoints give their model's shape"
