#!/usr/bin/env bash
# kiln tokenize's command line: each refusal exits 2 with a message saying what is wrong (and
# leaves no shard and no temporary file); a bad document stops the run naming its file and line,
# or with --on-error skip is counted in the summary; --progress shows the progress line.
source "$(dirname "$0")/../train/lib.sh"

# A byte-level tokenizer.json: the 256 byte symbols (GPT-2's bytes_to_unicode), then special tokens.
write_tokenizer() {  # path special-token...
  python3 "$(dirname "$0")/write_byte_tokenizer.py" "$@"
}
write_tokenizer "$WORK/tok.json" "<|endoftext|>"
write_tokenizer "$WORK/nosep.json" "<|something|>"
mkdir "$WORK/in"
printf 'a first text\n' > "$WORK/in/a.txt"
printf '{"text": "one"}\n{"text": "two"}\n' > "$WORK/in/b.jsonl"
printf '{"text": "ok"}\n{"text": "ok"}\n{"text": 3}\n{"text": "ok"}\n' > "$WORK/bad.jsonl"

expect_refusal() {  # pattern -- command...
  expect_exit2 "$@"
  [ ! -e "$WORK/out" ] || { ls -la "$WORK/out"; fail "a refused run left $WORK/out"; }
  pass "$(head -c 200 "$WORK/out.log")"
}
T=(tokenize --output "$WORK/out")
expect_refusal "$WORK/nope.json: cannot open the tokenizer" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/nope.json" --input "$WORK/in/*.txt"
expect_refusal "$WORK/in/*.md: matches no file" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/tok.json" --input "$WORK/in/*.md"
expect_refusal "--on-error 'maybe': expected stop" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/tok.json" --input "$WORK/in/a.txt" --on-error maybe
expect_refusal "the option '--output' is required" -- \
  "$KILN" tokenize --tokenizer "$WORK/tok.json" --input "$WORK/in/a.txt"
expect_refusal "--val-fraction 1.5" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/tok.json" --input "$WORK/in/a.txt" --val-fraction 1.5
expect_refusal "--shard-tokens 0: must be from 1" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/tok.json" --input "$WORK/in/a.txt" --shard-tokens 0
expect_refusal "neither <|begin_of_text|> (Llama 3) nor <|endoftext|>" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/nosep.json" --input "$WORK/in/a.txt"
expect_refusal "--separator '<|eot_id|>'" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/tok.json" --input "$WORK/in/a.txt" --separator "<|eot_id|>"
# A bad document stops the run: file and line named, the shards already complete removed.
expect_refusal "$WORK/bad.jsonl:3: field 'text' is a number, not a string" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/tok.json" --input "$WORK/in/*" --input "$WORK/bad.jsonl" \
  --shard-tokens 4

# --on-error skip: the run goes on, the summary counts the skipped document.
"$KILN" "${T[@]}" --tokenizer "$WORK/tok.json" --input "$WORK/in/*" --input "$WORK/bad.jsonl" \
  --on-error skip --progress --threads 2 > "$WORK/out.log" 2>&1 || { cat "$WORK/out.log"; fail "skip run"; }
grep -q "skipped $WORK/bad.jsonl:3: field 'text' is a number" "$WORK/out.log" ||
  { cat "$WORK/out.log"; fail "the skipped document is not named"; }
grep -q "kiln tokenize: 6 documents (1 skipped)" "$WORK/out.log" ||
  { cat "$WORK/out.log"; fail "the summary does not count the skipped document"; }
grep -q "^kiln tokenize: [0-9]* documents, [0-9]* tokens, [0-9.]* MB/s" "$WORK/out.log" ||
  { cat "$WORK/out.log"; fail "--progress showed no progress line"; }
[ "$(ls "$WORK/out")" = "$(printf 'out_train_000001.bin\nout_val_000000.bin')" ] ||
  { ls -la "$WORK/out"; fail "unexpected files in the output"; }
pass "--on-error skip: $(tail -1 "$WORK/out.log" | head -c 200)"
# Without --progress and with stderr not a terminal: no progress line.
rm -rf "$WORK/out"
"$KILN" "${T[@]}" --tokenizer "$WORK/tok.json" --input "$WORK/in/*" > "$WORK/out.log" 2>&1 ||
  { cat "$WORK/out.log"; fail "plain run"; }
[ "$(wc -l < "$WORK/out.log")" = 1 ] || { cat "$WORK/out.log"; fail "more than the summary"; }
pass "no progress line without --progress off a terminal"
# The same folder again: refused, the shards there kept.
expect_refusal_kept() {
  local code=0
  "$KILN" "${T[@]}" --tokenizer "$WORK/tok.json" --input "$WORK/in/*" > "$WORK/out.log" 2>&1 || code=$?
  [ "$code" = 2 ] && grep -q "already holds 1 shard(s) named out_val_\*.bin" "$WORK/out.log" ||
    { cat "$WORK/out.log"; fail "a second run into the same folder was not refused"; }
  [ -s "$WORK/out/out_train_000001.bin" ] || fail "the first run's shards are gone"
  pass "$(head -c 200 "$WORK/out.log")"
}
expect_refusal_kept
"$KILN" tokenize --help | grep -q -- "--val-fraction" || fail "--help"
pass "kiln tokenize --help"
