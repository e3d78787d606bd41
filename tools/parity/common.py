"""What tools/parity/gpt2.py and tools/parity/llama.py share: PASS/FAIL lines with limits raised
to a noise floor, relative differences, the torch side of a run (eval logits, the first step's
logits and gradients, the losses of AdamW steps) and `kiln replay` on the same weights and batch.
"""
import subprocess

import torch
from safetensors.torch import load_file

failures = 0


def report(label, what, value, tol, floor=None, kiln_floor=None, raise_by=0.0):
    """PASS when value < the limit: tol, or raise_by x torch's own distance from its more precise
    run (floor) where that is larger; the line says when."""
    global failures
    limit = max(tol, raise_by * floor) if floor is not None and raise_by else tol
    ok = value < limit
    failures += not ok
    extra = "" if limit == tol else f", raised from {tol:g} by torch's own"
    extra += "" if floor is None else f"; torch's own distance {floor:.2e}"
    if kiln_floor is not None:
        extra += f", Kiln's {kiln_floor:.2e}"
    print(f"{'PASS' if ok else 'FAIL'} {label} {what}: max relative difference {value:.2e} "
          f"(limit {limit:.2g}{extra})", flush=True)


def fail(label, text):
    global failures
    failures += 1
    print(f"FAIL {label}: {text}", flush=True)


def check(ok, label, text):
    global failures
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {label}: {text}", flush=True)


def rel(a, b):
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-12)


def grad_difference(grads, ref):
    """Worst relative norm difference over the parameters of `ref` (names and shapes as files
    hold them), its name, and how many are missing or of another shape."""
    worst, worst_name, missing = 0.0, "", 0
    scale = max(g.norm().item() for g in ref.values())
    for n, g in ref.items():
        kg = grads.get(n)
        if kg is None or tuple(kg.shape) != tuple(g.shape):
            missing += 1
            continue
        e = (kg.double() - g).norm().item() / max(g.norm().item(), 1e-3 * scale)
        if e > worst:
            worst, worst_name = e, n
    return worst, worst_name, missing


def loss_difference(a, b):
    return max(abs(p - q) / max(abs(q), 1e-12) for p, q in zip(a, b))


def torch_run(model, x, y, steps, lr, device, dtype, amp):
    """Eval logits, the first step's logits and gradients (float64, CPU), the losses of `steps`
    AdamW steps; `amp`: autocast in bf16 over fp32 weights."""
    model.to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    x, y = x.to(device), y.to(device)
    ac = lambda: torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)
    model.eval()
    with torch.no_grad(), ac():
        eval_logits = model(x).logits.detach().double().cpu()
    model.train()
    losses, first_logits, grads = [], None, None
    for step in range(steps):
        opt.zero_grad()
        with ac():
            logits = model(x).logits
        vocab = logits.shape[-1]
        loss = torch.nn.functional.cross_entropy(logits.to(dtype).reshape(-1, vocab), y.reshape(-1))
        losses.append(loss.item())
        loss.backward()
        if step == 0:
            first_logits = logits.detach().double().cpu()
            grads = {n: p.grad.detach().double().cpu() for n, p in model.named_parameters()
                     if p.grad is not None}
        opt.step()
    return eval_logits, first_logits, grads, losses


def kiln_replay(kiln, model_name, weights, batch, out, steps, lr, level, device, sets,
                timeout, dtype="f32", half="bf16"):
    """`kiln replay`: (eval logits, first logits, gradients by name, losses), or (None, why)."""
    cmd = [kiln, "replay", "--model", model_name, "--weights", weights, "--batch", batch,
           "--out", out, "--steps", str(steps), "--lr", repr(lr), "--amp", level, "--half", half,
           "--device", device, "--dtype", dtype]
    for s in sets:
        cmd += ["--set", s]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"kiln replay timed out after {timeout} s: {' '.join(cmd)}"
    if r.returncode != 0:
        return None, f"kiln replay exited {r.returncode}: {r.stderr.strip()[-600:]}"
    k = load_file(out)
    grads = {n[len("grad."):]: v.double() for n, v in k.items() if n.startswith("grad.")}
    return (k["eval_logits"].double(), k["logits"].double(), grads, k["loss"].tolist()), None


def run_kiln(cmd, label, timeout):
    """Runs a kiln command; False (and a FAIL line) when it fails."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        fail(label, f"timed out after {timeout} s: {' '.join(cmd)}")
        return False
    if r.returncode != 0:
        fail(label, f"exited {r.returncode} ({' '.join(cmd)}): "
                    f"{(r.stderr or r.stdout).strip()[-600:]}")
        return False
    return True
