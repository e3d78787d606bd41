#!/usr/bin/env bash
# The exact-resume test with a tiny GPT-2's projections in FP8 (emulated on the CPU, delayed
# scaling): the scaling states (their amax histories included) travel through the checkpoint's
# model.safetensors, so the resumed run casts at the same scales and matches bit for bit.
# EXTRA_SETS from the environment come after these (the GPU machine's train.device CUDA, O2 bf16).
EXTRA_SETS="--set model.name=gpt2 --set model.gpt.vocab_size=64 --set model.gpt.seq_len=16 \
--set model.gpt.max_positions=16 --set model.gpt.hidden_size=32 --set model.gpt.num_layers=2 \
--set model.gpt.num_heads=2 --set model.gpt.intermediate_size=64 --set precision.fp8.enabled=true \
--set precision.fp8.amax_history=4 ${EXTRA_SETS:-}" \
  exec bash "$(dirname "$0")/test_exact_resume.sh" "$@"
