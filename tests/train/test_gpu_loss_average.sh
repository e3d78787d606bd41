#!/usr/bin/env bash
# train.loss_average on one GPU (label gpu): test_loss_average.sh with train.device CUDA (the
# fused loss's rows over the step's counted targets, whole and in chunks of the head).
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
[ "$GPUS" -ge 1 ] || { echo "SKIP: needs a GPU"; exit 0; }
LOSS_AVERAGE_DEVICE=CUDA exec bash "$(dirname "$0")/test_loss_average.sh" "$@"
