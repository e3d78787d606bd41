# Shared by the chat fine-tuning tests (test_chat_sft.sh, test_lora_sft.sh), sourced after lib.sh:
# four questions with one-word answers as TRL-style JSONL conversations, tokenized with kiln
# tokenize --chat (ChatML, a byte-level tokenizer with <|im_start|> and <|im_end|>), and the
# checks that a fine-tuned model answers each and has not learned the masked user turns.
CHAT_PAIRS=("colour of the sky?|blue" "capital of France?|Paris" "two plus two?|four" "opposite of hot?|cold")

write_chat_shards() {  # dir: $dir/tokenizer.json and $dir/sft/sft_train_*.bin with .mask
  local dir=$1
  python3 "$SRC/tests/data/write_byte_tokenizer.py" "$dir/tokenizer.json" "<|endoftext|>" "<|im_start|>" "<|im_end|>"
  python3 - "$dir/chat.jsonl" <<'PY'
import json, random, sys
pairs = [("colour of the sky?", "blue"), ("capital of France?", "Paris"),
         ("two plus two?", "four"), ("opposite of hot?", "cold")]
random.seed(5)
with open(sys.argv[1], "w") as f:
    for _ in range(96):
        q, a = random.choice(pairs)
        f.write(json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": q},
                                         {"role": "assistant", "content": a}]}) + "\n")
PY
  "$KILN" tokenize --chat --tokenizer "$dir/tokenizer.json" --input "$dir/chat.jsonl" --output "$dir/sft" \
    --val-fraction 0 > "$dir/tokenize.log" 2>&1 || { cat "$dir/tokenize.log"; fail "kiln tokenize --chat"; }
  ls "$dir/sft"/sft_train_*.mask > /dev/null || fail "no mask shard beside the token shard"
}

# kiln sample --chat, greedy, answers `question` with `reply` and stops at <|im_end|>.
ask_chat() {  # question reply -- kiln sample arguments...
  local question=$1 reply=$2; shift 3
  "$KILN" sample "$@" --chat --system "Be brief." --prompt "$question" --temperature 0 \
    --max-new-tokens 16 --json > "$WORK/ask.json" 2> "$WORK/ask.err" \
    || { cat "$WORK/ask.err"; fail "kiln sample --chat"; }
  python3 - "$WORK/ask.json" "$reply" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
want = sys.argv[2] + "<|im_end|>"
prompt = r["prompt"]
assert prompt.endswith("<|im_start|>assistant\n") and "<|im_start|>user\n" in prompt, prompt
print(f"{prompt!r} -> {r['text']!r} ({r['stop_reason']})")
sys.exit(0 if r["text"] == want and r["stop_reason"] == "stop_token" else 1)
PY
}

# Every question of CHAT_PAIRS gets its reply.
expect_chat_answers() {  # kiln sample arguments...
  local qa
  for qa in "${CHAT_PAIRS[@]}"; do
    ask_chat "${qa%%|*}" "${qa#*|}" -- "$@" || fail "the fine-tuned model does not answer '${qa%%|*}' with '${qa#*|}'"
  done
}

# The user's turn was masked out: after <|im_start|>user\n the model has not learned the questions.
expect_user_turns_unlearned() {  # kiln sample arguments...
  "$KILN" sample "$@" --prompt "<|im_start|>system
Be brief.<|im_end|>
<|im_start|>user
" --temperature 0 --max-new-tokens 12 --json > "$WORK/user.json" 2> "$WORK/user.err" \
    || { cat "$WORK/user.err"; fail "sample the user turn"; }
  python3 - "$WORK/user.json" <<'PY' || fail "the masked user turns were learned"
import json, sys
text = json.load(open(sys.argv[1]))["text"]
questions = ["colour of the sky?", "capital of France?", "two plus two?", "opposite of hot?"]
print(repr(text))
sys.exit(1 if any(text.startswith(q[:6]) for q in questions) else 0)
PY
}
