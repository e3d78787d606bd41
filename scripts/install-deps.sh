#!/usr/bin/env bash
# Installs Kiln's build and test dependencies from Debian packages. Idempotent: packages already
# present are skipped by apt, and the package lists are refreshed only when something is missing.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libopenmpi-dev openmpi-bin
  libprotobuf-dev protobuf-compiler
  libboost-program-options-dev
  libopenblas-dev
  libgtest-dev
  zlib1g-dev
  libturbojpeg0-dev
  libjpeg62-turbo-dev
  dataset-fashion-mnist
  python3 python3-pip
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all Debian packages present"
fi

# TensorBoard's own event-file reader, used by a test to read back what Kiln writes.
if ! python3 -c "import tensorboard" 2>/dev/null; then
  python3 -m pip install -q tensorboard || $SUDO python3 -m pip install -q --break-system-packages tensorboard
fi

# ONNX's checker and ONNX Runtime (CPU), pinned, for the export tests (tests/infer/): those tests
# fail, never skip, when these are missing.
ONNX_PINS=(onnx==1.17.0 onnxruntime==1.20.1)
if ! python3 -c "import onnx, onnxruntime; assert (onnx.__version__, onnxruntime.__version__) == ('1.17.0', '1.20.1')" 2>/dev/null; then
  python3 -m pip install -q "${ONNX_PINS[@]}" || $SUDO python3 -m pip install -q --break-system-packages "${ONNX_PINS[@]}"
fi

# Hugging Face's tokenizers, pinned, for the tokenizer.json test (tests/infer/hf_tokenizer_check.py
# trains tokenizers with it and compares ids): that test fails, never skips, when it is missing.
TOKENIZERS_PIN=tokenizers==0.23.3
if ! python3 -c "import tokenizers; assert tokenizers.__version__ == '0.23.3'" 2>/dev/null; then
  python3 -m pip install -q "$TOKENIZERS_PIN" || $SUDO python3 -m pip install -q --break-system-packages "$TOKENIZERS_PIN"
fi

# nvJPEG's header (CUDA 13), pinned, for data.decode GPU: the build compiles the decoder against it
# and opens libnvjpeg.so.13 at run time (the GPU machine's toolkit has it). Without the header the
# build leaves GPU decoding out and says so.
NVJPEG_PIN=nvidia-nvjpeg==13.3.2.43
if ! python3 -c "import importlib.metadata as m; assert m.version('nvidia-nvjpeg') == '13.3.2.43'" 2>/dev/null; then
  python3 -m pip install -q "$NVJPEG_PIN" || $SUDO python3 -m pip install -q --break-system-packages "$NVJPEG_PIN"
fi
