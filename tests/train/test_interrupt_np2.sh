#!/usr/bin/env bash
# SIGINT to one rank of two (as a Ctrl-C that reached only some ranks): every rank stops at the
# same step (the stop request is all-reduced), one checkpoint is written, every rank exits 130 and
# so does mpirun, with the resume hint; --resume latest continues from it.
source "$(dirname "$0")/lib.sh"
ARGS=(--config "$TINY" --set train.steps=6 --set checkpoint.every_steps=0 --set train.log_every=1)
set -m  # a background job keeps SIGINT (see test_interrupt.sh)

KILN_FAULT_KIND=slow-step KILN_FAULT_STEP=1 "${MPIRUN[@]}" -np 2 -x KILN_FAULT_KIND -x KILN_FAULT_STEP \
  "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/p" > "$WORK/p.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do
  [ -f "$WORK/p/metrics.jsonl" ] && [ "$(wc -l < "$WORK/p/metrics.jsonl")" -ge 1 ] && break
  sleep 0.1
done
sleep 0.3  # inside the 2 s of step 2
rank1=""
for pid in $(pgrep -f "^$KILN train .*$WORK/p"); do
  tr '\0' '\n' < "/proc/$pid/environ" | grep -qx "OMPI_COMM_WORLD_RANK=1" && rank1=$pid
done
[ -n "$rank1" ] || fail "no rank 1 process"
kill -INT "$rank1"
code=0; wait "$job" || code=$?
[ "$code" = 130 ] || { cat "$WORK/p.log"; fail "mpirun exited $code, expected 130"; }
# Rank 0, which prints, did not receive the signal: the all-reduced stop request names it.
grep -q "stop requested (SIGINT): checkpointing at step 2" "$WORK/p.log" \
  || { cat "$WORK/p.log"; fail "rank 0 did not stop at step 2 with rank 1"; }
grep -qF "interrupted (SIGINT) at step 2 after a checkpoint ($WORK/p/checkpoints/step-000002); resume with:" "$WORK/p.log" \
  || { cat "$WORK/p.log"; fail "no resume hint"; }
"${MPIRUN[@]}" -np 2 "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/p" --resume latest --quiet \
  > "$WORK/r.log" 2>&1 || { cat "$WORK/r.log"; fail "--resume latest"; }
[ -d "$WORK/p/checkpoints/step-000006" ] || { cat "$WORK/r.log"; fail "the resumed run did not finish"; }
pass "SIGINT to rank 1: both ranks stopped at step 2 with a checkpoint, mpirun exit 130, resumed"
