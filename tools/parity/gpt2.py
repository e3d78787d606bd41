#!/usr/bin/env python3
"""Kiln's GPT-2 against transformers' GPT2LMHeadModel from the same weights (run on the GPU machine).

transformers' GPT2LMHeadModel (GPT-2 124M's shape by default: 12 layers, 768 wide, 12 heads,
vocab 50257, 1024 positions; dropout 0; random init from a seed) writes its weights as
safetensors under its own names and layout (Conv1D weights (in, out); lm_head.weight dropped, it
is tied to transformer.wte.weight; attn.bias / attn.masked_bias buffers dropped), and
`kiln replay --model gpt2` loads them. On a batch of random ids (B, T+1): inputs ids[:, :T],
targets ids[:, 1:] (next tokens), loss = mean cross entropy over the B*T positions.
  1. fp32: logits of one forward (eval mode) within 1e-4 max relative difference (max |a-b| over
     max |b|); the first training step's logits likewise; parameter gradients within 1e-3
     (relative norm difference, per parameter, worst one printed); the losses of 20 AdamW steps
     within 1e-4 relative.
  2. bf16: Kiln O2 bf16 (what `kiln bench --amp O2 --half bf16` runs) against torch autocast
     bf16 (fp32 weights): the 20 losses within 1e-2; logits within 1e-2 and gradients within
     5e-2, limits raised to --floor-factor (3) times torch bf16's own distance from torch fp32
     where that is larger (bf16 keeps 8 bits: two correct bf16 runs differ by about as much as
     either differs from fp32); the line says when. Both distances are printed.
  3. Checkpoint round trip (--no-roundtrip skips it): `kiln train` one step at lr 1e-30 (it
     must be > 0; no weight moves) from model.init_from = the transformers weights; its
     checkpoint's model.safetensors must hold the same tensors (names, transformers' shapes,
     values) and load into GPT2LMHeadModel
     (load_state_dict strict=False: missing only lm_head.weight and attention buffers, nothing
     unexpected), giving the original model's logits. This needs the transposition in
     checkpoint save/load and model.init_from.
  --f64: also Kiln's CPU float64 (`kiln replay --dtype f64`) against torch float64 (first step's
     logits and gradients, limit 1e-8): an exact check, slow at 124M (minutes on the CPU): use a
     small shape (--layers 2 --width 128 --heads 4).
  --long: once more at T = 1024 (batch 1), fp32 and bf16 logits and losses.
Prints PASS/FAIL lines. --device cpu runs torch on the CPU and `kiln replay --device cpu`.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import fail, grad_difference, loss_difference, rel, report, torch_run  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

VOCAB = 50257


def tie(model):
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    return model


def build(args):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=1024, n_embd=args.width, n_layer=args.layers,
                     n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     layer_norm_epsilon=1e-5, activation_function="gelu_new",
                     tie_word_embeddings=True)
    try:  # the plain attention (matmul, mask, softmax) rather than SDPA's kernels
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg)


def file_state(model):
    """transformers' names and layout; the tied head and the attention buffers dropped."""
    out = {}
    for k, v in model.state_dict().items():
        if k == "lm_head.weight" or k.endswith(".attn.bias") or k.endswith(".attn.masked_bias"):
            continue
        out[k] = v.detach().float().cpu().contiguous().clone()
    return out


def batch_of(b, t, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (b, t + 1), generator=g)
    return ids[:, :t].clone(), ids[:, 1:].clone()  # own storage: safetensors refuses shared


def shape_sets(args):
    return [f"model.gpt.num_layers={args.layers}", f"model.gpt.hidden_size={args.width}",
            f"model.gpt.num_heads={args.heads}"]


def kiln_replay(args, d, steps, level, device, dtype="f32", half="bf16", tag="k"):
    return common.kiln_replay(args.kiln, "gpt2", f"{d}/w.safetensors", f"{d}/b.safetensors",
                              f"{d}/{tag}.safetensors", steps, args.lr, level, device,
                              shape_sets(args), args.timeout, dtype=dtype, half=half)


def compare(args, label_base, d, model, x, y, device, with_grads=True):
    w = load_file(f"{d}/w.safetensors")

    def fresh():
        missing, unexpected = model.load_state_dict(w, strict=False)
        assert not unexpected, unexpected
        return tie(model)

    t32 = torch_run(fresh(), x, y, args.steps, args.lr, device, torch.float32, False)
    print(f"     {label_base}: torch fp32 losses {t32[3][0]:.5f}->{t32[3][-1]:.5f}", flush=True)
    if args.f64 and with_grads:
        t64 = torch_run(fresh(), x, y, 1, args.lr, device, torch.float64, False)
        k64, err = kiln_replay(args, d, 1, "O0", "cpu", "f64", tag="k64")
        label = f"{label_base} cpu f64 vs torch f64"
        if err:
            fail(label, err)
        else:
            report(label, "logits", rel(k64[1].reshape(t64[1].shape), t64[1]), args.f64_limit)
            worst, name, missing = grad_difference(k64[2], t64[2])
            report(label, f"grads (worst {name}, {missing} missing)", worst, args.f64_limit)
    for level in args.levels.split(","):
        amp = level != "O0"
        label = f"{label_base} {level}" + (" bf16" if amp else " fp32")
        t = torch_run(fresh(), x, y, args.steps, args.lr, device, torch.float32, True) if amp else t32
        k, err = kiln_replay(args, d, args.steps, level, args.device)
        if err:
            fail(label, err)
            continue
        lt = 1e-2 if amp else 1e-4
        gt = 5e-2 if amp else 1e-3
        # AMP: torch bf16's own distance from torch fp32 is the noise floor, printed.
        floor = lambda i: rel(t[i], t32[i]) if amp else None
        kfloor = lambda i: rel(k[i].reshape(t32[i].shape), t32[i]) if amp else None
        report(label, "logits (eval mode)", rel(k[0].reshape(t[0].shape), t[0]), lt, floor(0),
               kfloor(0), args.floor_factor)
        report(label, "logits (training step)", rel(k[1].reshape(t[1].shape), t[1]), lt,
               floor(1), kfloor(1), args.floor_factor)
        if with_grads:
            worst, name, missing = grad_difference(k[2], t[2])
            report(label, f"grads (worst {name}, {missing} missing)", worst, gt,
                   grad_difference(t[2], t32[2])[0] if amp else None,
                   grad_difference(k[2], t32[2])[0] if amp else None, args.floor_factor)
            if missing:
                fail(label, f"{missing} gradients missing or of another size in Kiln's output")
        report(label, f"losses over {args.steps} steps", loss_difference(k[3], t[3]), lt,
               loss_difference(t[3], t32[3]) if amp else None)
        print(f"     {label} losses kiln {k[3][0]:.5f}->{k[3][-1]:.5f} torch "
              f"{t[3][0]:.5f}->{t[3][-1]:.5f}", flush=True)
    return t32


def roundtrip(args, d, model, x, device):
    """kiln train, 1 step at lr 1e-30 from the transformers weights: the checkpoint gives them back."""
    from transformers import GPT2LMHeadModel
    label = "gpt2 checkpoint round trip"
    cfg = f"{d}/roundtrip.pbtxt"
    with open(cfg, "w") as f:
        f.write('name: "gpt2_parity_roundtrip"\n')
    sets = ["model.name=gpt2", f"model.init_from={d}/w.safetensors", "model.dropout=0",
            "data.kind=SYNTHETIC", "data.eval_split=none", "train.steps=1", "train.batch_per_gpu=2",
            f"train.device={'cuda' if device.type == 'cuda' else 'cpu'}", "precision.opt_level=O0",
            "optimizer.kind=adamw", "optimizer.lr=1e-30", "optimizer.weight_decay=0",
            f"checkpoint.dir={d}/ckpt", f"logging.dir={d}/logs",
            "logging.jsonl=false", "model.gpt.seq_len=128"] + shape_sets(args)
    cmd = [args.kiln, "train", "--config", cfg, "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return fail(label, f"kiln train timed out after {args.timeout} s")
    if r.returncode != 0:
        return fail(label, f"kiln train exited {r.returncode} ({' '.join(cmd)}): "
                           f"{(r.stderr or r.stdout).strip()[-600:]}")
    steps = sorted(p for p in os.listdir(f"{d}/ckpt") if p.startswith("step-")) \
        if os.path.isdir(f"{d}/ckpt") else []
    if not steps:
        return fail(label, f"no checkpoint in {d}/ckpt")
    ck = load_file(f"{d}/ckpt/{steps[-1]}/model.safetensors")
    w = load_file(f"{d}/w.safetensors")
    missing = sorted(set(w) - set(ck))
    extra = sorted(set(ck) - set(w))
    shapes = [n for n in w if n in ck and tuple(ck[n].shape) != tuple(w[n].shape)]
    worst = max((rel(ck[n].double(), w[n].double()) for n in w if n in ck and n not in shapes),
                default=0.0)
    ok = not missing and not shapes
    common.failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {label} names and shapes: {len(ck)} tensors, "
          f"{len(missing)} missing {missing[:3]}, {len(extra)} extra {extra[:3]}, "
          f"{len(shapes)} of another shape {[(n, tuple(ck[n].shape)) for n in shapes[:3]]}",
          flush=True)
    report(label, "values (lr 1e-30: unchanged)", worst, 1e-6)
    m = GPT2LMHeadModel(model.config)
    result = m.load_state_dict({k: v for k, v in ck.items() if k not in shapes}, strict=False)
    tie(m)
    allowed = lambda k: k == "lm_head.weight" or k.endswith(".attn.bias") or \
        k.endswith(".attn.masked_bias")
    bad_missing = [k for k in result.missing_keys if not allowed(k)]
    ok = not bad_missing and not result.unexpected_keys
    common.failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {label} GPT2LMHeadModel.load_state_dict(strict=False): "
          f"missing {bad_missing[:4] or 'only the tied head / attention buffers'}, unexpected "
          f"{result.unexpected_keys[:4]}", flush=True)
    m.to(device).eval()
    model.to(device=device, dtype=torch.float32).eval()
    model.load_state_dict(w, strict=False)
    tie(model)
    with torch.no_grad():
        a = m(x.to(device)).logits.double().cpu()
        b = model(x.to(device)).logits.double().cpu()
    report(label, "logits of GPT2LMHeadModel from the checkpoint", rel(a, b), 1e-6)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build-gpu")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda", help="torch's device and kiln replay's")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128, help="T of the batch")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--levels", default="O0,O2", help="Kiln opt levels (O0 fp32; O1/O2 bf16)")
    p.add_argument("--floor-factor", type=float, default=3.0,
                   help="bf16 logits and gradients: the limit is at least this times torch "
                        "bf16's own distance from torch fp32 (0 keeps 1e-2 / 5e-2)")
    p.add_argument("--f64", action="store_true", help="Kiln CPU float64 against torch float64")
    p.add_argument("--f64-limit", type=float, default=1e-8)
    p.add_argument("--long", action="store_true", help="once more at T = 1024, batch 1")
    p.add_argument("--no-roundtrip", action="store_true", help="skip the checkpoint round trip")
    p.add_argument("--timeout", type=int, default=240, help="seconds per kiln command")
    args = p.parse_args()
    args.kiln = os.path.join(args.build, "bin", "kiln")
    device = torch.device(args.device)
    model = build(args)
    n = sum(t.numel() for t in model.parameters())
    print(f"     gpt2 {args.layers} x {args.width} ({args.heads} heads), {n:,} parameters; "
          f"batch {args.batch} x {args.seq}, lr {args.lr:g}, {args.steps} steps", flush=True)
    with tempfile.TemporaryDirectory() as d:
        save_file(file_state(model), f"{d}/w.safetensors")
        x, y = batch_of(args.batch, args.seq, 1234)
        save_file({"input": x, "target": y}, f"{d}/b.safetensors")
        compare(args, f"gpt2 T={args.seq}", d, model, x, y, device)
        if not args.no_roundtrip:
            roundtrip(args, d, model, x, device)
        if args.long:
            xl, yl = batch_of(1, 1024, 4321)
            save_file({"input": xl, "target": yl}, f"{d}/b.safetensors")
            compare(args, "gpt2 T=1024", d, model, xl, yl, device, with_grads=False)
    print(f"{'FAIL' if common.failures else 'PASS'} gpt2 parity: {common.failures} failure(s)")
    sys.exit(1 if common.failures else 0)


if __name__ == "__main__":
    main()
