#!/usr/bin/env bash
# The FP8 exact-resume test under mpirun -np 2: delayed scaling with the amax histories of both
# ranks merged after every step (train/fp8_amax_reduction.h), so the state a checkpoint saves is
# every rank's.
NP=2 exec bash "$(dirname "$0")/test_exact_resume_fp8.sh" "$@"
