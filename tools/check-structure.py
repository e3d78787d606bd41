#!/usr/bin/env python3
"""Fails (exit 1, one `path: reason` line per offence) when the layout of DESIGN.md slips:

  sizes     train/trainer.cc over 300 lines, any other file of train/ over 400, any source file
            (.cc .h .cu .cuh .py .sh .proto) outside third_party/ and tests/ over 800; long files
            are where a loop of parts turns back into a loop of flags (issue 31).
  includes  a file under comm/ or optim/ including a header of layers/ or train/: those folders
            depend on core/ only, so parameters and the run's plain data live in core/.

Usage: check-structure.py [--only sizes|includes] [ROOT]   (ROOT defaults to the current folder)"""
import argparse
import os
import pathlib
import re
import sys

SOURCE_SUFFIXES = {".cc", ".h", ".cu", ".cuh", ".py", ".sh", ".proto"}
TRAINER_LIMIT = 300
TRAIN_LIMIT = 400
SOURCE_LIMIT = 800
# Folders whose files the size rule for sources leaves alone (vendored code, test tables).
SIZE_EXEMPT = {"third_party", "tests"}
INDEPENDENT = ("comm", "optim")  # depend on core/ only
FORBIDDEN_INCLUDE = re.compile(r'^\s*#\s*include\s*["<]((?:layers|train)/[^">]*)[">]')


def project_files(root):
    """Every file under root, relative and sorted, pruning build trees and hidden folders (.git)."""
    found = []
    for folder, dirs, names in os.walk(root):
        rel_folder = pathlib.Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if not d.startswith(".")
                   and not (rel_folder == pathlib.Path(".") and d.startswith("build"))]
        found += [rel_folder / name for name in names if not name.startswith(".")]
    return sorted(found)


def count_lines(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def size_offences(root, files):
    out = []
    for rel in files:
        top = rel.parts[0]
        if rel.as_posix() == "train/trainer.cc":
            limit, what = TRAINER_LIMIT, "train/trainer.cc"
        elif top == "train":
            limit, what = TRAIN_LIMIT, "a file of train/"
        elif rel.suffix in SOURCE_SUFFIXES and top not in SIZE_EXEMPT:
            limit, what = SOURCE_LIMIT, "a source file"
        else:
            continue
        lines = count_lines(root / rel)
        if lines > limit:
            out.append(f"{rel.as_posix()}: {lines} lines, over the {limit} allowed for {what}")
    return out


def include_offences(root, files):
    out = []
    for rel in files:
        if rel.parts[0] not in INDEPENDENT or rel.suffix not in SOURCE_SUFFIXES:
            continue
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            found = FORBIDDEN_INCLUDE.match(line)
            if found:
                out.append(f"{rel.as_posix()}: line {number} includes {found.group(1)} "
                           f"({rel.parts[0]}/ depends on core/ only)")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default=".")
    parser.add_argument("--only", choices=("sizes", "includes"),
                        help="check one rule family (the other is not yet enforced)")
    args = parser.parse_args()
    root = pathlib.Path(args.root)
    if not root.is_dir():
        parser.error(f"{root} is not a folder")
    files = project_files(root)
    offences = []
    if args.only in (None, "sizes"):
        offences += size_offences(root, files)
    if args.only in (None, "includes"):
        offences += include_offences(root, files)
    if offences:
        print("\n".join(offences))
        return 1
    print("the structure holds (" + (args.only or "sizes and includes") + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
