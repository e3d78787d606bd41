#!/usr/bin/env bash
# logging.progress AUTO: `kiln train` in a terminal (a pseudo-terminal from script(1)) draws a
# progress bar with ETA that moves at least once a second, even while one step takes seconds;
# with output to a file, or under mpirun, it prints log lines instead.
source "$(dirname "$0")/lib.sh"
command -v script > /dev/null || fail "script(1) from util-linux is needed"
ARGS=(--config "$TINY" --set logging.progress=AUTO --set train.steps=3 --set train.log_every=100
      --set checkpoint.every_steps=0)

# Each step sleeps 2 s (the slow-step fault), so only a redraw between steps moves the bar.
KILN_FAULT_KIND=slow-step KILN_FAULT_STEP=0 script -qefc \
  "$KILN train ${ARGS[*]} --set logging.dir=$WORK/tty" "$WORK/tty.log" > /dev/null \
  || { cat "$WORK/tty.log"; fail "kiln train in a terminal"; }
grep -qE '\[[#.]{30}\] .* ETA ' "$WORK/tty.log" || { cat -v "$WORK/tty.log"; fail "no progress bar with ETA in a terminal"; }
redraws=$(tr -cd '\r' < "$WORK/tty.log" | wc -c)
# 3 steps of 2 s: at least one redraw a second, 6 and more (script adds a \r per line too).
[ "$redraws" -ge 6 ] || { cat -v "$WORK/tty.log"; fail "the bar was drawn $redraws times in ~6 s"; }
grep -q "^step 3/3" "$WORK/tty.log" && { cat -v "$WORK/tty.log"; fail "log lines beside the bar"; }

# Output to a file: log lines, no bar.
"$KILN" train "${ARGS[@]}" --set train.log_every=1 --set logging.dir="$WORK/file" > "$WORK/file.log" 2>&1 \
  || { cat "$WORK/file.log"; fail "kiln train to a file"; }
grep -q "^step 3/3 " "$WORK/file.log" || { cat "$WORK/file.log"; fail "no log lines with output to a file"; }
# The bar is "[####....] 3/3 ..." (log lines carry an ETA too, so the bracket tells them apart).
grep -qE '\[[#.]{30}\]' "$WORK/file.log" && { cat -v "$WORK/file.log"; fail "a progress bar in a file"; }

# Under mpirun in a terminal: log lines (mpirun gives ranks a pseudo-terminal; a bar would land
# in the job's log).
script -qefc "${MPIRUN[*]} -np 1 $KILN train ${ARGS[*]} --set train.log_every=1 --set logging.dir=$WORK/mpi" \
  "$WORK/mpi.log" > /dev/null || { cat "$WORK/mpi.log"; fail "kiln train under mpirun"; }
grep -q "step 3/3 " "$WORK/mpi.log" || { cat -v "$WORK/mpi.log"; fail "no log lines under mpirun"; }
grep -qE '\[[#.]{30}\]' "$WORK/mpi.log" && { cat -v "$WORK/mpi.log"; fail "a progress bar under mpirun"; }
pass "progress bar in a terminal ($redraws redraws in 3 slow steps), log lines in a file and under mpirun"
