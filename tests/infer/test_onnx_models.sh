#!/usr/bin/env bash
# Every model, at a small size: trained two steps on the CPU (so batch norm's running statistics
# are not the initial ones), evaluated with --dump-inputs/--dump-logits, exported; the file passes
# onnx.checker.check_model(full_check=True) and ONNX Runtime's CPU logits on Kiln's inputs equal
# Kiln's within 1e-4 of their scale. Also: --half (fp16 file, 1e-2), opset 20 (the Gelu op),
# a fixed --batch.
source "$(dirname "$0")/lib.sh"

IMAGES=(--set model.image_size=32 --set model.image_channels=3 --set model.num_classes=5
        --set data.augmentation.normalize_mean=0.4,0.5,0.6 --set data.augmentation.normalize_std=0.2,0.25,0.3)
TINY_TRANSFORMER=(--set model.bert.hidden_size=32 --set model.bert.num_layers=2
                  --set model.bert.num_heads=4 --set model.bert.intermediate_size=64)
declare -A ARGS=(
  [mlp]="--set model.name=mlp --set model.mlp_hidden=64,32"
  [fashion_cnn]="--set model.name=fashion_cnn --set model.dropout=0.2"
  [resnet18]="--set model.name=resnet18 --set model.cifar_stem=true ${IMAGES[*]}"
  # lr 1e-3: at the config's 1e-2 two steps leave eval logits near 7.6e4, past fp16's 65504 (--half).
  [resnet50]="--set model.name=resnet50 --set optimizer.lr=1e-3 ${IMAGES[*]}"
  [bert_base]="--set model.name=bert_base --set model.bert.vocab_size=50 --set model.bert.seq_len=8 ${TINY_TRANSFORMER[*]}"
  [vit_b16]="--set model.name=vit_b16 --set model.dropout=0.1 ${IMAGES[*]} ${TINY_TRANSFORMER[*]}"
)

for model in mlp fashion_cnn resnet18 resnet50 bert_base vit_b16; do
  read -r -a args <<< "${ARGS[$model]}"
  args+=(--set logging.dir="$WORK/$model")
  "$KILN" train --config "$TINY" "${args[@]}" --quiet > "$WORK/$model.train.log" 2>&1 ||
    { cat "$WORK/$model.train.log"; fail "$model: kiln train"; }
  "$KILN" eval --config "$TINY" "${args[@]}" --json --dump-logits "$WORK/$model.logits.npy" \
    --dump-inputs "$WORK/$model.inputs.npy" > "$WORK/$model.eval.log" 2>&1 ||
    { cat "$WORK/$model.eval.log"; fail "$model: kiln eval --dump-logits"; }
  "$KILN" export --config "$TINY" "${args[@]}" --onnx "$WORK/$model.onnx" > "$WORK/$model.export.log" 2>&1 ||
    { cat "$WORK/$model.export.log"; fail "$model: kiln export"; }
  grep -q "step-000002, step 2" "$WORK/$model.export.log" || { cat "$WORK/$model.export.log"; fail "$model: not the latest checkpoint"; }
  python3 "$CHECK" logits "$WORK/$model.onnx" "$WORK/$model.inputs.npy" "$WORK/$model.logits.npy" ||
    fail "$model: ONNX Runtime against Kiln"
  pass "$model: check_model(full_check) and ONNX Runtime = Kiln within 1e-4"

  case $model in
    resnet50|bert_base)
      "$KILN" export --config "$TINY" "${args[@]}" --half --onnx "$WORK/$model.half.onnx" > /dev/null
      python3 "$CHECK" logits "$WORK/$model.half.onnx" "$WORK/$model.inputs.npy" "$WORK/$model.logits.npy" \
        --tolerance 1e-2 || fail "$model --half"
      pass "$model --half: fp16 file within 1e-2 of Kiln's fp32 logits" ;;
    vit_b16)
      "$KILN" export --config "$TINY" "${args[@]}" --opset 20 --onnx "$WORK/$model.20.onnx" > /dev/null
      python3 -c "import onnx, sys; m = onnx.load(sys.argv[1]); assert any(n.op_type == 'Gelu' for n in m.graph.node)" \
        "$WORK/$model.20.onnx" || fail "opset 20 has no Gelu node"
      python3 "$CHECK" logits "$WORK/$model.20.onnx" "$WORK/$model.inputs.npy" "$WORK/$model.logits.npy" ||
        fail "$model --opset 20"
      pass "$model --opset 20 (Gelu)" ;;
    mlp)
      "$KILN" export --config "$TINY" "${args[@]}" --batch 8 --onnx "$WORK/$model.b8.onnx" > /dev/null
      python3 - "$WORK/$model.b8.onnx" <<'PY' || fail "--batch 8"
import onnx, sys
m = onnx.load(sys.argv[1])
assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 8, m.graph.input[0]
meta = {p.key: p.value for p in m.metadata_props}
assert meta["input.normalize_mean"] == "0.5" and meta["input.normalize_std"] == "0.25", meta
assert meta["input.layout"] == "NCHW" and meta["output.num_classes"] == "10", meta
PY
      python3 "$CHECK" logits "$WORK/$model.b8.onnx" "$WORK/$model.inputs.npy" "$WORK/$model.logits.npy" ||
        fail "$model --batch 8"
      pass "$model --batch 8 and metadata_props" ;;
  esac
done
