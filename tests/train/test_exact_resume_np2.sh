#!/usr/bin/env bash
# The exact-resume test under mpirun -np 2 (CPU data parallelism over MPI).
NP=2 exec bash "$(dirname "$0")/test_exact_resume.sh" "$@"
