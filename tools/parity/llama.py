#!/usr/bin/env python3
"""Kiln's llama family against transformers' Qwen2ForCausalLM and LlamaForCausalLM from the same
Hugging Face folder (run on the GPU machine; written for torch 2.11 and transformers 5.17, and
reading transformers 4's config keys as well).

For each of --models (qwen2, llama), transformers builds the model at --shape from a seed, dropout
0, eager attention, and save_pretrained writes its folder (config.json, model.safetensors; a tied
head left out, as transformers does):
  small  2 layers, 256 wide, 8 query heads over 2 kv heads (head_dim 32), MLP 512, vocabulary
         1024, 512 positions; qwen2 with q/k/v biases (random, not transformers' zeros), an
         untied head and rope_theta 1e6; llama tied, rope_theta 5e5 and Llama 3.1's rope_scaling
         (llama3: factor 8 over 256 original positions)
  0.5b   Qwen2.5-0.5B's shape for qwen2; 1b: Llama 3.2 1B's for llama (--models picks one)
Kiln takes the shape from the folder (model.from_hf_config) and the weights too (`kiln replay
--weights DIR`, model.init_from=DIR). On a batch of random ids (B, T+1): inputs ids[:, :T],
targets ids[:, 1:], loss = mean cross entropy over the B*T positions.
  1. fp32 (`kiln replay --amp O0`): the eval-mode logits and the first step's within 1e-5 max
     relative difference (max |a-b| over max |b|), parameter gradients within 1e-5 (relative norm
     difference per parameter, the worst printed), the losses of 20 AdamW steps within 1e-4; the
     logits' and gradients' limits raised to --floor-factor (3) times torch fp32's own distance
     from torch float64 where that is larger (the line says so).
  2. bf16: Kiln O2 bf16 against torch autocast bf16 (fp32 weights): the 20 losses within 1e-2;
     logits within 1e-2 and gradients within 5e-2, raised to --floor-factor times torch bf16's
     own distance from torch fp32 where that is larger.
  3. Back to transformers (--no-roundtrip skips it): `kiln train` from the folder
     (model.from_hf_config and model.init_from = DIR, a TOKENS file the script writes) one step at
     lr 1e-30 (no weight moves) and `kiln export --hf` of its checkpoint:
     AutoModelForCausalLM.from_pretrained reads that folder with no missing or unexpected key, as
     the same class with the same shape and rotary frequencies, and gives the original model's
     logits (1e-6). Then 5 steps at lr 1e-3 and their export: the folder holds the checkpoint's
     tensors, and from_pretrained's logits equal Kiln's own of the exported folder (`kiln replay
     --weights OUT`) within 1e-5. And `kiln sample --temperature 0` from the lr-1e-30
     checkpoint equals transformers' generate(do_sample=False) token for token (24 new tokens
     after 8 of the batch's). --no-compare runs this part alone.
  --f64: also Kiln's CPU float64 (`kiln replay --dtype f64`) against torch float64: the first
     step's logits and gradients within 1e-8 (an exact check; small shapes).
Prints PASS/FAIL lines; exits 1 on any FAIL. --device cpu runs torch and Kiln on the CPU.
"""
import argparse
import contextlib
import inspect
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import (check, fail, grad_difference, kiln_replay, loss_difference, rel,  # noqa: E402
                    report, run_kiln, torch_run)

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# The small shape's: original positions below its 512 (transformers warns otherwise), so that
# the three bands (kept, interpolated, divided by the factor) each hold some frequencies.
SMALL_SCALING = dict(LLAMA3_SCALING, factor=8.0, original_max_position_embeddings=256)
# name -> (model, shape keys, rope_theta, rope_scaling)
SHAPES = {
    ("qwen2", "small"): (dict(vocab_size=1024, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                              max_position_embeddings=512, rms_norm_eps=1e-6,
                              tie_word_embeddings=False), 1e6, None),
    ("llama", "small"): (dict(vocab_size=1024, hidden_size=256, intermediate_size=512,
                              num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                              max_position_embeddings=512, rms_norm_eps=1e-5,
                              tie_word_embeddings=True), 5e5, SMALL_SCALING),
    ("qwen2", "0.5b"): (dict(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                             num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                             max_position_embeddings=32768, rms_norm_eps=1e-6,
                             tie_word_embeddings=True), 1e6, None),
    ("llama", "1b"): (dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                           num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                           max_position_embeddings=131072, rms_norm_eps=1e-5,
                           tie_word_embeddings=True), 5e5, LLAMA3_SCALING),
}


def config_class(name):
    import transformers
    return transformers.Qwen2Config if name == "qwen2" else transformers.LlamaConfig


def model_class(name):
    import transformers
    return transformers.Qwen2ForCausalLM if name == "qwen2" else transformers.LlamaForCausalLM


def rope_keys(cls, theta, scaling):
    """transformers 5 takes rope_parameters (theta inside); 4 takes rope_theta and rope_scaling."""
    params = inspect.signature(cls.__init__).parameters
    if "rope_parameters" in params or "rope_scaling" not in params:
        rope = {"rope_type": "default"} if scaling is None else dict(scaling)
        return {"rope_parameters": dict(rope, rope_theta=theta)}
    return {"rope_theta": theta, "rope_scaling": scaling}


def build(name, shape):
    keys, theta, scaling = SHAPES[(name, shape)]
    cls = config_class(name)
    extra = {"attention_bias": False, "mlp_bias": False} if name == "llama" else \
        {"use_sliding_window": False}
    cfg = cls(**keys, hidden_act="silu", attention_dropout=0.0, **extra,
              **rope_keys(cls, theta, scaling))
    try:  # the plain attention (matmul, mask, softmax) rather than SDPA's kernels
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    torch.manual_seed(0)
    model = model_class(name)(cfg)
    # transformers initialises the q/k/v biases at 0: random ones, so that the check sees them.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("_proj.bias"):
                p.normal_(0.0, 0.02)
    return model


@contextlib.contextmanager
def float64_throughout(model):
    """transformers' Llama and Qwen2 compute RMSNorm, the attention softmax and the rotary tables'
    cos and sin in fp32 whatever the model's dtype, which leaves a float64 model ~1e-7 from exact.
    For the float64 reference they run in float64, as Kiln's CPU f64 does (the rotary angles, as
    both form them, stay position x inv_freq in fp32)."""
    patched = []

    def rms_forward(norm):
        def forward(h):
            variance = h.pow(2).mean(-1, keepdim=True)
            return norm.weight * (h * torch.rsqrt(variance + norm.variance_epsilon))
        return forward

    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = rms_forward(module)
            patched.append(module)
    rot = model.model.rotary_emb

    def rotary_forward(x, position_ids):
        angles = rot.inv_freq.float()[None, None, :] * position_ids[..., None].float()
        emb = torch.cat((angles, angles), dim=-1).double()
        scale = rot.attention_scaling
        return (emb.cos() * scale).to(x.dtype), (emb.sin() * scale).to(x.dtype)

    rot.forward = rotary_forward
    patched.append(rot)
    softmax = torch.nn.functional.softmax

    def softmax_in_input_dtype(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=x.dtype if x.dtype == torch.float64 else dtype)

    torch.nn.functional.softmax = softmax_in_input_dtype
    try:
        yield model
    finally:
        torch.nn.functional.softmax = softmax
        for module in patched:
            del module.forward


def batch_of(vocab, b, t, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (b, t + 1), generator=g)
    return ids[:, :t].clone(), ids[:, 1:].clone()  # own storage: safetensors refuses shared


def replay(args, name, hf, d, steps, level, device, dtype="f32", tag="k", weights=None):
    return kiln_replay(args.kiln, name, weights or hf, f"{d}/b.safetensors", f"{d}/{tag}.safetensors",
                       steps, args.lr, level, device, [f"model.from_hf_config={hf}"], args.timeout,
                       dtype=dtype)


def compare(args, name, label_base, d, hf, model, state, x, y, device):
    def fresh():
        model.load_state_dict(state)
        return model

    t32 = torch_run(fresh(), x, y, args.steps, args.lr, device, torch.float32, False)
    with float64_throughout(fresh()) as m:
        t64 = torch_run(m, x, y, 1, args.lr, device, torch.float64, False)
    print(f"     {label_base}: torch fp32 losses {t32[3][0]:.5f}->{t32[3][-1]:.5f}", flush=True)
    if args.f64:
        k64, err = replay(args, name, hf, d, 1, "O0", "cpu", "f64", tag="k64")
        label = f"{label_base} cpu f64 vs torch f64"
        if err:
            fail(label, err)
        else:
            report(label, "logits", rel(k64[1].reshape(t64[1].shape), t64[1]), args.f64_limit)
            worst, worst_name, missing = grad_difference(k64[2], t64[2])
            report(label, f"grads (worst {worst_name}, {missing} missing)", worst, args.f64_limit)
    for level in args.levels.split(","):
        amp = level != "O0"
        label = f"{label_base} {level}" + (" bf16" if amp else " fp32")
        t = torch_run(fresh(), x, y, args.steps, args.lr, device, torch.float32, True) if amp else t32
        ref = t32 if amp else t64  # torch against its more precise self: the noise floor
        k, err = replay(args, name, hf, d, args.steps, level, args.device)
        if err:
            fail(label, err)
            continue
        lt, gt, losses_tol = (1e-2, 5e-2, 1e-2) if amp else (1e-5, 1e-5, 1e-4)
        floor = lambda i: rel(t[i], ref[i])
        kfloor = lambda i: rel(k[i].reshape(ref[i].shape), ref[i])
        report(label, "logits (eval mode)", rel(k[0].reshape(t[0].shape), t[0]), lt, floor(0),
               kfloor(0), args.floor_factor)
        report(label, "logits (training step)", rel(k[1].reshape(t[1].shape), t[1]), lt, floor(1),
               kfloor(1), args.floor_factor)
        worst, worst_name, missing = grad_difference(k[2], t[2])
        report(label, f"grads (worst {worst_name}, {missing} missing)", worst, gt,
               grad_difference(t[2], ref[2])[0], grad_difference(k[2], ref[2])[0],
               args.floor_factor)
        if missing:
            fail(label, f"{missing} gradients missing or of another shape in Kiln's output")
        report(label, f"losses over {args.steps} steps", loss_difference(k[3], t[3]), losses_tol,
               loss_difference(t[3], t32[3]) if amp else None)
        print(f"     {label} losses kiln {k[3][0]:.5f}->{k[3][-1]:.5f} torch "
              f"{t[3][0]:.5f}->{t[3][-1]:.5f}", flush=True)


def write_tokens(d, vocab):
    """A TOKENS dataset (data/token_dataset.h): train.tok and test.tok of random ids."""
    os.makedirs(d, exist_ok=True)
    rng = random.Random(7)
    for split in ("train.tok", "test.tok"):
        tokens = [rng.randrange(vocab) for _ in range(16384)]
        with open(os.path.join(d, split), "wb") as f:
            f.write(b"KILNTOK\0" + struct.pack("<IIQQ", 1, 4, vocab, len(tokens)))
            f.write(struct.pack(f"<{len(tokens)}I", *tokens))


def kiln_command(args, d, hf, tag, steps, lr, device):
    """A function giving `kiln CMD` of the run `tag` (from the folder, on the tokens in d)."""
    cfg = f"{d}/{tag}.pbtxt"
    with open(cfg, "w") as f:
        f.write(f'name: "llama_parity_{tag}"\n')
    sets = [f"model.from_hf_config={hf}", f"model.init_from={hf}", "model.dropout=0",
            f"model.llama.seq_len={args.seq}", "data.kind=TOKENS", f"data.path={d}/tokens",
            "data.eval_split=none", f"train.steps={steps}", "train.batch_per_gpu=2",
            f"train.device={'CUDA' if device.type == 'cuda' else 'CPU'}", "precision.opt_level=O0",
            "optimizer.kind=ADAMW", f"optimizer.lr={lr}", "optimizer.weight_decay=0",
            "schedule.warmup_steps=0", f"checkpoint.dir={d}/{tag}-ckpt", f"logging.dir={d}/{tag}-logs",
            "logging.jsonl=false"]
    return lambda cmd: [args.kiln, cmd, "--config", cfg] + [a for s in sets for a in ("--set", s)]


def train_and_export(args, d, hf, tag, steps, lr, device):
    """kiln train from the folder, then kiln export --hf of its last checkpoint; the folder."""
    args_of = kiln_command(args, d, hf, tag, steps, lr, device)
    label = f"{tag}: kiln train from the folder"
    if not run_kiln(args_of("train") + ["--quiet"], label, args.timeout):
        return None
    out = f"{d}/{tag}-hf"
    if not run_kiln(args_of("export") + ["--hf", out, "--dtype", "fp32"], f"{tag}: kiln export --hf",
                    args.timeout):
        return None
    return out


def from_pretrained(path):
    from transformers import AutoModelForCausalLM
    # Eager attention, as the original model (make_model): the same computation, so that the
    # lr-1e-30 export gives the original logits to rounding, not to SDPA's different summation.
    m, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True,
                                                   attn_implementation="eager")
    return m.float(), info


def greedy_sample(args, name, d, hf, model, x, device, new_tokens=24):
    """`kiln sample --temperature 0` from the lr-1e-30 run's checkpoint (the original weights)
    against transformers' generate(do_sample=False), token for token."""
    label = f"{name} greedy sample"
    prompt = [int(t) for t in x[0, :8]]
    cmd = kiln_command(args, d, hf, f"{name}-still", 1, 1e-30, device)("sample") + [
        "--checkpoint", "latest", "--prompt-tokens", " ".join(map(str, prompt)),
        "--temperature", "0", "--max-new-tokens", str(new_tokens), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if r.returncode != 0:
        fail(label, f"kiln sample exited {r.returncode}: {(r.stderr or r.stdout).strip()[-600:]}")
        return
    ours = json.loads(r.stdout.strip().splitlines()[-1])["tokens"]
    if ours[:len(prompt)] == prompt and len(ours) == len(prompt) + new_tokens:
        ours = ours[len(prompt):]
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device=device), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device))
    theirs = [int(t) for t in out[0, len(prompt):]]
    check(ours == theirs, label, f"kiln {ours} against transformers {theirs}")
    print(f"     {label}: {len(theirs)} tokens, {'equal' if ours == theirs else 'different'}",
          flush=True)


def roundtrip(args, name, d, hf, model, state, x, device):
    """Kiln's export read by transformers: the class, shape, rotary frequencies and logits."""
    write_tokens(f"{d}/tokens", model.config.vocab_size)
    label = f"{name} hf roundtrip"
    out = train_and_export(args, d, hf, f"{name}-still", 1, 1e-30, device)
    if out is None:
        return
    m, info = from_pretrained(out)
    bad = list(info.get("missing_keys", [])) + list(info.get("unexpected_keys", []))
    check(not bad, label, f"from_pretrained of kiln export --hf: missing/unexpected keys {bad[:4]}")
    check(type(m).__name__ == type(model).__name__, label,
          f"class {type(m).__name__} (transformers saved {type(model).__name__})")
    keys = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "tie_word_embeddings"]
    differ = [k for k in keys if getattr(m.config, k) != getattr(model.config, k)]
    check(not differ, label, f"config keys that differ: {differ}")
    ours, theirs = m.model.rotary_emb.inv_freq.cpu(), model.model.rotary_emb.inv_freq.cpu()
    report(label, "rotary inv_freq (rope_theta, rope_scaling)", rel(ours.double(), theirs.double()),
           1e-6)
    model.load_state_dict(state)
    model.to(device=device, dtype=torch.float32).eval()
    m.to(device).eval()
    with torch.no_grad():
        a = m(x.to(device)).logits.double().cpu()
        b = model(x.to(device)).logits.double().cpu()
    report(label, "logits of the exported folder (lr 1e-30: the original weights)", rel(a, b), 1e-6)
    greedy_sample(args, name, d, hf, model, x, device)
    # Trained: the folder holds the checkpoint's tensors and gives Kiln's logits.
    out = train_and_export(args, d, hf, f"{name}-trained", 5, 1e-3, device)
    if out is None:
        return
    ckpt_dir = f"{d}/{name}-trained-ckpt"
    last = sorted(p for p in os.listdir(ckpt_dir) if p.startswith("step-"))[-1]
    ckpt = load_file(f"{ckpt_dir}/{last}/model.safetensors")
    exported = load_file(f"{out}/model.safetensors")
    same = exported.keys() == ckpt.keys() and all(torch.equal(exported[k], ckpt[k]) for k in ckpt)
    check(same, label, f"the exported tensors are the checkpoint's ({len(exported)} tensors)")
    k, err = replay(args, name, out, d, 1, "O0", args.device, tag="trained", weights=out)
    if err:
        return fail(label, err)
    m, _ = from_pretrained(out)
    m.to(device).eval()
    with torch.no_grad():
        a = m(x.to(device)).logits.double().cpu()
    report(label, "logits of the trained export: transformers against Kiln",
           rel(k[0].reshape(a.shape), a), 1e-5)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build-gpu")
    p.add_argument("--models", default="qwen2,llama")
    p.add_argument("--shape", default="small", help="small, or 0.5b (qwen2) / 1b (llama)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda", help="torch's device and Kiln's")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128, help="T of the batch")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--levels", default="O0,O2", help="Kiln opt levels (O0 fp32; O2 bf16)")
    p.add_argument("--floor-factor", type=float, default=3.0,
                   help="a logits or gradient limit is at least this times torch's own distance "
                        "from its more precise run (0 keeps the limits)")
    p.add_argument("--f64", action="store_true", help="Kiln CPU float64 against torch float64")
    p.add_argument("--f64-limit", type=float, default=1e-8)
    p.add_argument("--no-roundtrip", action="store_true", help="skip the export to transformers")
    p.add_argument("--no-compare", action="store_true",
                   help="only the export to transformers and the greedy sample")
    p.add_argument("--timeout", type=int, default=600, help="seconds per kiln command")
    args = p.parse_args()
    args.kiln = os.path.join(args.build, "bin", "kiln")
    device = torch.device(args.device)
    for name in args.models.split(","):
        if (name, args.shape) not in SHAPES:
            fail(name, f"no shape {args.shape} (small; 0.5b for qwen2, 1b for llama)")
            continue
        model = build(name, args.shape)
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        n = sum(t.numel() for t in model.parameters())
        label = f"{name} {args.shape}"
        print(f"     {label}: {n:,} parameters; batch {args.batch} x {args.seq}, lr {args.lr:g}, "
              f"{args.steps} steps", flush=True)
        with tempfile.TemporaryDirectory() as d:
            hf = f"{d}/hf"
            model.save_pretrained(hf)
            if not any(os.path.exists(f"{hf}/{f}") for f in
                       ("model.safetensors", "model.safetensors.index.json")):
                fail(label, f"save_pretrained wrote no safetensors: {os.listdir(hf)}")
                continue
            x, y = batch_of(model.config.vocab_size, args.batch, args.seq, 1234)
            save_file({"input": x, "target": y}, f"{d}/b.safetensors")
            if not args.no_compare:
                compare(args, name, f"{label} T={args.seq}", d, hf, model, state, x, y, device)
            if not args.no_roundtrip:
                roundtrip(args, name, d, hf, model, state, x, device)
    print(f"{'FAIL' if common.failures else 'PASS'} llama parity: {common.failures} failure(s)")
    sys.exit(1 if common.failures else 0)


if __name__ == "__main__":
    main()
