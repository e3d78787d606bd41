#!/usr/bin/env python3
"""LoRA against transformers + PEFT (issue 38): the adapters' gradients of a frozen model.

A small Qwen2 and a small Llama (tools/parity/llama.py's shapes) in fp32 with PEFT's LoraConfig
(rank 8, alpha 16, all seven projections, no dropout), A and B both random (B = 0 would make A's
gradient zero and hide it). The base folder from save_pretrained and a Kiln weights file with the
adapters under Kiln's names (base_model.model. and .default dropped) go to `kiln replay` with
model.lora set; the mean cross entropy's gradients of the 28 adapter tensors are compared with
PEFT's, relative norm difference within 1e-5 in fp32 (--device cuda and cpu), and Kiln reports no
gradient for any base weight. Then `kiln export --hf --lora-only` of those adapters is loaded by
PeftModel.from_pretrained onto the base and gives the adapted logits.

usage: python3 tools/parity/lora.py [--build build-gpu] [--devices cuda,cpu]
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import check, grad_difference, kiln_replay, rel, report  # noqa: E402
import common  # noqa: E402
import llama as llama_parity  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def kiln_name(peft_name):
    return peft_name.replace("base_model.model.", "", 1).replace(".base_layer", "").replace(
        ".default", "")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default="build-gpu")
    p.add_argument("--models", default="qwen2,llama")
    p.add_argument("--devices", default="cuda,cpu")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=float, default=16)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--limit", type=float, default=1e-5)
    p.add_argument("--timeout", type=int, default=600)
    args = p.parse_args()
    kiln = os.path.join(args.build, "bin", "kiln")
    from peft import LoraConfig, PeftModel, get_peft_model
    for name in args.models.split(","):
        d = tempfile.mkdtemp(prefix=f"lora-{name}-")
        model = llama_parity.build(name, "small")
        base_dir = f"{d}/base"
        model.save_pretrained(base_dir)
        cfg = LoraConfig(r=args.rank, lora_alpha=args.alpha, lora_dropout=0.0,
                         target_modules=TARGETS, task_type="CAUSAL_LM")
        peft_model = get_peft_model(model, cfg)
        torch.manual_seed(1)
        with torch.no_grad():
            for n, t in peft_model.named_parameters():
                if "lora_" in n:
                    t.uniform_(-0.05, 0.05)
        weights = {kiln_name(n): t.detach().contiguous().clone()
                   for n, t in peft_model.state_dict().items()}
        if model.config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        save_file(weights, f"{d}/w.safetensors")
        x, y = llama_parity.batch_of(model.config.vocab_size, args.batch, args.seq, 3)
        save_file({"input": x, "target": y}, f"{d}/b.safetensors")
        sets = [f"model.from_hf_config={base_dir}", f"model.lora.rank={args.rank}",
                f"model.lora.alpha={args.alpha:g}", "model.lora.targets=" + ",".join(TARGETS)]
        for device in args.devices.split(","):
            dev = torch.device(device)
            peft_model.to(dev).train()
            peft_model.zero_grad()
            logits = peft_model(x.to(dev)).logits
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                     y.to(dev).reshape(-1))
            loss.backward()
            ref = {kiln_name(n): t.grad.detach().double().cpu()
                   for n, t in peft_model.named_parameters() if t.grad is not None}
            label = f"lora {name} {device} fp32 vs peft"
            check(len(ref) == 28 and all(".lora_" in n for n in ref), label,
                  f"PEFT trains {len(ref)} tensors, all adapters")
            k, err = kiln_replay(kiln, "llama" if name == "llama" else "qwen2", f"{d}/w.safetensors",
                                 f"{d}/b.safetensors", f"{d}/k-{device}.safetensors", 1, 1e-30,
                                 "O0", device, sets, args.timeout)
            if err:
                common.fail(label, err)
                continue
            report(label, "loss", abs(k[3][0] - loss.item()) / abs(loss.item()), args.limit)
            worst, worst_name, missing = grad_difference(k[2], ref)
            report(label, f"adapter grads (worst {worst_name}, {missing} missing)", worst,
                   args.limit)
            extra = [n for n in k[2] if n not in ref]
            check(not extra, label, f"Kiln reports no gradient for a base weight ({extra[:3]})")
        # The adapters through Kiln's PEFT export, onto the base by PeftModel.
        exp = f"{d}/exp.pbtxt"
        with open(exp, "w") as f:
            f.write(f'model {{ name: "{name}" init_from: "{d}/w.safetensors" }}\n'
                    'data { kind: SYNTHETIC }\ntrain { device: CPU }\n')
        out = f"{d}/adapter"
        r = subprocess.run([kiln, "export", "--config", exp, "--hf", out, "--lora-only"] +
                           sum([["--set", s] for s in sets], []), capture_output=True, text=True,
                           timeout=args.timeout)
        label = f"lora {name} export --lora-only"
        if r.returncode != 0:
            common.fail(label, r.stderr.strip()[-600:])
            continue
        base = llama_parity.build(name, "small")
        loaded = PeftModel.from_pretrained(base, out).eval()
        peft_model.eval()
        with torch.no_grad():
            a = loaded.to("cpu")(x).logits.double()
            b = peft_model.to("cpu")(x).logits.double()
        report(label, "logits of PeftModel.from_pretrained(kiln's adapters)", rel(a, b), 1e-6)
    print(f"{'FAILED' if common.failures else 'PASSED'}: {common.failures} failure(s)")
    return 1 if common.failures else 0


if __name__ == "__main__":
    sys.exit(main())
