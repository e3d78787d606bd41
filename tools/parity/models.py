#!/usr/bin/env python3
"""Kiln against PyTorch from the same weights and the same batch (run on the GPU machine).

For ResNet-50 (torchvision), BERT-base (transformers BertForMaskedLM) and ViT-B/16 (torchvision):
the PyTorch model's weights are written as safetensors, Kiln loads them (`kiln replay`), and
  1. logits after one forward agree (fp32: max relative difference < 1e-4; fp16: < 1e-2),
  2. parameter gradients after one backward agree (fp32: relative norm difference < 1e-3),
  3. the losses of 20 AdamW steps on the batch agree (fp32: < 1e-4 relative; AMP: < 1e-2).
AMP compares Kiln's O1 (fp32 weights, fp16 GEMMs and convolutions) with torch autocast + GradScaler.
Prints PASS/FAIL lines.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.backends.cudnn.deterministic = True


def build(name, batch, device):
    g = torch.Generator().manual_seed(1234)
    if name == "resnet50":
        import torchvision
        torch.manual_seed(0)
        m = torchvision.models.resnet50()
        x = torch.randn(batch, 3, 224, 224, generator=g)
        y = torch.randint(0, 1000, (batch,), generator=g)
    elif name == "vit_b16":
        import torchvision
        torch.manual_seed(0)
        m = torchvision.models.vit_b_16()
        x = torch.randn(batch, 3, 224, 224, generator=g)
        y = torch.randint(0, 1000, (batch,), generator=g)
    elif name == "bert_base":
        from transformers import BertConfig, BertForMaskedLM
        torch.manual_seed(0)
        m = BertForMaskedLM(BertConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
        x = torch.randint(0, 30522, (batch, 128), generator=g)
        y = torch.full((batch, 128), -100, dtype=torch.long)
        pick = torch.rand(batch, 128, generator=g) < 0.15
        y[pick] = torch.randint(0, 30522, (int(pick.sum()),), generator=g)
    else:
        raise SystemExit(name)
    return m.to(device), x, y


def logits_of(model, out):
    return out.logits if hasattr(out, "logits") else out


def torch_run(model, x, y, steps, amp, device):
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    losses, first_logits, grads = [], None, None
    x, y = x.to(device), y.to(device)
    for step in range(steps):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            logits = logits_of(model, model(x))
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        losses.append(loss.item())
        scaler.scale(loss).backward()
        if step == 0:
            first_logits = logits.detach().float().cpu()
            inv = 1.0 / scaler.get_scale() if amp else 1.0
            grads = {n: p.grad.detach().float().cpu() * inv for n, p in model.named_parameters() if p.grad is not None}
        scaler.step(opt)
        scaler.update()
    return first_logits, grads, losses


def rel(a, b):
    return (a - b).abs().max().item() / max(b.abs().max().item(), 1e-12)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build-gpu")
    p.add_argument("--models", default="resnet50,bert_base,vit_b16")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    kiln = os.path.join(args.build, "bin", "kiln")
    device = torch.device("cuda")
    failures = 0
    for name in args.models.split(","):
        batch = 4 if name != "bert_base" else 2
        with tempfile.TemporaryDirectory() as d:
            model, x, y = build(name, batch, device)
            state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            save_file(state, f"{d}/w.safetensors")
            save_file({"input": x.contiguous(), "target": y.contiguous()}, f"{d}/b.safetensors")
            for amp in (False, True):
                model.load_state_dict(load_file(f"{d}/w.safetensors"))
                t_logits, t_grads, t_losses = torch_run(model, x, y, args.steps, amp, device)
                # torch autocast keeps fp32 weights and gradients: Kiln's O1 is the same recipe
                # (O2's half gradients overflow at other steps, so the two skip different steps).
                level = "O1" if amp else "O0"
                cmd = [kiln, "replay", "--model", name, "--weights", f"{d}/w.safetensors", "--batch",
                       f"{d}/b.safetensors", "--out", f"{d}/k.safetensors", "--steps", str(args.steps),
                       "--lr", "1e-4", "--amp", level, "--device", "cuda"]
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"FAIL {name} {level}: kiln replay exited {r.returncode}: {r.stderr.strip()[-500:]}")
                    failures += 1
                    continue
                k = load_file(f"{d}/k.safetensors")
                lt = 1e-2 if amp else 1e-4
                d_logits = rel(k["logits"].reshape(t_logits.shape), t_logits)
                worst, worst_name, missing = 0.0, "", 0
                # Gradients that are zero in exact arithmetic (BERT's key bias: softmax ignores a
                # per-query constant) are compared on the scale of the largest gradient.
                scale = max(g.norm().item() for g in t_grads.values())
                for n, g in t_grads.items():
                    kg = k.get("grad." + n)
                    if kg is None:
                        missing += 1
                        continue
                    e = (kg.reshape(g.shape) - g).norm().item() / max(g.norm().item(), 1e-3 * scale)
                    if e > worst:
                        worst, worst_name = e, n
                gt = 5e-2 if amp else 1e-3
                kl = k["loss"].tolist()
                d_loss = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(kl, t_losses))
                for what, value, tol in (("logits", d_logits, lt), ("grads", worst, gt), (f"losses over {args.steps} steps", d_loss, lt)):
                    ok = value < tol
                    failures += not ok
                    extra = f" (worst {worst_name}, {missing} missing)" if what == "grads" else ""
                    print(f"{'PASS' if ok else 'FAIL'} {name} {level} {what}: max relative difference {value:.2e} (limit {tol:g}){extra}")
                print(f"     {name} {level} losses kiln {kl[0]:.5f}->{kl[-1]:.5f} torch {t_losses[0]:.5f}->{t_losses[-1]:.5f}", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
