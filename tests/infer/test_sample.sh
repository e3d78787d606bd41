#!/usr/bin/env bash
# kiln sample on a tiny GPT-2 trained here: where the weights come from, ids and text in and out
# (GPT-2's BPE files, and the same tokenizer as a tokenizer.json),
# --json, the seed, the stop at max_positions, and every refusal (exit 2, naming the option).
# The KV cache's agreement with --no-kv-cache is test_sample_kv_cache.sh.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/sample_lib.sh"

expect_refusal() {  # pattern -- command...
  local pattern=$1; shift 2
  local code=0
  "$@" > "$WORK/out.log" 2>&1 || code=$?
  [ "$code" = 2 ] || { cat "$WORK/out.log"; fail "expected exit 2, got $code: $*"; }
  grep -q -- "$pattern" "$WORK/out.log" || { cat "$WORK/out.log"; fail "no '$pattern' in the message"; }
  pass "$(head -c 200 "$WORK/out.log")"
}
S=("$KILN" sample --config "$GPT" "${RUN[@]}")

# Options, before anything is loaded.
expect_refusal "no prompt: give --prompt-tokens" -- "${S[@]}"
expect_refusal "--prompt needs a tokenizer to turn text into tokens: --tokenizer tokenizer.json, or --vocab" -- \
  "${S[@]}" --prompt "hello"
expect_refusal "--prompt and --prompt-tokens exclude each other" -- "${S[@]}" --prompt a --prompt-tokens 1
expect_refusal "--vocab needs --merges" -- "${S[@]}" --prompt-tokens 1 --vocab "$WORK/vocab.json"
expect_refusal "--tokenizer and --vocab/--merges exclude each other" -- \
  "${S[@]}" --prompt hi --tokenizer "$WORK/tokenizer.json" --vocab "$WORK/vocab.json"
expect_refusal "--prompt-tokens: 'x1' is not a token id" -- "${S[@]}" --prompt-tokens "1 x1"
expect_refusal "--temperature -1: must be a finite number >= 0" -- "${S[@]}" --prompt-tokens 1 --temperature -1
expect_refusal "--top-k -3: must be >= 0" -- "${S[@]}" --prompt-tokens 1 --top-k -3
expect_refusal "--max-new-tokens 0: must be >= 1" -- "${S[@]}" --prompt-tokens 1 --max-new-tokens 0
expect_refusal "unrecognised option '--top_k'" -- "${S[@]}" --prompt-tokens 1 --top_k 3
expect_refusal "model.name 'fashion_cnn': kiln sample generates from causal language models only" -- \
  "$KILN" sample --config "$SRC/tests/train/tiny.pbtxt" "${RUN[@]}" --prompt-tokens 1
expect_refusal "$WORK/nothing/vocab.json: cannot open the vocabulary: nothing (no such file or directory)" -- \
  "${S[@]}" --prompt hi --vocab "$WORK/nothing/vocab.json" --merges "$WORK/nothing/merges.txt"
expect_refusal "$WORK/nothing/tokenizer.json: cannot open the tokenizer: nothing (no such file or directory)" -- \
  "${S[@]}" --prompt hi --tokenizer "$WORK/nothing/tokenizer.json"
# A FIFO would block the read forever and /dev/zero never end: refused at once (timeout: a hang
# fails the test).
mkfifo "$WORK/fifo"
printf '{"a": 0}' > "$WORK/one.json"
for bad in "$WORK/fifo" /dev/zero; do
  expect_refusal "$bad: the vocabulary must be a regular file, but it is a" -- \
    timeout 10 "${S[@]}" --prompt hi --vocab "$bad" --merges "$WORK/nothing/merges.txt"
  expect_refusal "$bad: the BPE merges must be a regular file, but it is a" -- \
    timeout 10 "${S[@]}" --prompt hi --vocab "$WORK/one.json" --merges "$bad"
  expect_refusal "$bad: the tokenizer must be a regular file, but it is a" -- \
    timeout 10 "${S[@]}" --prompt hi --tokenizer "$bad"
done
# No weights yet: random ones would only make noise.
expect_refusal "no weights to sample from: no complete checkpoint in $WORK/run/checkpoints (checkpoint.dir) and no model.init_from" -- \
  "${S[@]}" --prompt-tokens "1 2"
expect_refusal "--checkpoint latest: no complete checkpoint in" -- "${S[@]}" --prompt-tokens 1 --checkpoint latest

train_tiny_gpt2
CKPT=$WORK/run/checkpoints/step-000003
[ -d "$CKPT" ] || fail "no $CKPT after training"
expect_refusal "--prompt-tokens: token 512 is outside the model's vocabulary (model.gpt.vocab_size = 512)" -- \
  "${S[@]}" --prompt-tokens "1 512"
expect_refusal "--prompt-tokens: 65 tokens, more than model.gpt.max_positions = 64" -- \
  "${S[@]}" --prompt-tokens "$(seq -s ' ' 1 65)"
expect_refusal "$CKPT/model.safetensors: parameter 'transformer.wte.weight' has shape (512, 64), the model needs (512, 32)" -- \
  "${S[@]}" --prompt-tokens 1 --set model.gpt.hidden_size=32
expect_refusal "checkpoint of model 'gpt2', this experiment's model is 'gpt2_medium'" -- \
  "${S[@]}" --prompt-tokens 1 --set model.name=gpt2_medium --set model.gpt.num_layers=2 \
  --set model.gpt.hidden_size=64 --set model.gpt.num_heads=2

# Token ids: the newest checkpoint by default, 8 new ids in the vocabulary on stdout.
"${S[@]}" --prompt-tokens "1 2 3" --max-new-tokens 8 > "$WORK/ids.txt" 2> "$WORK/ids.err" ||
  { cat "$WORK/ids.txt" "$WORK/ids.err"; fail "kiln sample --prompt-tokens"; }
read -r -a ids < "$WORK/ids.txt"
[ "${#ids[@]}" = 8 ] || fail "expected 8 ids, got: $(cat "$WORK/ids.txt")"
for id in "${ids[@]}"; do [[ $id =~ ^[0-9]+$ ]] && [ "$id" -lt 512 ] || fail "bad id $id"; done
grep -q "8 tokens from $CKPT on cpu .*stopped at max_new_tokens" "$WORK/ids.err" ||
  { cat "$WORK/ids.err"; fail "no summary on stderr"; }
pass "ids: $(cat "$WORK/ids.txt")"

# --json: the fields and their types.
"${S[@]}" --prompt-tokens "1 2 3" --max-new-tokens 8 --json --temperature 0.7 --top-k 20 --seed 4 \
  > "$WORK/out.json" || fail "kiln sample --json"
python3 - "$WORK/out.json" "$CKPT" <<'PY' || fail "--json output"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
r = json.loads(lines[0])
assert r["model"] == "gpt2" and r["weights"] == sys.argv[2] and r["device"] == "cpu", r
assert r["kv_cache"] is True and r["temperature"] == 0.7 and r["top_k"] == 20 and r["seed"] == 4, r
assert r["prompt_tokens"] == [1, 2, 3], r
assert len(r["tokens"]) == 8 and all(isinstance(t, int) and 0 <= t < 512 for t in r["tokens"]), r
assert r["stop_reason"] == "max_new_tokens" and r["seconds"] >= 0 and "text" not in r, r
PY
pass "--json: $(cat "$WORK/out.json")"

# The seed decides the draws (temperature 1); the same seed twice, with or without the cache
# path's code running, gives the same tokens (--no-kv-cache: the same either way, before the
# causal branch).
for cache in "" --no-kv-cache; do
  a=$("${S[@]}" --prompt-tokens "7 8" --max-new-tokens 16 --seed 11 $cache --json | json_tokens)
  b=$("${S[@]}" --prompt-tokens "7 8" --max-new-tokens 16 --seed 11 $cache --json | json_tokens)
  c=$("${S[@]}" --prompt-tokens "7 8" --max-new-tokens 16 --seed 12 $cache --json | json_tokens)
  [ "$a" = "$b" ] || fail "seed 11 twice${cache:+ ($cache)}: '$a' vs '$b'"
  [ "$a" != "$c" ] || fail "seeds 11 and 12 gave the same 16 tokens${cache:+ ($cache)}: $a"
  pass "seed determinism${cache:+ ($cache)}: $a"
done

# The sequence stops at max_positions (64): a 60-token prompt leaves room for 4.
"${S[@]}" --prompt-tokens "$(seq -s ' ' 1 60)" --max-new-tokens 10 --no-kv-cache --json \
  > "$WORK/stop.json" || fail "kiln sample at max_positions"
python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); assert len(r["tokens"]) == 4 and r["stop_reason"] == "max_positions", r' \
  "$WORK/stop.json" || fail "stop at max_positions: $(cat "$WORK/stop.json")"
pass "stops at max_positions: 60 + 4 tokens"

# --checkpoint DIR, and model.init_from when checkpoint.dir has none.
"${S[@]}" --prompt-tokens "1 2 3" --max-new-tokens 8 --checkpoint "$CKPT" > "$WORK/dir.txt" ||
  fail "--checkpoint DIR"
cmp "$WORK/ids.txt" "$WORK/dir.txt" || fail "--checkpoint DIR differs from the default (latest)"
"$KILN" sample --config "$GPT" --set logging.dir="$WORK/empty" \
  --set model.init_from="$CKPT/model.safetensors" --prompt-tokens "1 2 3" --max-new-tokens 8 \
  > "$WORK/init.txt" 2> "$WORK/init.err" || { cat "$WORK/init.err"; fail "model.init_from"; }
cmp "$WORK/ids.txt" "$WORK/init.txt" || fail "model.init_from gave other tokens than its checkpoint"
grep -q "from $CKPT/model.safetensors" "$WORK/init.err" || fail "the summary does not name init_from"
pass "--checkpoint DIR and model.init_from give the checkpoint's tokens"

# Text: --prompt with BPE files (ids 0..511), a known encoding, and the text out.
write_bpe_files "$WORK"
B=(--vocab "$WORK/vocab.json" --merges "$WORK/merges.txt")
"${S[@]}" "${B[@]}" --prompt "abba" --max-new-tokens 6 --json > "$WORK/text.json" || fail "--prompt --json"
python3 - "$WORK/text.json" <<'PY' || fail "--prompt --json: $(cat "$WORK/text.json")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["prompt"] == "abba" and r["prompt_tokens"] == [257, 272], r  # ab (rank 1) before ba
assert len(r["tokens"]) == 6 and isinstance(r["text"], str) and r["text"], r
PY
"${S[@]}" "${B[@]}" --prompt "abba" --max-new-tokens 6 > "$WORK/text.txt" || fail "--prompt"
python3 - "$WORK/text.txt" "$WORK/text.json" <<'PY' || fail "--prompt: $(cat "$WORK/text.txt")"
import json, sys
r = json.load(open(sys.argv[2]))
assert open(sys.argv[1], encoding="utf-8").read() == "abba" + r["text"] + "\n"
PY
# Token ids in, text out.
"${S[@]}" "${B[@]}" --prompt-tokens "257 272" --max-new-tokens 6 > "$WORK/ids_text.txt" ||
  fail "--prompt-tokens with BPE files"
cmp "$WORK/text.txt" "$WORK/ids_text.txt" || fail "the same prompt as ids and as text differ"
pass "text: $(head -c 80 "$WORK/text.txt")"
# A vocabulary larger than the model's.
python3 -c 'import json, sys; v = json.load(open(sys.argv[1])); v["zz"] = 600; json.dump(v, open(sys.argv[2], "w"))' \
  "$WORK/vocab.json" "$WORK/big.json"
echo "z z" >> "$WORK/merges.txt"
expect_refusal "--prompt: token 600 is outside the model's vocabulary (model.gpt.vocab_size = 512): the tokenizer and the model do not match" -- \
  "${S[@]}" --vocab "$WORK/big.json" --merges "$WORK/merges.txt" --prompt "zz"

# The same tokenizer as Hugging Face's tokenizer.json: the same prompt ids, tokens and text.
write_bpe_files "$WORK"
write_tokenizer_json "$WORK"
for opts in "--vocab $WORK/vocab.json --merges $WORK/merges.txt" "--tokenizer $WORK/tokenizer.json"; do
  # shellcheck disable=SC2086
  "${S[@]}" $opts --prompt "abba cd" --max-new-tokens 6 --seed 5 --json > "$WORK/same.json" ||
    fail "kiln sample $opts"
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); del r["seconds"], r["tokens_per_s"]; print(json.dumps(r, sort_keys=True))' \
    "$WORK/same.json" >> "$WORK/both.txt"
done
[ "$(sort -u "$WORK/both.txt" | wc -l)" = 1 ] || { cat "$WORK/both.txt"; fail "--tokenizer and --vocab/--merges differ"; }
pass "--tokenizer gives what --vocab/--merges give: $(head -c 160 "$WORK/both.txt")"
# A tokenizer.json Kiln does not read is refused naming the file and the part.
python3 -c 'import json, sys; t = json.load(open(sys.argv[1])); t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "_"}; json.dump(t, open(sys.argv[2], "w"), indent=1)' \
  "$WORK/tokenizer.json" "$WORK/metaspace.json"
expect_refusal "$WORK/metaspace.json: pre_tokenizer (line 7, column [0-9]*): type 'Metaspace' is not supported (Kiln reads ByteLevel, Split)" -- \
  "${S[@]}" --tokenizer "$WORK/metaspace.json" --prompt "ab"
