#!/usr/bin/env bash
# The quick start under mpirun -np 2 reaches the same accuracy.
NP=2 exec bash "$(dirname "$0")/test_quickstart.sh" "$@"
