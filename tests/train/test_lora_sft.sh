#!/usr/bin/env bash
# LoRA fine-tuning end to end on the CPU, as docs/finetune.md describes it: a tiny Llama exported
# as a transformers folder is the frozen base (model.init_from), kiln train fits rank-8 adapters on
# all seven projections to chat shards with loss masks, and then
#  - the log says how many parameters train, and the checkpoint's base weights are the base's;
#  - kiln sample --chat answers every question, and the masked user turns were not learned;
#  - kiln export --hf merges the adapters: the merged folder, sampled as a plain model without
#    adapters, answers the same;
#  - kiln export --hf --lora-only writes PEFT's adapter folder (names, shapes, adapter_config.json).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/chat_lib.sh"
W=$WORK
write_chat_shards "$W"
CONFIG=(--config "$SRC/tests/train/tiny_llama.pbtxt")
MODEL=(--set model.llama.vocab_size=320 --set model.llama.seq_len=64 --set model.llama.max_positions=128
       --set "data.path=$W/sft/sft_train_*.bin" --set data.eval_split=none)
"$KILN" export "${CONFIG[@]}" "${MODEL[@]}" --random-init --hf "$W/base" --dtype fp32 > "$W/base.log" 2>&1 \
  || { cat "$W/base.log"; fail "kiln export --hf --random-init (the base)"; }
LORA=(--set model.init_from="$W/base" --set model.lora.rank=8 --set model.lora.alpha=16
      --set model.lora.targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)
SETS=("${MODEL[@]}" "${LORA[@]}" --set train.steps=300 --set train.log_every=50 --set checkpoint.every_steps=300
      --set schedule.warmup_steps=10 --set optimizer.lr=1e-2 --set optimizer.weight_decay=0
      --set logging.dir="$W/run")
"$KILN" train "${CONFIG[@]}" "${SETS[@]}" > "$W/train.log" 2>&1 \
  || { tail -20 "$W/train.log"; fail "kiln train with model.lora"; }
grep -q "parameters, 16384 trained (LoRA adapters)" "$W/train.log" \
  || { grep training "$W/train.log"; fail "the log does not say that the 16,384 adapter parameters train"; }
ckpt=$(ls -d "$W"/run/checkpoints/step-* | tail -1)
python3 - "$W/base/model.safetensors" "$ckpt/model.safetensors" <<'PY' || fail "the frozen base weights changed"
import json, struct, sys
def read(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return {k: data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}, header
base, _ = read(sys.argv[1])
trained, header = read(sys.argv[2])
adapters = [k for k in trained if ".lora_" in k]
assert len(adapters) == 28, adapters
frozen = [k for k in base if header[k]["dtype"] == "F32"]
assert frozen and all(base[k] == trained[k] for k in frozen), [k for k in frozen if base[k] != trained[k]]
print(f"{len(frozen)} base tensors unchanged, {len(adapters)} adapter tensors")
PY
pass "model.lora: 16,384 adapter parameters train, the base weights stay as model.init_from gave them"
SAMPLE=("${CONFIG[@]}" "${SETS[@]}" --tokenizer "$W/tokenizer.json")
expect_chat_answers "${SAMPLE[@]}"
expect_user_turns_unlearned "${SAMPLE[@]}"
pass "the adapters learned the assistant replies (kiln sample --chat answers each) and not the masked user turns"

"$KILN" export "${CONFIG[@]}" "${SETS[@]}" --hf "$W/merged" --dtype fp32 > "$W/merged.log" 2>&1 \
  || { cat "$W/merged.log"; fail "kiln export --hf of the adapted model"; }
python3 - "$W/merged/model.safetensors" <<'PY' || fail "the merged folder holds adapter tensors"
import json, struct, sys
data = open(sys.argv[1], "rb").read()
header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
sys.exit(1 if any(".lora_" in k for k in header) else 0)
PY
PLAIN=("${CONFIG[@]}" "${MODEL[@]}" --set model.init_from="$W/merged" --set logging.dir="$W/plain"
       --tokenizer "$W/tokenizer.json")
expect_chat_answers "${PLAIN[@]}"
pass "kiln export --hf merges the adapters: the merged model without adapters answers as the adapted one"

"$KILN" export "${CONFIG[@]}" "${SETS[@]}" --hf "$W/adapter" --lora-only > "$W/adapter.log" 2>&1 \
  || { cat "$W/adapter.log"; fail "kiln export --hf --lora-only"; }
python3 - "$W/adapter" <<'PY' || fail "the PEFT adapter folder"
import json, os, struct, sys
d = sys.argv[1]
assert sorted(os.listdir(d)) == ["adapter_config.json", "adapter_model.safetensors"], os.listdir(d)
c = json.load(open(os.path.join(d, "adapter_config.json")))
assert c["peft_type"] == "LORA" and c["r"] == 8 and c["lora_alpha"] == 16 and c["task_type"] == "CAUSAL_LM", c
assert sorted(c["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
data = open(os.path.join(d, "adapter_model.safetensors"), "rb").read()
header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
names = {k: v for k, v in header.items() if k != "__metadata__"}
assert len(names) == 28 and all(k.startswith("base_model.model.model.layers.") for k in names), names
q = names["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"]
assert q["shape"] == [8, 64] and q["dtype"] == "F32", q
k = names["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"]
assert k["shape"] == [32, 8], k
d = names["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"]
assert d["shape"] == [8, 128], d
print("adapter_config.json and 28 adapter tensors with PEFT's names and shapes")
PY
expect_exit2 "has no LoRA adapters" -- "$KILN" export "${CONFIG[@]}" "${MODEL[@]}" --random-init --hf "$W/none" --lora-only
pass "kiln export --hf --lora-only writes PEFT's adapter folder, and refuses a model without adapters"
