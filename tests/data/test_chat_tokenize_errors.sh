#!/usr/bin/env bash
# kiln tokenize --chat's command line: each refusal exits 2 naming what is wrong (the file and
# line of a bad conversation) and leaves no shard, mask or temporary file; --on-error skip counts
# the bad conversations; a good run writes a .mask beside each shard and says how many tokens are
# trained.
source "$(dirname "$0")/../train/lib.sh"

# A byte-level tokenizer.json: the 256 byte symbols (GPT-2's bytes_to_unicode), then special tokens.
write_tokenizer() {  # path special-token...
  python3 "$(dirname "$0")/write_byte_tokenizer.py" "$@"
}
write_tokenizer "$WORK/qwen.json" "<|endoftext|>" "<|im_start|>" "<|im_end|>"
write_tokenizer "$WORK/llama.json" "<|begin_of_text|>" "<|start_header_id|>" "<|end_header_id|>" \
  "<|eot_id|>"
write_tokenizer "$WORK/plain.json" "<|endoftext|>"
GOOD='{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]}'
printf '%s\n' "$GOOD" > "$WORK/good.jsonl"
printf 'plain text\n' > "$WORK/a.txt"

expect_refusal() {  # pattern -- command...
  expect_exit2 "$@"
  [ ! -e "$WORK/out" ] || { ls -la "$WORK/out"; fail "a refused run left $WORK/out"; }
  pass "$(head -c 200 "$WORK/out.log")"
}
T=(tokenize --chat --output "$WORK/out")
NEITHER="the tokenizer has neither <|im_start|> (ChatML, Qwen2) nor <|start_header_id|> (Llama 3)"
expect_refusal "$WORK/plain.json: $NEITHER" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/plain.json" --input "$WORK/good.jsonl"
expect_refusal "pass --chat-template chatml|llama3" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/plain.json" --input "$WORK/good.jsonl"
expect_refusal "--chat-template 'vicuna': unknown; the known templates are chatml" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/qwen.json" --input "$WORK/good.jsonl" --chat-template vicuna
expect_refusal "$WORK/qwen.json: the tokenizer has no <|begin_of_text|>, which the llama3 chat" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/qwen.json" --input "$WORK/good.jsonl" --chat-template llama3
expect_refusal "--chat-template chatml: a chat template applies to conversations: add --chat" -- \
  "$KILN" tokenize --output "$WORK/out" --tokenizer "$WORK/qwen.json" --input "$WORK/good.jsonl" \
  --chat-template chatml
expect_refusal "$WORK/a.txt: kiln tokenize --chat reads conversations from .jsonl[.gz] files" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/qwen.json" --input "$WORK/a.txt"

# Each bad conversation stops the run naming its file and line; good lines before it are removed.
bad_line() {  # pattern line
  printf '%s\n%s\n%s\n' "$GOOD" "$GOOD" "$2" > "$WORK/bad.jsonl"
  expect_refusal "$WORK/bad.jsonl:3: $1" -- \
    "$KILN" "${T[@]}" --tokenizer "$WORK/qwen.json" --input "$WORK/bad.jsonl" --shard-tokens 8
}
bad_line "not a JSON line" '{"messages": [}'
bad_line "expected a JSON object with a field 'messages' of messages, found an array" '[1, 2]'
bad_line "no field 'messages' (the object has text" '{"text": "not a chat"}'
bad_line "field 'messages' is a string, not an array of messages" '{"messages": "hi"}'
USER='{"role": "user", "content": "a"}'
bad_line "messages[1] has no \"role\"" "{\"messages\": [$USER, {\"content\": \"b\"}]}"
bad_line "messages[1] has no \"content\"" "{\"messages\": [$USER, {\"role\": \"assistant\"}]}"
bad_line "messages[0].content is an array, not a string" \
  '{"messages": [{"role": "user", "content": [{"type": "text"}]}]}'
bad_line "messages[1].role 'tool': unknown (kiln tokenize --chat knows system, user and assistant)" \
  "{\"messages\": [$USER, {\"role\": \"tool\", \"content\": \"b\"}]}"
bad_line "the conversation has no assistant message" "{\"messages\": [$USER]}"
bad_line "invalid UTF-8: byte 0xFF" $'{"messages": [{"role": "user", "content": "\xff"}]}'
# --field names the array of messages in chat mode.
expect_refusal "$WORK/good.jsonl:1: no field 'turns'" -- \
  "$KILN" "${T[@]}" --tokenizer "$WORK/qwen.json" --input "$WORK/good.jsonl" --field turns

# --on-error skip: the run goes on, the summary counts the skipped conversations.
printf '%s\n{"messages": []}\n%s\n{"text": "x"}\n' "$GOOD" "$GOOD" > "$WORK/mixed.jsonl"
"$KILN" "${T[@]}" --tokenizer "$WORK/llama.json" --input "$WORK/mixed.jsonl" --on-error skip \
  --val-fraction 0 > "$WORK/out.log" 2>&1 || { cat "$WORK/out.log"; fail "skip run"; }
grep -q "skipped $WORK/mixed.jsonl:2: field 'messages' holds no message" "$WORK/out.log" ||
  { cat "$WORK/out.log"; fail "the skipped conversation is not named"; }
grep -q "kiln tokenize: 2 documents (2 skipped)" "$WORK/out.log" ||
  { cat "$WORK/out.log"; fail "the summary does not count the skipped conversations"; }
grep -q "kiln tokenize: chat template llama3; [0-9]* of [0-9]* tokens trained" "$WORK/out.log" ||
  { cat "$WORK/out.log"; fail "the summary does not name the template and the trained tokens"; }
[ "$(ls "$WORK/out")" = "$(printf 'out_train_000001.bin\nout_train_000001.mask')" ] ||
  { ls -la "$WORK/out"; fail "unexpected files in the output"; }
pass "--on-error skip: $(tail -1 "$WORK/out.log" | head -c 200)"
# A plain run into a folder holding masks of that name is refused: they would attach themselves.
rm "$WORK/out/out_train_000001.bin"
code=0
"$KILN" tokenize --output "$WORK/out" --tokenizer "$WORK/plain.json" --input "$WORK/a.txt" \
  > "$WORK/out.log" 2>&1 || code=$?
[ "$code" = 2 ] && grep -qF "already holds 1 mask(s) named out_train_*.mask" "$WORK/out.log" ||
  { cat "$WORK/out.log"; fail "a run into a folder with masks was not refused"; }
pass "$(head -c 200 "$WORK/out.log")"
"$KILN" tokenize --help | grep -q -- "--chat-template" || fail "--help"
pass "kiln tokenize --help names --chat-template"
