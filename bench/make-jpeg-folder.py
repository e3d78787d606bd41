#!/usr/bin/env python3
"""An ImageNet-like JPEG folder for the data-pipeline benchmarks (issue 34): ROOT/train/<class>/ and
ROOT/val/<class>/, 500x375 (ImageNet's median is about 500x400), quality 90, baseline 4:2:0. Each
image is smooth gradients, a few hard-edged shapes and mild sensor noise, so it compresses like a
photograph (~60-120 KB), not like noise or flat colour. Deterministic in (seed, index).

usage: make-jpeg-folder.py ROOT [--train N] [--val N] [--classes K] [--seed S]"""
import argparse
import os
from multiprocessing import Pool

import numpy as np
from PIL import Image, ImageDraw

W, H = 500, 375


def make(job):
    path, seed = job
    if os.path.exists(path):
        return
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:H, 0:W].astype(np.float32)
    img = np.zeros((H, W, 3), np.float32)
    for c in range(3):  # a smooth field per channel: two gradients and a low-frequency wave
        a, b, f, p = rng.uniform(-0.4, 0.4), rng.uniform(-0.4, 0.4), rng.uniform(0.005, 0.03), rng.uniform(0, 6.3)
        img[..., c] = 128 + a * (x - W / 2) + b * (y - H / 2) + 50 * np.sin(f * x + p) * np.cos(f * y)
    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(rng.integers(6, 14)):  # edges
        x0, y0 = rng.integers(0, W), rng.integers(0, H)
        x1, y1 = x0 + rng.integers(20, 200), y0 + rng.integers(20, 200)
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=colour)
    arr = np.asarray(pil).astype(np.int16) + rng.integers(-24, 25, (H, W, 3), dtype=np.int16)
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(path, quality=90, subsampling=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--train", type=int, default=4096)
    ap.add_argument("--val", type=int, default=512)
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--seed", type=int, default=34)
    a = ap.parse_args()
    jobs = []
    for split, count, offset in (("train", a.train, 0), ("val", a.val, 10_000_000)):
        for k in range(a.classes):
            os.makedirs(os.path.join(a.root, split, f"class_{k:03d}"), exist_ok=True)
        for i in range(count):
            path = os.path.join(a.root, split, f"class_{i % a.classes:03d}", f"img_{i:06d}.jpg")
            jobs.append((path, a.seed * 100_000_000 + offset + i))
    with Pool(os.cpu_count()) as pool:
        pool.map(make, jobs, chunksize=16)
    print(f"{a.root}: {a.train} train and {a.val} val images of {W}x{H} in {a.classes} classes")


if __name__ == "__main__":
    main()
