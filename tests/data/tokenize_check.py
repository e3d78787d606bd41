#!/usr/bin/env python3
"""kiln tokenize against Hugging Face's `tokenizers`, id for id, through the shards it writes.

Trains small tokenizers with `tokenizers` itself (no download) on tests/infer/tokenizer_corpus.txt
(hf_tokenizer_check.py's GPT-2-, Llama-3- and Qwen2-like ones; the Llama 3 one with a token of
id 70000, so its shards are uint32), writes a small corpus of every input kind (.txt, .jsonl,
.txt.gz, .jsonl.gz in two gzip members; CRLF lines, blank lines, an empty document, text that
spells special tokens, many scripts), runs `kiln tokenize` over it and reads the shards back
(llm.c's header: magic, version, count; uint16 or uint32 tokens). They must hold, in input order,
each document's ids from Tokenizer.encode(text, add_special_tokens=False) with
encode_special_tokens = True, after the separator (<|endoftext|>; <|begin_of_text|> for Llama 3;
or --separator), the documents split between val and train shards as docs/data.md says, and be
the same bytes with 1 and 3 threads.

Usage: tokenize_check.py path/to/kiln   (ctest test_data_tokenize_parity)
Fails (never skips) when `tokenizers` is missing: scripts/install-deps.sh installs it.
"""
import glob
import gzip
import json
import math
import os
import random
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "infer"))
try:
    from tokenizers import Tokenizer
    import hf_tokenizer_check as trained  # its tokenizer builders; it fails if tokenizers is missing
except ImportError as e:
    sys.exit(f"FAIL: python3 cannot import tokenizers ({e}): run scripts/install-deps.sh")

FAILURES = []


def fail(what):
    FAILURES.append(what)
    print("FAIL: " + what)


def write_corpus(work, lines):
    """The corpus files and the documents they hold, in the order kiln reads them."""
    rng = random.Random(20261203)
    text_lines = [line for line in lines if line]
    edge = ["", "plain", "a <|endoftext|> b", "<|begin_of_text|>x<|im_end|>", " zyxw zyxw",
            "line\r\nbreaks\r\n", "\ttabs\tand  spaces  ", "caf\u00e9 Cafe\u0301 \u65e5\u672c",
            "\U0001F600\U0001F44D\U0001F3FD", "1234567 89", "don't DON'T", "\u00a0\u3000x",
            # Qwen2-like's added token that is not special still matches (NFC first).
            "a Cafe\u0301Bar b <|im_start|>CaféBar"]
    docs = []
    in_dir = os.path.join(work, "in")
    os.makedirs(in_dir)

    def some_text():
        return "\n".join(rng.sample(text_lines, rng.randint(1, 6)))

    # a.txt, b.txt: one document each; c.txt.gz too.
    for name in ["a.txt", "b.txt"]:
        doc = some_text() + "\n"
        with open(os.path.join(in_dir, name), "w", encoding="utf-8", newline="") as f:
            f.write(doc)
        docs.append(doc)
    doc = "\n".join(text_lines[:20])
    with gzip.open(os.path.join(in_dir, "c.txt.gz"), "wb") as f:
        f.write(doc.encode("utf-8"))
    txt_gz_doc = doc
    # d.jsonl: edge cases and corpus lines, blank lines between, CRLF endings, other fields.
    jsonl_docs = edge + [some_text() for _ in range(60)]
    with open(os.path.join(in_dir, "d.jsonl"), "w", encoding="utf-8", newline="") as f:
        for i, d in enumerate(jsonl_docs):
            f.write(json.dumps({"id": i, "text": d, "meta": {"n": [1, 2]}},
                               ensure_ascii=i % 2 == 0))
            f.write("\r\n" if i % 3 == 0 else "\n")
            if i % 7 == 0:
                f.write("\n")
    # e.jsonl.gz: two gzip members.
    gz_docs = [some_text() for _ in range(40)]
    lines_gz = [json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in gz_docs]
    with open(os.path.join(in_dir, "e.jsonl.gz"), "wb") as f:
        f.write(gzip.compress("".join(lines_gz[:15]).encode("utf-8")))
        f.write(gzip.compress("".join(lines_gz[15:]).encode("utf-8")))
    return in_dir, {"txt": docs + [txt_gz_doc], "jsonl": jsonl_docs, "gz": gz_docs}


def read_shards(out, name, split):
    """The ids of NAME_SPLIT_*.bin in order, checking each header; and the shard paths."""
    paths = sorted(glob.glob(os.path.join(out, f"{name}_{split}_*.bin")))
    ids, widths = [], set()
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        magic, version, count = struct.unpack("<3i", data[:12])
        if (magic, version) not in [(20240520, 1), (20240801, 7)]:
            fail(f"{path}: header magic {magic} version {version}")
            continue
        width = 2 if magic == 20240520 else 4
        widths.add(width)
        if len(data) != 1024 + width * count:
            fail(f"{path}: {len(data)} bytes for {count} tokens of {width} bytes")
            continue
        ids += list(struct.unpack(f"<{count}{'H' if width == 2 else 'I'}", data[1024:]))
    return ids, paths, widths


def run(kiln, args):
    p = subprocess.run([kiln, "tokenize"] + args, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        fail(f"kiln tokenize {' '.join(args)}: exit {p.returncode}: {p.stderr}")
    elif "0 skipped" not in p.stderr or "documents" not in p.stderr:
        fail(f"kiln tokenize {' '.join(args)}: no summary on stderr: {p.stderr!r}")
    return p


def check(kiln, work, name, t, path, documents, in_dir, separator=None, val_fraction=0.1):
    t.encode_special_tokens = True  # as kiln: text that spells a special token is text
    sep_token = separator or ("<|begin_of_text|>" if t.token_to_id("<|begin_of_text|>")
                              is not None else "<|endoftext|>")
    sep = t.token_to_id(sep_token)
    order = documents["txt"] + documents["jsonl"] + documents["gz"]
    val, train = [], []
    for k, doc in enumerate(order):
        ids = [sep] + t.encode(doc, add_special_tokens=False).ids
        (val if math.ceil((k + 1) * val_fraction) > math.ceil(k * val_fraction) else train).append(ids)
    want = {"val": [i for d in val for i in d], "train": [i for d in train for i in d]}
    outputs = []
    for threads in [1, 3]:
        out = os.path.join(work, f"{name}-{threads}")
        args = ["--tokenizer", path, "--input", os.path.join(in_dir, "*.txt"),
                "--input", os.path.join(in_dir, "*.txt.gz"),
                "--input", os.path.join(in_dir, "d.jsonl"), "--output", out, "--name", name,
                "--shard-tokens", "500", "--val-fraction", str(val_fraction),
                "--threads", str(threads)]
        if separator:
            args += ["--separator", separator]
        p = run(kiln, args + ["--input", os.path.join(in_dir, "e.jsonl.gz")])
        if p.returncode != 0:
            return
        files = {}
        for split in ["val", "train"]:
            got, paths, widths = read_shards(out, name, split)
            if got != want[split]:
                first = next((i for i, (a, b) in enumerate(zip(got, want[split])) if a != b),
                             min(len(got), len(want[split])))
                fail(f"{name} ({threads} threads): {split} ids differ from tokenizers' at {first}: "
                     f"kiln {got[first:first + 8]}, tokenizers {want[split][first:first + 8]} "
                     f"({len(got)} vs {len(want[split])} ids)")
            expected_width = 2 if t.get_vocab_size() <= 65536 and max(t.get_vocab().values()) < 65536 \
                else 4
            if widths and widths != {expected_width}:
                fail(f"{name}: {split} shards of {widths} bytes a token, expected {expected_width}")
            first_index = 0 if split == "val" else 1
            names = [os.path.basename(p) for p in paths]
            expected = [f"{name}_{split}_{first_index + i:06d}.bin" for i in range(len(paths))]
            if names != expected or len(paths) != math.ceil(len(want[split]) / 500):
                fail(f"{name}: {split} shards {names}, expected {math.ceil(len(want[split]) / 500)}")
            for p_ in paths:
                with open(p_, "rb") as f:
                    files[os.path.basename(p_)] = f.read()
        leftovers = [f for f in os.listdir(out) if ".tmp." in f]
        if leftovers:
            fail(f"{name}: temporary files left: {leftovers}")
        outputs.append(files)
    if len(outputs) == 2 and outputs[0] != outputs[1]:
        fail(f"{name}: the shards of 1 and 3 threads differ")
    if not FAILURES:
        print(f"PASS: {name}: {len(order)} documents, {len(want['val'])} val + "
              f"{len(want['train'])} train ids equal tokenizers' after {sep_token} ({sep})")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    kiln = sys.argv[1]
    with open(os.path.join(HERE, "..", "infer", "tokenizer_corpus.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    with tempfile.TemporaryDirectory() as work:
        in_dir, documents = write_corpus(work, lines)
        for name, build in [("gpt2", trained.gpt2_like), ("llama3", trained.llama3_like),
                            ("qwen2", trained.qwen2_like)]:
            t = build(lines)
            if name == "llama3":
                data = json.loads(t.to_str())
                data["model"]["vocab"]["\u0120zyxw"] = 70000  # past uint16: uint32 shards
                t = Tokenizer.from_str(json.dumps(data))
            path = os.path.join(work, name + ".json")
            t.save(path)
            check(kiln, work, name, Tokenizer.from_file(path), path, documents, in_dir)
        # --separator overrides the choice.
        t = trained.llama3_like(lines)
        path = os.path.join(work, "llama3-eot.json")
        t.save(path)
        check(kiln, work, "llama3eot", Tokenizer.from_file(path), path, documents, in_dir,
              separator="<|eot_id|>", val_fraction=0.25)
    if FAILURES:
        sys.exit(f"FAIL: {len(FAILURES)} failures")
    print("PASS: kiln tokenize's shards hold tokenizers' ids")


if __name__ == "__main__":
    main()
