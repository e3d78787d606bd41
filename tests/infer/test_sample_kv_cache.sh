#!/usr/bin/env bash
# kiln sample with the KV cache (the default) gives what --no-kv-cache gives, token for token:
# greedy up to max_positions, and seeded sampling. Needs causal attention with the attention
# layer's KV cache (layers/attention.h).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/sample_lib.sh"
train_tiny_gpt2
S=("$KILN" sample --config "$GPT" "${RUN[@]}" --json)

same() {  # prompt-ids options...
  local prompt=$1 cached full; shift
  cached=$("${S[@]}" "$@" --prompt-tokens "$prompt" | json_tokens) || fail "with the cache: $*"
  full=$("${S[@]}" "$@" --prompt-tokens "$prompt" --no-kv-cache | json_tokens) || fail "without: $*"
  [ -n "$cached" ] || fail "no tokens: $*"
  [ "$cached" = "$full" ] || fail "prompt '$prompt' $*: with the KV cache '$cached', without '$full'"
  pass "KV cache = no KV cache (prompt '$prompt' $*): $cached"
}
same "5" --temperature 0 --max-new-tokens 63  # to max_positions 64
same "$(seq -s ' ' 1 20)" --temperature 0 --max-new-tokens 30
same "300 2" --temperature 1 --seed 3 --max-new-tokens 40
same "42" --temperature 0.8 --top-k 50 --seed 9 --max-new-tokens 40
