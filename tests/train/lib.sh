# Shared by the trainer's script tests. $KILN is the kiln binary; each test works in $WORK.
set -euo pipefail
KILN=${1:?usage: test.sh path/to/kiln}
SRC=${KILN_SOURCE_DIR:?}
WORK=$(mktemp -d /tmp/kiln-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
TINY=$SRC/tests/train/tiny.pbtxt
# A hung rank ends the run; a test that trains for minutes raises MPIRUN_TIMEOUT before sourcing.
MPIRUN=(${MPIEXEC:-mpirun} --allow-run-as-root --oversubscribe --timeout ${MPIRUN_TIMEOUT:-300})

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "PASS: $*"; }

# A command that must be refused: exit 2 with the fixed string `pattern` in its output, which
# stays in $WORK/out.log for further checks.
expect_exit2() {  # pattern -- command...
  local pattern=$1; shift 2
  local code=0
  "$@" > "$WORK/out.log" 2>&1 || code=$?
  [ "$code" = 2 ] || { cat "$WORK/out.log"; fail "expected exit 2, got $code: $*"; }
  grep -qF -- "$pattern" "$WORK/out.log" || { cat "$WORK/out.log"; fail "no '$pattern' in the message"; }
}

# The per-step losses of a metrics.jsonl, one per line, as exact decimal strings.
losses() { python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "loss" in r: print(r["step"], repr(r["loss"]))
' "$1"; }

# Drops the records after step $2 from the metrics.jsonl $1 (as a run killed there left it).
keep_until() {
  python3 - "$1" "$2" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]) if json.loads(l)["step"] <= int(sys.argv[2])]
open(sys.argv[1], "w").writelines(lines)
PY
}

# Runs a command with its output in `log`, checks its exit (non-zero when expected-nonzero is 1)
# and that it took at most max-seconds, and prints the seconds it took. Used as took=$(timed ...):
# what explains a failure goes to stderr, or the command substitution would swallow it.
timed() {  # max-seconds expected-nonzero(1|0) log -- command...
  local max=$1 nonzero=$2 log=$3; shift 4
  local start code=0; start=$(date +%s)
  "$@" > "$log" 2>&1 || code=$?
  local took=$(( $(date +%s) - start ))
  if [ "$nonzero" = 1 ] && [ "$code" = 0 ]; then cat "$log" >&2; fail "expected a non-zero exit: $*"; fi
  [ "$took" -le "$max" ] || { tail -40 "$log" >&2; fail "took ${took}s (limit ${max}s): $*"; }
  echo "$took"
}

# Runs in directories $1 (uninterrupted) and $2 (resumed) ended alike after $3 steps: every
# loss, and bitwise the weights and the optimizer state of the step-$3 checkpoint.
same_run() {  # reference-dir resumed-dir steps
  local step; step=$(printf 'step-%06d' "$3")
  diff <(losses "$1/metrics.jsonl") <(losses "$2/metrics.jsonl") || fail "losses differ after resume"
  [ "$(losses "$1/metrics.jsonl" | wc -l)" = "$3" ] || fail "expected $3 loss records"
  for f in model.safetensors optimizer.safetensors; do
    cmp "$1/checkpoints/$step/$f" "$2/checkpoints/$step/$f" || fail "$f differs at step $3"
  done
}

# Whether two model.safetensors hold the same parameters, byte for byte; buffers (batch-norm
# running statistics) are left out: the forward pass of a skipped step still updates them.
same_parameters() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def params(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header, data = json.loads(f.read(n)), f.read()
    return {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items()
            if k != "__metadata__" and not any(b in k for b in ("running_", "num_batches_tracked"))}
a, b = params(sys.argv[1]), params(sys.argv[2])
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
changed = [k for k in a if a[k] != b[k]]
if changed: sys.exit("parameters differ: " + ", ".join(changed[:5]))
PY
}
