#!/usr/bin/env bash
# kiln bench reports what share of the GEMMs runs in FP8 (core/gemm_tally.h): a tiny GPT-2 on the
# CPU twin (the projections' FP8 emulated) counts its projections' GEMMs as FP8 and the LM head's
# and attention's as not; without precision.fp8 nothing is FP8; --profile times every GEMM and
# gives the share of their time too.
source "$(dirname "$0")/lib.sh"
GPT=(--model gpt2 --device cpu --amp O0 --batch 2 --steps 2 --warmup 1 --set model.gpt.vocab_size=64
     --set model.gpt.seq_len=16 --set model.gpt.max_positions=16 --set model.gpt.hidden_size=32
     --set model.gpt.num_layers=2 --set model.gpt.num_heads=2 --set model.gpt.intermediate_size=64)
bench() {  # name extra...
  local name=$1; shift
  "$KILN" bench "${GPT[@]}" "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" \
    || { cat "$WORK/$name.err"; fail "kiln bench $name"; }
}
bench plain --json
bench fp8 --json --set precision.fp8.enabled=true
bench profile --json --profile --set precision.fp8.enabled=true
bench text --set precision.fp8.enabled=true
python3 - "$WORK" <<'PY' || fail "the FP8 share of the GEMMs"
import json, sys
work = sys.argv[1]
def run(name):
    return json.loads([l for l in open(f"{work}/{name}.out") if l.startswith("{")][-1])
plain, fp8, profile = run("plain"), run("fp8"), run("profile")
assert plain["gemms_counted"] > 0 and plain["fp8_gemm_flop_share"] == 0, plain
assert "fp8_gemm_time_share" not in plain, plain
# Per token and layer, forward: the projections in FP8, 2 (32*96 + 32*32 + 32*64 + 64*32) = 16384
# FLOPs; attention's two products (T = 16, 32 wide) 2 * 2 * 16 * 32 = 2048 not; per token the
# head 2 * 32 * 64 = 4096 not. Backward runs two GEMMs for each: 2 * 16384 / (2 * 18432 + 4096).
assert abs(fp8["fp8_gemm_flop_share"] - 0.8) < 1e-12, fp8
assert fp8["gemms_counted"] == plain["gemms_counted"], (fp8, plain)
assert profile["fp8_gemm_flop_share"] == fp8["fp8_gemm_flop_share"], profile
assert 0 < profile["fp8_gemm_time_share"] < 1 and profile["gemm_ms_per_step"] > 0, profile
print(f"FP8: {100 * fp8['fp8_gemm_flop_share']:.1f} % of the FLOPs of {fp8['gemms_counted']} GEMMs, "
      f"{100 * profile['fp8_gemm_time_share']:.1f} % of their time")
PY
grep -q "^  FP8: [0-9.]*% of the GEMMs' FLOPs$" "$WORK/text.out" || { cat "$WORK/text.out"; fail "no FP8 line in kiln bench's text"; }
pass "kiln bench: the FP8 share of the GEMMs' FLOPs (and with --profile of their time), none without precision.fp8"
