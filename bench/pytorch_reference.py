#!/usr/bin/env python3
"""PyTorch's side of the comparison: the same models, batches, optimizer (fused AdamW) and
precision (fp16 autocast + GradScaler) on random data; median step time of N timed steps after
warm-up, measured with CUDA events. Prints one JSON object per configuration.

  python3 bench/pytorch_reference.py --model resnet50 --batch 128 [--channels-last] [--compile]
  python3 bench/pytorch_reference.py --model bert_base --batch 32 --gpus 2      # DDP
  python3 bench/pytorch_reference.py --model bert_base --batch 32 --gpus 2 --comm-hook powersgd \
      --powersgd-rank 4 --powersgd-start 2     # DDP with a gradient compression hook

--comm-hook: none (plain all-reduce), fp16 / bf16 (fp16_compress_hook / bf16_compress_hook:
gradients travel in half), powersgd (PowerSGDState + powerSGD_hook: rank --powersgd-rank with
error feedback and warm start, plain all-reduce before step --powersgd-start, which PyTorch
requires to be at least 2). Kiln's parallel.compression NONE / HALF / POWERSGD match them.
"""
import argparse
import json
import os
import statistics
import sys


def build(name, batch, device):
    import torch
    if name == "resnet50":
        import torchvision
        model = torchvision.models.resnet50()
        x = torch.randn(batch, 3, 224, 224, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        loss_fn = lambda out: torch.nn.functional.cross_entropy(out, y)
        return model, (x,), loss_fn
    if name == "vit_b16":
        import torchvision
        model = torchvision.models.vit_b_16()
        x = torch.randn(batch, 3, 224, 224, device=device)
        y = torch.randint(0, 1000, (batch,), device=device)
        loss_fn = lambda out: torch.nn.functional.cross_entropy(out, y)
        return model, (x,), loss_fn
    if name == "bert_base":
        from transformers import BertConfig, BertForMaskedLM
        model = BertForMaskedLM(BertConfig())
        ids = torch.randint(0, 30522, (batch, 128), device=device)
        labels = torch.randint(0, 30522, (batch, 128), device=device)
        loss_fn = lambda out: torch.nn.functional.cross_entropy(out.logits.reshape(-1, 30522), labels.reshape(-1))
        return model, (ids,), loss_fn
    raise SystemExit(f"unknown model {name}")


def register_comm_hook(model, args):
    """DDP's gradient compression for --comm-hook (the counterparts of parallel.compression)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if args.comm_hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.comm_hook == "bf16":
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif args.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=args.powersgd_rank,
            start_powerSGD_iter=args.powersgd_start, use_error_feedback=True, warm_start=True)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def run(rank, args, result_queue=None):
    import torch
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    if args.gpus > 1:
        import torch.distributed as dist
        dist.init_process_group("nccl", rank=rank, world_size=args.gpus)
    torch.manual_seed(0)
    model, inputs, loss_fn = build(args.model, args.batch, device)
    model = model.to(device)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(i.to(memory_format=torch.channels_last) if i.dim() == 4 else i for i in inputs)
    if args.gpus > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        register_comm_hook(model, args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    scaler = torch.amp.GradScaler("cuda")
    step_model = torch.compile(model, mode=args.compile_mode) if args.compile else model

    def step():
        if args.compile and args.compile_mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration for cudagraph trees
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(step_model(*inputs))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    median = statistics.median(times)
    if args.gpus > 1:
        t = torch.tensor([median], device=device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        median = t.item()
    if rank == 0:
        mode = "fp16 AMP" + (", channels_last" if args.channels_last else "") + ((", torch.compile" + ("" if args.compile_mode == "default" else f" {args.compile_mode}")) if args.compile else "") + (", DDP" if args.gpus > 1 else "") + (f", {args.comm_hook} hook" if args.comm_hook != "none" else "")
        print(json.dumps({
            "framework": "pytorch", "model": args.model, "batch_per_gpu": args.batch, "gpus": args.gpus,
            "mode": mode, "median_step_ms": median,
            "samples_per_s": args.batch * args.gpus / (median / 1e3),
            "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30,
        }), flush=True)
    if args.gpus > 1:
        torch.distributed.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-mode", choices=["default", "reduce-overhead", "max-autotune"],
                   default="default", help="torch.compile's mode (reduce-overhead: CUDA graphs)")
    p.add_argument("--comm-hook", choices=["none", "fp16", "bf16", "powersgd"], default="none",
                   help="DDP gradient compression (with --gpus 2 or more)")
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--powersgd-start", type=int, default=2)
    args = p.parse_args()
    if args.gpus > 1:
        import torch.multiprocessing as mp
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        mp.spawn(run, args=(args,), nprocs=args.gpus, join=True)
    else:
        run(0, args)


if __name__ == "__main__":
    main()
