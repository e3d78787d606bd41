#!/usr/bin/env bash
# Chat fine-tuning end to end on the CPU, as docs/data.md's "Chat data" describes it: kiln tokenize
# --chat writes shards with loss masks from a JSONL of conversations (ChatML, a byte-level
# tokenizer with <|im_start|> and <|im_end|>), kiln train fits a tiny Llama on them (the loss on the
# assistant replies only, averaged over the step's trained tokens), and kiln sample --chat, greedy,
# answers each question with its reply and stops at <|im_end|>. The user turns are not trained:
# sampling the user's turn does not reproduce the questions.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/chat_lib.sh"
W=$WORK
write_chat_shards "$W"
SETS=(--set model.llama.vocab_size=320 --set model.llama.seq_len=64 --set model.llama.max_positions=128
      --set "data.path=$W/sft/sft_train_*.bin" --set data.eval_split=none --set train.steps=300
      --set train.log_every=50 --set checkpoint.every_steps=300 --set schedule.warmup_steps=10
      --set logging.dir="$W/run" --set optimizer.weight_decay=0)
"$KILN" train --config "$SRC/tests/train/tiny_llama.pbtxt" "${SETS[@]}" > "$W/train.log" 2>&1 \
  || { tail -20 "$W/train.log"; fail "kiln train on the chat shards"; }
SAMPLE=(--config "$SRC/tests/train/tiny_llama.pbtxt" "${SETS[@]}" --tokenizer "$W/tokenizer.json")
expect_chat_answers "${SAMPLE[@]}"
pass "kiln tokenize --chat, kiln train, kiln sample --chat: every question gets its reply and stops at <|im_end|>"
expect_user_turns_unlearned "${SAMPLE[@]}"
pass "the user turns, masked, were not learned: the user turn samples none of the questions"
