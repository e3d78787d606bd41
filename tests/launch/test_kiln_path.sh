#!/usr/bin/env bash
# Finding and naming the kiln executable (issue "nothing lost, nothing misread", item 7):
# `kiln --version` prints the CMake project's version and the commit; the Slurm template without
# a kiln to run stops before starting anything, exit 127, saying how to name one (KILN_BIN), not
# with srun's "execve(): kiln: No such file" and exit 2; runs/ is ignored by git.
source "$(dirname "$0")/../train/lib.sh"
version=$(sed -n 's/^project(Kiln VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")
out=$("$KILN" --version) || fail "kiln --version exited non-zero"
echo "$out"
echo "$out" | grep -qE "^kiln $version \((git [0-9a-f]{7,}(-dirty)?|no git commit: not built from a checkout)\)$" \
  || fail "kiln --version: '$out' (expected kiln $version and the commit)"

# No kiln anywhere: a bogus KILN_BIN, a PATH without kiln, a submit directory without a build.
mkdir -p "$WORK/submit"
for bin in "$WORK/no-such-kiln" ""; do
  code=0
  ( cd "$WORK/submit" && env -i PATH=/usr/bin:/bin HOME="$WORK" SLURM_SUBMIT_DIR="$WORK/submit" \
      ${bin:+KILN_BIN=$bin} bash "$SRC/launch/slurm/kiln.sbatch" configs/fashion_mnist.pbtxt ) \
      > "$WORK/sbatch.log" 2>&1 || code=$?
  [ "$code" = 127 ] || { cat "$WORK/sbatch.log"; fail "kiln.sbatch without kiln (KILN_BIN='$bin') exited $code, not 127"; }
  grep -q "kiln.sbatch: no kiln executable" "$WORK/sbatch.log" && grep -q "KILN_BIN=" "$WORK/sbatch.log" \
    || { cat "$WORK/sbatch.log"; fail "kiln.sbatch does not say how to name kiln"; }
  ! grep -q "srun\|execve" "$WORK/sbatch.log" || { cat "$WORK/sbatch.log"; fail "kiln.sbatch started the launcher"; }
done
# The submit directory's build/bin/kiln is found without KILN_BIN (the quick start's build): the
# script goes past the check to the launcher (absent here: srun is not installed or fails).
mkdir -p "$WORK/submit/build/bin" && ln -s "$(realpath "$KILN")" "$WORK/submit/build/bin/kiln"
( cd "$WORK/submit" && env -i PATH=/usr/bin:/bin HOME="$WORK" SLURM_SUBMIT_DIR="$WORK/submit" \
    KILN_LAUNCHER=none bash "$SRC/launch/slurm/kiln.sbatch" configs/fashion_mnist.pbtxt ) \
    > "$WORK/found.log" 2>&1 || true
grep -q "KILN_LAUNCHER=none is not srun or mpirun" "$WORK/found.log" \
  || { cat "$WORK/found.log"; ls -la "$WORK/submit/build/bin"; fail "kiln.sbatch did not find the submit directory's build/bin/kiln"; }

git -C "$SRC" check-ignore -q runs/fashion_mnist/metrics.jsonl || fail "runs/ is not in .gitignore"
pass "kiln --version; kiln.sbatch without kiln exits 127 naming KILN_BIN; runs/ ignored"
