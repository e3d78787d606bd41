#!/usr/bin/env python3
"""Fails when a CUDA kernel launch (<<<...>>>) is not followed by KILN_CUDA_LAUNCH_CHECK() within
the statement and the next five lines (one check may follow an if/else of launches), so a bad launch configuration is reported where it happened.
A deliberate exception carries KILN_IGNORE_ERROR on the launch line. Usage: check-kernel-launches.py [ROOT]"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
bad = []
for path in sorted(root.rglob("*.cu")):
    if any(part.startswith("build") for part in path.parts):
        continue
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if "<<<" not in line or line.lstrip().startswith("//"):
            continue
        if "KILN_IGNORE_ERROR" in line:
            continue
        # The launch statement ends at the first line ending in ';'; the check must follow it.
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith(";"):
            j += 1
        window = "\n".join(lines[j + 1:j + 6])  # an if/else of launches checks once after it
        if "KILN_CUDA_LAUNCH_CHECK" not in window:
            bad.append(f"{path}:{i + 1}: kernel launch without KILN_CUDA_LAUNCH_CHECK() after it")
print("\n".join(bad) if bad else "every kernel launch is checked")
sys.exit(1 if bad else 0)
