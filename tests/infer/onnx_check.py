#!/usr/bin/env python3
"""Checks what `kiln export` writes, with the onnx package's checker and ONNX Runtime (CPU).

  onnx_check.py logits MODEL.onnx INPUTS.npy LOGITS.npy [--tolerance T]
      full check_model; ONNX Runtime's outputs on Kiln's eval inputs (kiln eval --dump-inputs)
      equal Kiln's logits (--dump-logits): |ort - kiln| <= T * max|kiln| elementwise, T = 1e-4
      (relative to the logits' scale, so that near-zero logits do not demand exact zeros).
  onnx_check.py fashion MODEL.onnx DATA_DIR KILN_ACCURACY KILN_INPUTS.npy
      the Fashion-MNIST test set read from its idx files and normalised from the model's
      metadata_props alone (as a deployment would), equal to Kiln's inputs; ONNX Runtime's
      accuracy within 0.05 % of Kiln's.
Missing packages are a failure (scripts/install-deps.sh installs them), never a skip.
KILN_ORT_PROVIDER picks ONNX Runtime's execution provider (default CPUExecutionProvider).
"""
import gzip
import os
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
except ImportError as e:
    sys.exit(f"FAIL: {e}: the ONNX tests need onnx and onnxruntime (scripts/install-deps.sh)")


def load_checked(path):
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    return model


def run(path, x):
    # KILN_ORT_PROVIDER=CUDAExecutionProvider: tools/onnx-gpu-check.sh. ONNX Runtime falls back to
    # the CPU silently when a provider cannot start, so the provider in use is checked.
    provider = os.environ.get("KILN_ORT_PROVIDER", "CPUExecutionProvider")
    session = ort.InferenceSession(path, providers=[provider])
    if session.get_providers()[0] != provider:
        sys.exit(f"FAIL: ONNX Runtime runs on {session.get_providers()}, not {provider}")
    want = session.get_inputs()[0]
    if want.type == "tensor(float16)":
        x = x.astype(np.float16)
    return session.run(None, {want.name: x})[0].astype(np.float32)


def check_logits(path, inputs, logits, tolerance):
    load_checked(path)
    x, ref = np.load(inputs), np.load(logits)
    y = run(path, x)
    assert y.shape == ref.shape, (y.shape, ref.shape)
    scale = float(np.abs(ref).max())
    assert scale > 0, "Kiln's logits are all zero: nothing is compared"
    err = float(np.abs(y - ref).max())
    print(f"{os.path.basename(path)}: {x.shape} {x.dtype} -> {y.shape}, max |ort - kiln| {err:.3g}"
          f" = {err / scale:.3g} of max |kiln| {scale:.4g} (tolerance {tolerance:g})")
    if not err <= tolerance * scale:
        sys.exit(f"FAIL: {path}: ONNX Runtime differs from Kiln by {err / scale:.3g} of the scale")


def read_idx(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * dims).reshape(shape)


def find(data_dir, stem):
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(data_dir, name)):
            return os.path.join(data_dir, name)
    sys.exit(f"FAIL: no {stem}[.gz] in {data_dir}")


def check_fashion(path, data_dir, kiln_accuracy, kiln_inputs):
    model = load_checked(path)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["input.layout"] == "NCHW", meta
    mean = np.array([float(v) for v in meta["input.normalize_mean"].split(",")], np.float32)
    std = np.array([float(v) for v in meta["input.normalize_std"].split(",")], np.float32)
    images = read_idx(find(data_dir, "t10k-images-idx3-ubyte"))
    labels = read_idx(find(data_dir, "t10k-labels-idx1-ubyte"))
    x = images.astype(np.float32)[:, None, :, :] / np.float32(255)
    x = (x - mean[None, :, None, None]) / std[None, :, None, None]
    ref = np.load(kiln_inputs)
    assert ref.shape == x.shape, (ref.shape, x.shape)
    input_err = float(np.abs(ref - x).max())
    assert input_err <= 1e-5, f"the metadata's preprocessing differs from Kiln's by {input_err}"
    predictions = np.concatenate([run(path, x[i:i + 1000]).argmax(1) for i in range(0, len(x), 1000)])
    accuracy = float((predictions == labels).mean())
    print(f"Fashion-MNIST test set ({len(labels)} images): ONNX Runtime {100 * accuracy:.2f} %, "
          f"kiln eval {100 * kiln_accuracy:.2f} % (inputs from the metadata within {input_err:.2g})")
    if abs(accuracy - kiln_accuracy) > 0.0005:
        sys.exit("FAIL: accuracies differ by more than 0.05 %")
    if accuracy < 0.5:
        sys.exit("FAIL: the trained model is no better than 50 %: nothing was learned")


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[:1] == ["logits"] and len(a) in (4, 6):
        check_logits(a[1], a[2], a[3], float(a[5]) if len(a) == 6 else 1e-4)
    elif a[:1] == ["fashion"] and len(a) == 5:
        check_fashion(a[1], a[2], float(a[3]), a[4])
    else:
        sys.exit(__doc__)
