#!/usr/bin/env bash
# Chat fine-tuning end to end on the CPU, as docs/data.md's "Chat data" describes it: kiln tokenize
# --chat writes shards with loss masks from a JSONL of conversations (ChatML, a byte-level
# tokenizer with <|im_start|> and <|im_end|>), kiln train fits a tiny Llama on them (the loss on the
# assistant replies only, averaged over the step's trained tokens), and kiln sample --chat, greedy,
# answers each question with its reply and stops at <|im_end|>. The user turns are not trained:
# sampling the user's turn does not reproduce the questions.
source "$(dirname "$0")/lib.sh"
W=$WORK
python3 "$SRC/tests/data/write_byte_tokenizer.py" "$W/tokenizer.json" "<|endoftext|>" "<|im_start|>" "<|im_end|>"
python3 - "$W/chat.jsonl" <<'PY'
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
"$KILN" tokenize --chat --tokenizer "$W/tokenizer.json" --input "$W/chat.jsonl" --output "$W/sft" \
  --val-fraction 0 > "$W/tokenize.log" 2>&1 || { cat "$W/tokenize.log"; fail "kiln tokenize --chat"; }
ls "$W/sft"/sft_train_*.mask > /dev/null || fail "no mask shard beside the token shard"
SETS=(--set model.llama.vocab_size=320 --set model.llama.seq_len=64 --set model.llama.max_positions=128
      --set "data.path=$W/sft/sft_train_*.bin" --set data.eval_split=none --set train.steps=300
      --set train.log_every=50 --set checkpoint.every_steps=300 --set schedule.warmup_steps=10
      --set logging.dir="$W/run" --set optimizer.weight_decay=0)
"$KILN" train --config "$SRC/tests/train/tiny_llama.pbtxt" "${SETS[@]}" > "$W/train.log" 2>&1 \
  || { tail -20 "$W/train.log"; fail "kiln train on the chat shards"; }
ask() {  # question expected-reply
  "$KILN" sample --config "$SRC/tests/train/tiny_llama.pbtxt" "${SETS[@]}" --tokenizer "$W/tokenizer.json" \
    --chat --system "Be brief." --prompt "$1" --temperature 0 --max-new-tokens 16 --json > "$W/ask.json" 2> "$W/ask.err" \
    || { cat "$W/ask.err"; fail "kiln sample --chat"; }
  python3 - "$W/ask.json" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
want = sys.argv[2] + "<|im_end|>"
prompt = r["prompt"]
assert prompt.endswith("<|im_start|>assistant\n") and "<|im_start|>user\n" in prompt, prompt
print(f"{prompt!r} -> {r['text']!r} ({r['stop_reason']})")
sys.exit(0 if r["text"] == want and r["stop_reason"] == "stop_token" else 1)
PY
}
for qa in "colour of the sky?|blue" "capital of France?|Paris" "two plus two?|four" "opposite of hot?|cold"; do
  ask "${qa%%|*}" "${qa#*|}" || fail "the fine-tuned model does not answer '${qa%%|*}' with '${qa#*|}'"
done
pass "kiln tokenize --chat, kiln train, kiln sample --chat: every question gets its reply and stops at <|im_end|>"
# The user's turn was masked out: after <|im_start|>user\n the model has not learned the questions.
"$KILN" sample --config "$SRC/tests/train/tiny_llama.pbtxt" "${SETS[@]}" --tokenizer "$W/tokenizer.json" \
  --prompt "<|im_start|>system
Be brief.<|im_end|>
<|im_start|>user
" --temperature 0 --max-new-tokens 12 --json > "$W/user.json" 2> "$W/user.err" || { cat "$W/user.err"; fail "sample the user turn"; }
python3 - "$W/user.json" <<'PY' || fail "the masked user turns were learned"
import json, sys
text = json.load(open(sys.argv[1]))["text"]
questions = ["colour of the sky?", "capital of France?", "two plus two?", "opposite of hot?"]
print(repr(text))
sys.exit(1 if any(text.startswith(q[:6]) for q in questions) else 0)
PY
pass "the user turns, masked, were not learned: the user turn samples none of the questions"
