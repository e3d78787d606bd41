#!/usr/bin/env bash
# The README's quick start: fashion_cnn on the real Fashion-MNIST files reaches at least 92 % test
# accuracy (the dataset's table lists 91.6-93.4 % for two-layer conv nets). With NP=2 the same
# config under mpirun -np 2. The elapsed time is reported (the target is under 3 minutes on 2
# cores); the test asserts the accuracy.
MPIRUN_TIMEOUT=840  # 2 cores shared by 2 ranks; CI machines have taken 400 s
source "$(dirname "$0")/lib.sh"
NP=${NP:-1}
start=$(date +%s)
if [ "$NP" = 1 ]; then
  "$KILN" train --config "$SRC/configs/fashion_mnist.pbtxt" --set logging.dir="$WORK/q" > "$WORK/q.log" 2>&1 || { cat "$WORK/q.log"; fail "quick start"; }
else
  "${MPIRUN[@]}" -np "$NP" "$KILN" train --config "$SRC/configs/fashion_mnist.pbtxt" --set train.device=CPU \
    --set logging.dir="$WORK/q" > "$WORK/q.log" 2>&1 || { cat "$WORK/q.log"; fail "quick start"; }
fi
took=$(( $(date +%s) - start ))
line=$(grep "final test accuracy" "$WORK/q.log") || { cat "$WORK/q.log"; fail "no final accuracy line"; }
acc=$(echo "$line" | sed 's/.*final test accuracy: \([0-9.]*\)%.*/\1/')
echo "$line"
python3 -c "import sys; sys.exit(0 if float('$acc') >= 92.0 else 1)" || fail "accuracy $acc % is below 92 %"
pass "quick start (np=$NP): $acc % test accuracy in ${took} s"
