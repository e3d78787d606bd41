#!/usr/bin/env bash
# PowerSGD still trains: the quick start (configs/fashion_mnist.pbtxt) under mpirun -np 2 over
# MPI's TCP transport (--mca pml ob1 --mca btl tcp,self on the loopback interface: sockets, as
# between two hosts on Ethernet) with parallel.compression POWERSGD, rank 4, compressing from
# step 10, for 3 epochs, reaches at least 91.5 % test accuracy (91.72 % on the development machine;
# the same 3 epochs uncompressed: 91.89 %; 2 epochs were not enough: 91.07 %). Then the two other
# compressions run a few steps over TCP too.
MPIRUN_TIMEOUT=840  # 2 cores shared by 2 ranks; the quick start's np=2 test allows the same
source "$(dirname "$0")/lib.sh"
TCP=(--mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo)
start=$(date +%s)
"${MPIRUN[@]}" "${TCP[@]}" -np 2 "$KILN" train --config "$SRC/configs/fashion_mnist.pbtxt" --set train.device=CPU \
  --set train.epochs=3 --set parallel.compression=POWERSGD --set parallel.powersgd_rank=4 \
  --set parallel.powersgd_start_step=10 --set logging.dir="$WORK/p" > "$WORK/p.log" 2>&1 \
  || { cat "$WORK/p.log"; fail "PowerSGD run"; }
took=$(( $(date +%s) - start ))
line=$(grep "final test accuracy" "$WORK/p.log") || { cat "$WORK/p.log"; fail "no final accuracy line"; }
acc=$(echo "$line" | sed 's/.*final test accuracy: \([0-9.]*\)%.*/\1/')
echo "$line"
python3 -c "import sys; sys.exit(0 if float('$acc') >= 91.5 else 1)" || fail "accuracy $acc % is below 91.5 %"
# Error feedback and Q of both ranks are in the final checkpoint.
ls "$WORK"/p/checkpoints/step-*/compression.safetensors > /dev/null || fail "no compression.safetensors in the checkpoints"
for compression in NONE HALF; do
  "${MPIRUN[@]}" "${TCP[@]}" -np 2 "$KILN" train --config "$SRC/tests/train/tiny.pbtxt" --set train.steps=6 \
    --set parallel.compression=$compression --set logging.dir="$WORK/$compression" > "$WORK/$compression.log" 2>&1 \
    || { cat "$WORK/$compression.log"; fail "$compression over TCP"; }
done
pass "PowerSGD rank 4 over TCP (np=2): $acc % test accuracy after 3 epochs in ${took} s; NONE and HALF run over TCP"
