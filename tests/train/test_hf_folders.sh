#!/usr/bin/env bash
# Hugging Face in and out (issue 35, item 3), on the CPU with real files: a tiny Llama (tied,
# GQA 4:2) trained 3 steps, a tiny Qwen2 (q/k/v biases, untied) and a tiny GPT-2 go out with
# `kiln export --hf` in transformers' names and layouts and come back through model.init_from with
# the same parameters, byte for byte (fp32; bf16 rounded to nearest even and back); a tiny
# --max-shard-size gives shards and an index that load back; config.json fills the shape
# (model.from_hf_config) and is checked against the experiment (a mismatch names the field both
# ways); bad folders and options are refused with exit 2 and nothing half written.
source "$(dirname "$0")/lib.sh"
LLAMA=$SRC/tests/train/tiny_llama.pbtxt
GPT=$SRC/tests/train/tiny_gpt.pbtxt
ST=(python3 "$SRC/tests/train/hf_folder.py")
QUICK=(--set data.kind=SYNTHETIC --set train.steps=3 --set schedule.warmup_steps=1
       --set train.eval_every=0 --set checkpoint.every_steps=3)
QWEN=(--set model.name=qwen2 --set model.llama.qkv_bias=true --set model.llama.tie_embeddings=false)
cd "$WORK"
mkdir hf

ok() {  # log -- command...: must succeed
  local log=$1; shift 2
  "$@" > "$WORK/$log" 2>&1 || { cat "$WORK/$log"; fail "$*"; }
}
# Exports the weights of model.init_from (no checkpoint in logging.dir "none"): what Kiln loaded.
reexport() {  # config from-folder to-folder dtype [--set ...]
  local config=$1 from=$2 to=$3 dtype=$4; shift 4
  ok reexport.log -- "$KILN" export --config "$config" "${QUICK[@]}" --set logging.dir="$WORK/none" \
    --set model.init_from="$from" --hf "$to" --dtype "$dtype" "$@"
  grep -q "exporting model.init_from $from" "$WORK/reexport.log" || { cat "$WORK/reexport.log"; fail "not from init_from"; }
}

# --- Llama, trained: its checkpoint's tensors are the folder's; back in, the same again.
ok llama.log -- "$KILN" train --quiet --config "$LLAMA" "${QUICK[@]}" --set logging.dir="$WORK/llama"
CKPT=$WORK/llama/checkpoints/step-000003
ok export.log -- "$KILN" export --config "$LLAMA" "${QUICK[@]}" --set logging.dir="$WORK/llama" \
  --hf "$WORK/hf/llama" --dtype fp32
grep -q "to $WORK/hf/llama: LlamaForCausalLM, float32, 1 weight file" export.log || { cat export.log; fail "summary"; }
"${ST[@]}" folder hf/llama F32 1 --has model.layers.1.self_attn.k_proj.weight=32,64 \
  model.embed_tokens.weight=1000,64 --lacks lm_head.weight || fail "llama folder"
"${ST[@]}" config hf/llama 'architectures=["LlamaForCausalLM"]' 'model_type="llama"' \
  num_key_value_heads=2 num_attention_heads=4 tie_word_embeddings=true 'torch_dtype="float32"' \
  head_dim=16 rope_theta=500000.0 || fail "llama config.json"
"${ST[@]}" same "$CKPT/model.safetensors" hf/llama || fail "the folder is not the checkpoint"
reexport "$LLAMA" "$WORK/hf/llama" hf/llama-again fp32
"${ST[@]}" same hf/llama hf/llama-again || fail "model.init_from the folder changed the weights"
# Trained from the folder: the losses of a run from the checkpoint's own file.
ok a.log -- "$KILN" train --quiet --config "$LLAMA" "${QUICK[@]}" --set logging.dir="$WORK/from-folder" \
  --set model.init_from="$WORK/hf/llama"
ok b.log -- "$KILN" train --quiet --config "$LLAMA" "${QUICK[@]}" --set logging.dir="$WORK/from-file" \
  --set model.init_from="$CKPT/model.safetensors"
diff <(losses from-folder/metrics.jsonl) <(losses from-file/metrics.jsonl) || fail "losses differ"
pass "a trained Llama (tied, GQA) goes out as LlamaForCausalLM and back with the same parameters"

# --- Qwen2 (biases, untied head), randomly initialised.
ok qwen.log -- "$KILN" export --config "$LLAMA" "${QUICK[@]}" "${QWEN[@]}" --random-init --hf hf/qwen
"${ST[@]}" folder hf/qwen F32 1 --has lm_head.weight=1000,64 \
  model.layers.0.self_attn.q_proj.bias=64 model.layers.0.self_attn.v_proj.bias=32 || fail "qwen2 folder"
"${ST[@]}" config hf/qwen 'architectures=["Qwen2ForCausalLM"]' 'model_type="qwen2"' \
  tie_word_embeddings=false use_sliding_window=false || fail "qwen2 config.json"
reexport "$LLAMA" "$WORK/hf/qwen" hf/qwen-again fp32 "${QWEN[@]}"
"${ST[@]}" same hf/qwen hf/qwen-again || fail "qwen2 round trip"
pass "a Qwen2 (q/k/v biases, untied) goes out as Qwen2ForCausalLM and back"

# --- GPT-2, trained: Conv1D weights (in, out) in the folder as in transformers' files.
ok gpt.log -- "$KILN" train --quiet --config "$GPT" "${QUICK[@]}" --set logging.dir="$WORK/gpt"
ok gpt-export.log -- "$KILN" export --config "$GPT" "${QUICK[@]}" --set logging.dir="$WORK/gpt" \
  --hf hf/gpt --dtype fp32
"${ST[@]}" folder hf/gpt F32 1 --has transformer.h.0.attn.c_attn.weight=64,192 \
  transformer.h.1.mlp.c_proj.weight=256,64 --lacks lm_head.weight || fail "gpt2 folder"
"${ST[@]}" config hf/gpt 'architectures=["GPT2LMHeadModel"]' n_layer=2 n_embd=64 n_inner=null \
  n_positions=64 vocab_size=512 || fail "gpt2 config.json"
"${ST[@]}" same gpt/checkpoints/step-000003/model.safetensors hf/gpt || fail "gpt2 export"
reexport "$GPT" "$WORK/hf/gpt" hf/gpt-again fp32
"${ST[@]}" same hf/gpt hf/gpt-again || fail "gpt2 round trip"
pass "a trained GPT-2 goes out as GPT2LMHeadModel (Conv1D weights (in, out)) and back"

# --- bf16: rounded to nearest even going out; read back into fp32 weights exactly.
ok bf16.log -- "$KILN" export --config "$LLAMA" "${QUICK[@]}" --set logging.dir="$WORK/llama" \
  --hf hf/llama-bf16 --dtype bf16
"${ST[@]}" widened hf/llama-bf16 hf/llama || fail "bf16 values"
"${ST[@]}" config hf/llama-bf16 'torch_dtype="bfloat16"' || fail "bf16 torch_dtype"
reexport "$LLAMA" "$WORK/hf/llama-bf16" hf/llama-bf16-again bf16
"${ST[@]}" same hf/llama-bf16 hf/llama-bf16-again || fail "bf16 round trip"
reexport "$LLAMA" "$WORK/hf/llama-bf16" hf/llama-bf16-fp32 fp32
"${ST[@]}" widened hf/llama-bf16 hf/llama-bf16-fp32 || fail "bf16 read into fp32"
pass "bf16 folders: written rounded to nearest even, read back exactly"

# --- Shards: several files and an index of every tensor, loaded back.
ok shard.log -- "$KILN" export --config "$LLAMA" "${QUICK[@]}" --set logging.dir="$WORK/llama" \
  --hf hf/llama-sharded --dtype fp32 --max-shard-size 100kB
"${ST[@]}" folder hf/llama-sharded F32 5 || fail "shards"
[ -f hf/llama-sharded/model-00005-of-00005.safetensors ] || fail "shard names"
reexport "$LLAMA" "$WORK/hf/llama-sharded" hf/llama-unsharded fp32
"${ST[@]}" same hf/llama hf/llama-unsharded || fail "the shards did not load back"
pass "--max-shard-size 100kB: 5 shards with model.safetensors.index.json, loaded back"

# --- A tied model's file with lm_head.weight (as some exports keep it): left unread.
cp -r hf/llama hf/llama-head
"${ST[@]}" add-tensor hf/llama-head lm_head.weight model.embed_tokens.weight
reexport "$LLAMA" "$WORK/hf/llama-head" hf/llama-head-again fp32
"${ST[@]}" same hf/llama hf/llama-head-again || fail "lm_head.weight of a tied model"
pass "a tied model's lm_head.weight in the file is ignored"

# --- model.from_hf_config: the shape from config.json; given fields kept.
printf 'data { kind: SYNTHETIC }\ntrain { device: CPU steps: 2 batch_per_gpu: 2 eval_every: 0 }\nschedule { warmup_steps: 0 }\ncheckpoint { every_steps: 0 }\nlogging { jsonl: true tensorboard: false progress: OFF }\n' > base.pbtxt
"$KILN" config --config base.pbtxt --set model.from_hf_config="$WORK/hf/qwen" --json > qwen.json ||
  fail "kiln config with model.from_hf_config"
python3 - qwen.json <<'PY' || fail "from_hf_config did not fill the shape"
import json, sys
m = json.load(open(sys.argv[1]))["model"]
l = m["llama"]
assert m["name"] == "qwen2", m["name"]
want = dict(vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
            intermediate_size=128, max_positions=64, seq_len=64, qkv_bias=True, tie_embeddings=False)
assert all(l[k] == v for k, v in want.items()), {k: l[k] for k in want}
PY
ok from.log -- "$KILN" train --quiet --config base.pbtxt --set logging.dir="$WORK/from-hf" \
  --set model.from_hf_config="$WORK/hf/qwen" --set model.init_from="$WORK/hf/qwen"
grep -q '"loss"' from-hf/metrics.jsonl || fail "no losses from the from_hf_config run"
"$KILN" config --config base.pbtxt --set model.from_hf_config="$WORK/hf/gpt/config.json" \
  --set model.gpt.num_layers=1 --json > gpt.json || fail "kiln config (gpt2)"
python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["model"]; assert m["name"]=="gpt2" and m["gpt"]["num_layers"]==1 and m["gpt"]["hidden_size"]==64, m' gpt.json ||
  fail "a given field is not kept"
pass "model.from_hf_config fills model.name and the shape; a field given wins"

# --- config.json against the experiment: each field named both ways.
cp -r hf/llama hf/kv4
"${ST[@]}" set-config hf/kv4 num_key_value_heads 4
expect_exit2 "model.init_from $WORK/hf/kv4: num_kv_heads 4 in config.json (num_key_value_heads), 2 in the experiment (model.llama.num_kv_heads)" -- \
  "$KILN" train --quiet --config "$LLAMA" "${QUICK[@]}" --set logging.dir="$WORK/kv4" --set model.init_from="$WORK/hf/kv4"
[ ! -e "$WORK/kv4/metrics.jsonl" ] || fail "a refused run wrote metrics"
expect_exit2 "num_layers 2 in config.json (num_hidden_layers), 1 in the experiment (model.llama.num_layers)" -- "$KILN" train --quiet --config base.pbtxt \
  --set model.from_hf_config="$WORK/hf/qwen" --set model.llama.num_layers=1 --set model.init_from="$WORK/hf/qwen"
expect_exit2 "model_type llama in config.json, \"gpt2\" in the experiment (model.name)" -- \
  "$KILN" train --quiet --config "$GPT" "${QUICK[@]}" --set logging.dir="$WORK/x" --set model.init_from="$WORK/hf/llama"
cp -r hf/gpt hf/gpt3
"${ST[@]}" set-config hf/gpt3 n_layer 3
expect_exit2 "num_layers 3 in config.json (n_layer), 2 in the experiment (model.gpt.num_layers)" -- \
  "$KILN" export --config "$GPT" "${QUICK[@]}" --set logging.dir="$WORK/none" --set model.init_from="$WORK/hf/gpt3" --hf "$WORK/hf/never"
expect_exit2 "qkv_bias true in config.json (model_type qwen2: q/k/v biases), false in the experiment" -- \
  "$KILN" replay --model llama --set model.from_hf_config="$WORK/hf/llama" --weights "$WORK/hf/qwen" \
  --batch x --out y
pass "a config.json that differs from the experiment is refused, naming the field both ways"

# --- Bad folders and files: exit 2, the file and key named.
mkdir bad-json && echo '{"model_type": "llama",' > bad-json/config.json
expect_exit2 "bad-json/config.json (model.from_hf_config): not valid JSON" -- \
  "$KILN" config --config base.pbtxt --set model.from_hf_config="$WORK/bad-json"
mkdir no-key && echo '{"model_type": "qwen2", "vocab_size": 10}' > no-key/config.json
expect_exit2 "\"hidden_size\" is missing (model.llama.hidden_size comes from it)" -- \
  "$KILN" config --config base.pbtxt --set model.from_hf_config="$WORK/no-key"
mkdir no-weights && cp hf/llama/config.json no-weights/
expect_exit2 "no model.safetensors nor model.safetensors.index.json" -- \
  "$KILN" train --quiet --config "$LLAMA" "${QUICK[@]}" --set model.init_from="$WORK/no-weights"
cp -r hf/llama-sharded hf/missing-shard && rm hf/missing-shard/model-00002-of-00005.safetensors
expect_exit2 "model-00002-of-00005.safetensors, which is not a file in $WORK/hf/missing-shard" -- \
  "$KILN" train --quiet --config "$LLAMA" "${QUICK[@]}" --set logging.dir="$WORK/y" --set model.init_from="$WORK/hf/missing-shard"
pass "bad JSON, a missing key, a folder without weights, a missing shard: refused by name"

# --- Export refusals, before anything is written; no temporary folder left.
touch hf/qwen/extra
expect_exit2 "the folder exists and is not empty" -- "$KILN" export --config "$LLAMA" "${QUICK[@]}" \
  --random-init --hf "$WORK/hf/qwen"
"${ST[@]}" same hf/qwen hf/qwen-again || fail "an existing folder was changed"
expect_exit2 "has no transformers causal-LM class" -- "$KILN" export --config "$TINY" --random-init --hf "$WORK/hf/mlp"
expect_exit2 "--max-shard-size '5parsecs'" -- "$KILN" export --config "$LLAMA" "${QUICK[@]}" --random-init --hf "$WORK/hf/z" --max-shard-size 5parsecs
expect_exit2 "--half is an ONNX option" -- "$KILN" export --config "$LLAMA" "${QUICK[@]}" --random-init --hf "$WORK/hf/z" --half
expect_exit2 "--onnx and --hf exclude each other" -- "$KILN" export --config "$LLAMA" "${QUICK[@]}" --random-init --hf "$WORK/hf/z" --onnx z.onnx
expect_exit2 "--dtype 'fp8'" -- "$KILN" export --config "$LLAMA" "${QUICK[@]}" --random-init --hf "$WORK/hf/z" --dtype fp8
[ ! -e hf/z ] && [ ! -e hf/mlp ] && [ ! -e hf/never ] || fail "a refused export left a folder"
! ls -a hf | grep -q tmp || { ls -a hf; fail "a temporary folder was left"; }
pass "export refusals: an existing folder untouched, nothing half written"
