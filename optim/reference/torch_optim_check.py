#!/usr/bin/env python3
"""Checks Kiln's optimizers against PyTorch over a trace written by tests/optim/optim_trace.

    build/tests/optim/optim_trace /tmp/trace cuda 100     # or cpu
    python3 optim/reference/torch_optim_check.py /tmp/trace [--device cpu|cuda]

For every <config>.bin/.json in the directory, the same initial fp32 parameters and the same
gradient sequence are fed to torch.optim.SGD / torch.optim.AdamW (single-tensor path) or to a
LAMB written from the paper (You et al. 2019, decoupled weight decay, Apex FusedLAMB global
clipping, no_weight_decay tensors without decay and with trust ratio 1). After every step the
parameters are compared: relative difference = max|kiln - torch| / max|torch| per tensor; the
maximum over tensors and steps must stay below 1e-6 (fp32). Prints PASS/FAIL per config and
exits non-zero on any failure.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

TOLERANCE = 1e-6


def read_trace(path):
    with open(path, "rb") as f:
        magic, version, ntensors, steps = struct.unpack("<4i", f.read(16))
        if magic != 0x4B4F5054 or version != 1:
            raise SystemExit(f"{path}: not a Kiln optimizer trace (magic {magic:#x}, version {version})")
        sizes = list(struct.unpack(f"<{ntensors}q", f.read(8 * ntensors)))
        no_wd = list(struct.unpack(f"<{ntensors}i", f.read(4 * ntensors)))
        total = sum(sizes)
        data = np.frombuffer(f.read(), dtype="<f4")
    expected = total * (1 + 2 * steps)
    if data.size != expected:
        raise SystemExit(f"{path}: {data.size} floats, expected {expected}")

    def split(flat):
        out, at = [], 0
        for n in sizes:
            out.append(flat[at:at + n].copy())
            at += n
        return out

    init = split(data[:total])
    grads, params = [], []
    for s in range(steps):
        base = total * (1 + 2 * s)
        grads.append(split(data[base:base + total]))
        params.append(split(data[base + total:base + 2 * total]))
    return sizes, no_wd, init, grads, params


class LambReference:
    """LAMB from the paper, with Apex FusedLAMB's clipping, in fp32 torch ops."""

    def __init__(self, params, no_wd, cfg):
        self.params, self.no_wd, self.cfg = params, no_wd, cfg
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.step_count = 0

    @torch.no_grad()
    def step(self):
        c = self.cfg
        self.step_count += 1
        t = self.step_count
        norm = float(torch.sqrt(sum(p.grad.double().pow(2).sum() for p in self.params)))
        divisor = max(1.0, norm / c["max_grad_norm"]) if c["max_grad_norm"] > 0 else 1.0
        bc1 = 1 - c["beta1"] ** t if c["bias_correction"] else 1.0
        bc2 = 1 - c["beta2"] ** t if c["bias_correction"] else 1.0
        for p, m, v, excluded in zip(self.params, self.m, self.v, self.no_wd):
            wd = 0.0 if excluded else c["weight_decay"]
            g = p.grad / divisor
            m.mul_(c["beta1"]).add_((1 - c["beta1"]) * g)
            v.mul_(c["beta2"]).add_((1 - c["beta2"]) * g * g)
            update = (m / bc1) / ((v / bc2).sqrt() + c["eps"]) + wd * p
            w_norm, u_norm = p.double().norm(), update.double().norm()
            ratio = 1.0 if excluded or w_norm == 0 or u_norm == 0 else float(w_norm / u_norm)
            p.sub_(c["lr"] * ratio * update)


def make_optimizer(cfg, params, no_wd):
    decay = [p for p, x in zip(params, no_wd) if not x]
    no_decay = [p for p, x in zip(params, no_wd) if x]
    groups = [{"params": decay, "weight_decay": cfg["weight_decay"]},
              {"params": no_decay, "weight_decay": 0.0}]
    kind = cfg["kind"]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=cfg["lr"], momentum=cfg["momentum"],
                               dampening=cfg["dampening"], nesterov=cfg["nesterov"], foreach=False)
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=cfg["lr"], betas=(cfg["beta1"], cfg["beta2"]),
                                 eps=cfg["eps"], amsgrad=cfg["amsgrad"], foreach=False,
                                 fused=False)
    if kind == "lamb":
        return LambReference(params, no_wd, cfg)
    raise SystemExit(f"unknown optimizer kind {kind}")


def check(directory, name, device):
    with open(os.path.join(directory, name + ".json")) as f:
        cfg = json.load(f)
    sizes, no_wd, init, grads, expected = read_trace(os.path.join(directory, name + ".bin"))
    if cfg["kind"] != "lamb" and cfg["max_grad_norm"] > 0:
        raise SystemExit(f"{name}: clipping is only modelled for lamb")
    params = [torch.tensor(x, dtype=torch.float32, device=device, requires_grad=True) for x in init]
    opt = make_optimizer(cfg, params, no_wd)
    worst, worst_at = 0.0, None
    for s, (g, want) in enumerate(zip(grads, expected)):
        for p, gv in zip(params, g):
            p.grad = torch.tensor(gv, dtype=torch.float32, device=device)
        opt.step()
        for i, (p, kv) in enumerate(zip(params, want)):
            ref = p.detach().cpu().double().numpy()
            diff = np.max(np.abs(kv.astype(np.float64) - ref)) / max(np.max(np.abs(ref)), 1e-30)
            if not np.isfinite(diff) or diff > worst:
                worst, worst_at = diff, (s, i)
    ok = bool(np.isfinite(worst) and worst < TOLERANCE)
    print(f"{name:16s} {cfg['kind']:6s} {len(grads)} steps, {len(sizes)} tensors "
          f"({sum(sizes)} values, trace from {cfg['device']}): max relative difference "
          f"{worst:.3e} at step/tensor {worst_at}  {'PASS' if ok else 'FAIL'}")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--device", default="cpu", help="where torch runs the reference")
    args = parser.parse_args()
    names = sorted(f[:-4] for f in os.listdir(args.directory) if f.endswith(".bin"))
    if not names:
        raise SystemExit(f"no .bin traces in {args.directory}: run optim_trace first")
    results = [check(args.directory, n, args.device) for n in names]
    print("ALL PASS" if all(results) else "SOME FAILED")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
