# Shared by the ONNX export tests. $KILN is the kiln binary; each test works in $WORK.
set -euo pipefail
KILN=${1:?usage: test.sh path/to/kiln}
SRC=${KILN_SOURCE_DIR:?}
WORK=$(mktemp -d /tmp/kiln-onnx-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
TINY=$SRC/tests/infer/tiny_export.pbtxt
CHECK=$SRC/tests/infer/onnx_check.py

fail() { echo "FAIL: $*" >&2; exit 1; }
pass() { echo "PASS: $*"; }

# Missing packages fail the test (scripts/install-deps.sh installs them); they never skip it.
python3 -c "import numpy, onnx, onnxruntime" ||
  fail "python3 cannot import onnx/onnxruntime: run scripts/install-deps.sh"
