#!/usr/bin/env bash
# A full disk under logging.dir (a small tmpfs with one page left): the first failed write of
# metrics.jsonl or the TensorBoard file is reported once on stderr naming the file and errno's
# text, the file is cut back to its last complete record, training and its checkpoints go on, and
# kiln train exits 74 (kExitLogWriteFailed) at the end instead of 0 (issue 32).
source "$(dirname "$0")/lib.sh"
full_disk() {  # dir: a 1 MiB tmpfs with about `pages` 4 KiB pages free
  mkdir -p "$1"
  if ! mount -t tmpfs -o size=1m tmpfs "$1" 2>/dev/null; then
    fail "cannot mount a tmpfs (the test needs root)"
  fi
  mounted+=("$1")
  dd if=/dev/zero of="$1/fill" bs=4096 2>/dev/null || true  # until the disk is full
  truncate -s "-$(( $2 * 4096 ))" "$1/fill"
}
mounted=()
trap 'for m in "${mounted[@]}"; do umount "$m" 2>/dev/null; done; rm -rf "$WORK"' EXIT
ARGS=(--config "$TINY" --set train.steps=40 --set checkpoint.every_steps=20 --set train.log_every=1)

# metrics.jsonl: the lock file and experiment.pbtxt take a page each, the records fill the third.
full_disk "$WORK/logs" 3
code=0
timeout 120 "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/logs" --set logging.tensorboard=false \
  --set checkpoint.dir="$WORK/ckpt" > "$WORK/jsonl.log" 2> "$WORK/jsonl.err" || code=$?
[ "$code" = 74 ] || { cat "$WORK/jsonl.log" "$WORK/jsonl.err"; fail "exit $code with a full logging.dir, expected 74"; }
grep -qF "kiln: warning: cannot write $WORK/logs/metrics.jsonl: No space left on device" "$WORK/jsonl.err" \
  || { cat "$WORK/jsonl.err"; fail "no warning naming metrics.jsonl and the reason"; }
[ "$(grep -c "cannot write $WORK/logs/metrics.jsonl" "$WORK/jsonl.err")" = 2 ] \
  || { cat "$WORK/jsonl.err"; fail "expected one warning and one final line"; }
grep -qF "exit code 74" "$WORK/jsonl.err" || fail "the end does not give the exit code"
python3 - "$WORK/logs/metrics.jsonl" <<'PY' || fail "metrics.jsonl is not whole records"
import json, sys
data = open(sys.argv[1]).read()
assert data.endswith("\n"), ("no newline at the end", data[-80:])
steps = [json.loads(l)["step"] for l in data.splitlines()]
assert steps == list(range(1, len(steps) + 1)) and 0 < len(steps) < 40, (steps, data[:300])
print(f"metrics.jsonl kept {len(steps)} whole records")
PY
[ -d "$WORK/ckpt/step-000040" ] || fail "the run did not finish its checkpoints"
grep -q "^step 40/40" "$WORK/jsonl.log" || fail "training stopped with the log"
pass "full logging.dir: $(head -1 "$WORK/jsonl.err" | cut -c1-150)... exit 74, whole records kept"

# The TensorBoard file as well (pages for the lock file, experiment.pbtxt and both logs).
full_disk "$WORK/tb" 4
code=0
timeout 120 "$KILN" train "${ARGS[@]}" --set logging.dir="$WORK/tb" --set logging.tensorboard=true \
  --set checkpoint.dir="$WORK/ckpt2" > "$WORK/tb.log" 2> "$WORK/tb.err" || code=$?
[ "$code" = 74 ] || { cat "$WORK/tb.log" "$WORK/tb.err"; fail "exit $code with TensorBoard on a full disk, expected 74"; }
grep -qF "kiln: warning: cannot write $WORK/tb/events.out.tfevents." "$WORK/tb.err" \
  || { cat "$WORK/tb.err"; fail "no warning naming the event file"; }
python3 - "$WORK/tb" <<'PY' || fail "the event file is not whole records"
import glob, struct, sys
path = glob.glob(sys.argv[1] + "/events.out.tfevents.*")[0]
data = open(path, "rb").read()
at = records = 0
while at < len(data):
    assert at + 12 <= len(data), ("a cut header", at, len(data))
    (n,) = struct.unpack("<Q", data[at:at + 8])
    at += 12 + n + 4
    assert at <= len(data), ("a cut record", at, len(data))
    records += 1
print(f"{path}: {records} whole records")
PY
[ -d "$WORK/ckpt2/step-000040" ] || fail "the run did not finish its checkpoints"
pass "full logging.dir with TensorBoard: exit 74, whole event records kept"
