#!/usr/bin/env bash
# kiln bench under mpirun -np 2 reports the communication not hidden behind backward and, with
# --profile, each gradient bucket's ready/start/end times; parallel.first_bucket_mb closes the
# first bucket early (a bucket of its own for the last layer's bias).
source "$(dirname "$0")/lib.sh"
bench() {
  "${MPIRUN[@]}" -np 2 "$KILN" bench --model mlp --batch 16 --amp O0 --device cpu --steps 4 --warmup 1 \
    --set data.kind=FASHION_MNIST --set data.path=/usr/share/datasets/fashion-mnist --json "$@"
}
bench > "$WORK/plain.json" 2> "$WORK/plain.err" || { cat "$WORK/plain.err"; fail "bench -np 2"; }
bench --profile --set parallel.first_bucket_mb=0.001 > "$WORK/profile.json" 2> "$WORK/profile.err" ||
  { cat "$WORK/profile.err"; fail "bench -np 2 --profile"; }
python3 - "$WORK/plain.json" "$WORK/profile.json" <<'PY' || fail "bench's communication figures"
import json, sys
plain = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
prof = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
assert plain["gpus"] == 2, plain
assert plain["exposed_comm_ms"] >= 0, plain["exposed_comm_ms"]
assert "buckets" not in plain, "the timeline is only printed with --profile"
buckets = prof["buckets"]
# 25 MiB buckets hold the whole MLP; the 1 KiB first bucket makes it two.
assert len(buckets) == 2, buckets
assert buckets[0]["bytes"] <= 1024 < buckets[1]["bytes"], buckets
end = 0
for b in buckets:
    assert end <= b["ready_ms"] <= b["start_ms"] <= b["end_ms"], buckets
    end = b["end_ms"]
assert end <= prof["reduced_ms"] and prof["backward_end_ms"] <= prof["reduced_ms"], prof
assert prof["exposed_comm_ms"] >= prof["reduced_ms"] - prof["backward_end_ms"] - 1e-9, prof
print("exposed", plain["exposed_comm_ms"], "ms; buckets", buckets)
PY
pass "bench reports exposed communication and the bucket timeline"
