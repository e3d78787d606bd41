#!/usr/bin/env bash
# The ZeRO test under mpirun -np 3 (uneven shards; resharded onto 1 and 4 ranks).
NP=3 exec bash "$(dirname "$0")/test_zero.sh" "$@"
