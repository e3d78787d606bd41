#!/usr/bin/env bash
# The exact-resume test under mpirun -np 2 with PowerSGD compressing from step 5: each rank's
# error feedback and Q at step 10 travel through the checkpoint (compression.safetensors).
NP=2 EXPECT_FILE=compression.safetensors \
  EXTRA_SETS="--set parallel.compression=POWERSGD --set parallel.powersgd_start_step=5" \
  exec bash "$(dirname "$0")/test_exact_resume.sh" "$@"
