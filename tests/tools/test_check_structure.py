#!/usr/bin/env python3
"""tools/check-structure.py on temporary trees: each rule fails naming the file, --only narrows the
rules, and a tree within every limit passes. Usage: test_check_structure.py CHECK_STRUCTURE_PY"""
import pathlib
import subprocess
import sys
import tempfile
import unittest

SCRIPT = pathlib.Path(sys.argv.pop(1) if len(sys.argv) > 1 else
                      pathlib.Path(__file__).resolve().parents[2] / "tools/check-structure.py")


def write(root, rel, lines=1, first="// x"):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([first] + ["// x"] * (lines - 1)) + "\n")


def check(root, *options):
    run = subprocess.run([sys.executable, str(SCRIPT), *options, str(root)],
                         capture_output=True, text=True, check=False)
    return run.returncode, run.stdout


def clean_tree(root):
    """Every file at its limit, and the exempt places far over it."""
    write(root, "train/trainer.cc", 300)
    write(root, "train/step.cc", 400)
    write(root, "core/tensor.cc", 800)
    write(root, "tests/big_test.cc", 2000)
    write(root, "third_party/vendored.h", 2000)
    write(root, "build/generated.cc", 2000, first='#include "layers/layer.h"')
    write(root, "docs/long.md", 2000)
    write(root, "comm/data_parallel.h", 3, first='#include "core/parameter.h"')
    write(root, "optim/amp/amp.h", 3, first='// see #include "layers/layer.h" for Context')
    write(root, "layers/layer.h", 3, first='#include "train/trainer.h"')  # not comm/ or optim/


class CheckStructure(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = pathlib.Path(self.tmp.name)
        clean_tree(self.root)

    def tearDown(self):
        self.tmp.cleanup()

    def test_clean_tree_passes(self):
        for options in ((), ("--only", "sizes"), ("--only", "includes")):
            code, out = check(self.root, *options)
            self.assertEqual(code, 0, out)

    def test_long_trainer_and_comm_including_layers_fail(self):
        write(self.root, "train/trainer.cc", 301)
        write(self.root, "comm/bucket.cc", 5, first='#include "layers/layer.h"')
        code, out = check(self.root)
        self.assertEqual(code, 1, out)
        self.assertIn("train/trainer.cc: 301 lines", out)
        self.assertIn("comm/bucket.cc: line 1 includes layers/layer.h", out)
        self.assertEqual(len(out.splitlines()), 2, out)
        code, out = check(self.root, "--only", "includes")
        self.assertEqual(code, 1, out)
        self.assertNotIn("train/", out)
        code, out = check(self.root, "--only", "sizes")
        self.assertEqual(code, 1, out)
        self.assertNotIn("comm/", out)

    def test_every_rule_names_its_file(self):
        write(self.root, "train/step.cc", 401)
        write(self.root, "launch/command_doctor.cc", 801)
        write(self.root, "configs/kiln.proto", 801)
        write(self.root, "optim/amp/amp.h", 3, first='#  include <train/trainer_state.h>')
        code, out = check(self.root)
        self.assertEqual(code, 1, out)
        self.assertEqual(sorted(line.split(":")[0] for line in out.splitlines()),
                         ["configs/kiln.proto", "launch/command_doctor.cc",
                          "optim/amp/amp.h", "train/step.cc"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
