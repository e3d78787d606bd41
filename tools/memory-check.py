#!/usr/bin/env python3
"""kiln plan's prediction against the measured peak, on the GPU machine (gpu-session.sh memory).

For each configuration: `kiln plan --json` (zero_stage 0, one GPU) predicts the total per GPU;
`kiln bench --json` measures the allocator's peak reserved memory of real steps at the same batch,
precision and recompute setting, and their throughput (recompute's cost); the plan's largest batch
under 24 GiB is printed beside them. Then the 24 GiB cap (train.max_memory_mb 24576): GPT-2 124M x16
must fit, GPT-2 XL x4 (16 bytes per parameter alone are 23 GiB) must fail naming what to change.
Prints one markdown table and PASS/FAIL lines.

    tools/memory-check.py BUILD_DIR OUT_DIR
"""
import json
import subprocess
import sys

BUILD, OUT = sys.argv[1], sys.argv[2]
KILN = f"{BUILD}/bin/kiln"

# (label, config, model, batch, half, extra --set)
CASES = [
    ("GPT-2 124M", "configs/gpt2_124m.pbtxt", "gpt2", 16, "bf16", []),
    ("GPT-2 XL", "configs/gpt2_124m.pbtxt", "gpt2_xl", 4, "bf16", ["model.name=gpt2_xl"]),
    ("BERT-base", "configs/bert_base.pbtxt", "bert_base", 32, "fp16", []),
]


def run(cmd, timeout=240):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def sets(pairs):
    out = []
    for s in pairs:
        out += ["--set", s]
    return out


# MEMORY_CASES="GPT-2 124M,BERT-base" picks cases by label (all by default).
import os
wanted = [w for w in os.environ.get("MEMORY_CASES", "").split(",") if w]
rows, failures = [], 0
for label, config, model, batch, half, extra in CASES:
    if wanted and label not in wanted:
        continue
    common = extra + [f"train.batch_per_gpu={batch}", f"train.global_batch={batch}"]
    rc, out, err = run([KILN, "plan", "--config", config, "--world-size", "1", "--json",
                        "--memory-mb", "24576"] + sets(common + ["train.device=CUDA"]))
    if rc != 0:
        print(f"FAIL plan {label}: exit {rc}: {err.strip()[-400:]}")
        failures += 1
        continue
    plan = json.loads(out.strip().splitlines()[-1])
    for recompute in ("NONE", "BLOCKS"):
        row = [p for p in plan["plans"] if p["zero_stage"] == 0 and p["recompute"] == recompute][0]
        predicted, largest = row["total_mb"], row.get("largest_batch", 0)
        rc, out, err = run([KILN, "bench", "--model", model, "--batch", str(batch), "--amp", "O2",
                            "--half", half, "--steps", "4", "--warmup", "2", "--json"] +
                           sets([f"train.recompute={recompute}"]))
        if rc != 0:
            print(f"FAIL bench {label} {recompute}: exit {rc}: {err.strip()[-400:]}")
            failures += 1
            continue
        r = json.loads(out.strip().splitlines()[-1])
        measured = r["peak_reserved_bytes"] / 2**20
        error = (predicted - measured) / measured
        ok = abs(error) <= 0.10
        failures += not ok
        per_s = r["samples_per_s"] * (1024 if model.startswith("gpt2") else 1)
        unit = "tokens/s" if model.startswith("gpt2") else "samples/s"
        rows.append(f"| {label} x{batch} | {recompute} | {predicted:,.0f} | {measured:,.0f} | "
                    f"{100 * error:+.1f} % | {'yes' if ok else 'NO'} | {per_s:,.0f} {unit} | "
                    f"{largest} |")
        print(f"{'PASS' if ok else 'FAIL'} plan {label} x{batch} {recompute}: predicted "
              f"{predicted:.0f} MiB, measured {measured:.0f} MiB ({100 * error:+.1f} %)")

print("\n| configuration | recompute | kiln plan MiB | measured peak MiB | error | within 10 % | "
      "throughput | largest batch under 24,576 MiB (kiln plan) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
print("\n".join(rows))

# The 24 GiB cap.
cap = ["train.max_memory_mb=24576"]
rc, out, err = run([KILN, "bench", "--model", "gpt2", "--batch", "16", "--amp", "O2", "--half",
                    "bf16", "--steps", "3", "--warmup", "1", "--json"] + sets(cap))
ok = rc == 0
failures += not ok
print(f"{'PASS' if ok else 'FAIL'} cap 24576 MiB: GPT-2 124M x16 trains (exit {rc})")
rc, out, err = run([KILN, "bench", "--model", "gpt2_xl", "--batch", "4", "--amp", "O2", "--half",
                    "bf16", "--steps", "3", "--warmup", "1", "--json"] +
                   sets(cap + ["train.recompute=BLOCKS"]))
named = all(w in err for w in ("out of memory", "limit 24.0 GiB", "zero_stage", "recompute"))
ok = rc != 0 and named
failures += not ok
print(f"{'PASS' if ok else 'FAIL'} cap 24576 MiB: GPT-2 XL x4 on one GPU fails naming what to "
      f"change (exit {rc})")
print("    " + (err.strip().splitlines() or [""])[-1][:600])
sys.exit(1 if failures else 0)
