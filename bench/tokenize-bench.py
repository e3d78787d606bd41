#!/usr/bin/env python3
"""kiln tokenize against Hugging Face tokenizers' batch encoding, on the same corpus and cores.

Builds a corpus of text found on this machine (no download): Python's standard library sources
and the texts under /usr/share/doc and /usr/share/common-licenses (gzip ones decompressed), one
document per file, as corpus.jsonl, up to --mb megabytes. Trains two tokenizers on it with
`tokenizers` itself: a GPT-2-like one (ByteLevel, vocabulary 50257, <|endoftext|>: uint16 shards)
and a Llama-3-like one (Llama 3's Split pattern then ByteLevel, ignore_merges, <|begin_of_text|>,
vocabulary padded to 128256 with reserved special tokens as Llama 3's: uint32 shards). Then for
each tokenizer:

  kiln      `kiln tokenize --input corpus.jsonl --threads N --val-fraction 0`: wall time of the
            whole command (reading and parsing the JSON lines, encoding, writing the shards)
  tokenizers  Tokenizer.encode_batch(texts, add_special_tokens=False) with
            encode_special_tokens = True (tokenizers' Rust thread pool, RAYON_NUM_THREADS = N),
            the texts already in memory; encode_batch_fast (no offsets) too

tokens/s counts the tokens of the documents (kiln's separators left out of its count). The ids of
the shards must equal tokenizers' ids with the separator before each document, or the script
fails. Prints a markdown table.

    python3 bench/tokenize-bench.py BUILD_DIR [--mb 60] [--threads N] [--work DIR] [--repeat 3]
"""
import argparse
import glob
import gzip
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus_files():
    files = sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))
    files += sorted(p for p in glob.glob("/usr/share/doc/**/*", recursive=True) if os.path.isfile(p))
    files += sorted(glob.glob("/usr/share/common-licenses/*"))
    return files


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
        if path.endswith(".gz"):
            data = gzip.decompress(data)
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def build_corpus(path, megabytes):
    limit = megabytes * 1_000_000
    size, docs = 0, 0
    with open(path, "w", encoding="utf-8") as out:
        for p in corpus_files():
            text = read_text(p)
            if not text or "\x00" in text:
                continue
            out.write(json.dumps({"text": text, "source": p}, ensure_ascii=False) + "\n")
            size += len(text.encode("utf-8"))
            docs += 1
            if size >= limit:
                break
    return docs, size


def train(tokenizer, texts, vocab_size, special):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=special)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def gpt2_like(texts):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    return train(t, texts, 50257, ["<|endoftext|>"])


def llama3_like(texts):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    train(t, texts, 128000, [])
    data = json.loads(t.to_str())
    data["model"]["ignore_merges"] = True  # as Llama 3's
    t = Tokenizer.from_str(json.dumps(data))
    specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    n = t.get_vocab_size()
    specials += [f"<|reserved_special_token_{i}|>" for i in range(128256 - n - 2)]
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return t


def read_shards(pattern):
    ids = []
    for path in sorted(glob.glob(pattern)):
        header = np.fromfile(path, dtype="<i4", count=256)
        dtype = "<u2" if header[0] == 20240520 else "<u4"
        ids.append(np.fromfile(path, dtype=dtype, offset=1024).astype(np.int64))
    return np.concatenate(ids)


def run_kiln(kiln, tokenizer_path, corpus, out, threads):
    subprocess.run(["rm", "-rf", out], check=True)
    start = time.perf_counter()
    p = subprocess.run([kiln, "tokenize", "--tokenizer", tokenizer_path, "--input", corpus,
                        "--output", out, "--name", "bench", "--val-fraction", "0", "--threads",
                        str(threads)], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if p.returncode != 0:
        sys.exit(f"FAIL: kiln tokenize exited {p.returncode}: {p.stderr}")
    return seconds, p.stderr.strip()


def bench(name, t, path, kiln, corpus, texts, work, threads, repeat):
    separator = "<|begin_of_text|>" if t.token_to_id("<|begin_of_text|>") is not None \
        else "<|endoftext|>"
    sep = t.token_to_id(separator)
    t.encode_special_tokens = True
    hf_times, fast_times = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        encodings = t.encode_batch(texts, add_special_tokens=False)
        hf_times.append(time.perf_counter() - start)
    ids = [e.ids for e in encodings]
    del encodings
    if hasattr(t, "encode_batch_fast"):
        for _ in range(repeat):
            start = time.perf_counter()
            t.encode_batch_fast(texts, add_special_tokens=False)
            fast_times.append(time.perf_counter() - start)
    tokens = sum(len(x) for x in ids)
    out = os.path.join(work, "shards-" + name)
    kiln_times = []
    for _ in range(repeat):
        seconds, summary = run_kiln(kiln, path, corpus, out, threads)
        kiln_times.append(seconds)
    want = np.fromiter((i for doc in ids for i in [sep] + doc), dtype=np.int64,
                       count=tokens + len(ids))
    got = read_shards(os.path.join(out, "bench_train_*.bin"))
    if got.shape != want.shape or not np.array_equal(got, want):
        bad = np.flatnonzero(got[:min(len(got), len(want))] != want[:min(len(got), len(want))])
        sys.exit(f"FAIL: {name}: kiln's shards ({len(got)} ids) differ from tokenizers' "
                 f"({len(want)} ids), first at {bad[0] if len(bad) else min(len(got), len(want))}")
    width = 16 if t.get_vocab_size() <= 65536 else 32
    print(f"PASS: {name}: {len(ids)} documents, {tokens} tokens, ids equal ({summary})",
          file=sys.stderr)
    return {"name": name, "vocab": t.get_vocab_size(), "width": width, "tokens": tokens,
            "kiln": min(kiln_times), "hf": min(hf_times),
            "fast": min(fast_times) if fast_times else None}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir")
    parser.add_argument("--mb", type=int, default=60, help="corpus size in MB of text")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--work", default="/tmp/kiln-tokenize-bench")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best counts")
    args = parser.parse_args()
    kiln = os.path.join(args.build_dir, "bin", "kiln")
    os.makedirs(args.work, exist_ok=True)
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    corpus = os.path.join(args.work, "corpus.jsonl")
    docs, size = build_corpus(corpus, args.mb)
    with open(corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    print(f"corpus: {corpus}: {docs} documents, {size / 1e6:.1f} MB of text", file=sys.stderr)
    rows = []
    for name, build in [("gpt2-like", gpt2_like), ("llama3-like", llama3_like)]:
        path = os.path.join(args.work, name + ".json")
        if not os.path.exists(path):
            start = time.perf_counter()
            build(texts[:len(texts) // 3]).save(path)
            print(f"trained {path} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        rows.append(bench(name, Tokenizer.from_file(path), path, kiln, corpus, texts, args.work,
                          args.threads, args.repeat))
    cpu = re.sub(r"\s+", " ", subprocess.run(["lscpu"], capture_output=True, text=True).stdout)
    model = re.search(r"Model name: (.*?) (Thread|BIOS|Stepping|CPU family)", cpu)
    print(f"\n{docs} documents, {size / 1e6:.1f} MB of text, {args.threads} threads"
          f" ({model.group(1) if model else 'CPU'}); best of {args.repeat}\n")
    print("| tokenizer | vocabulary (shard) | tokens | kiln tokenize tokens/s (whole command) "
          "| tokenizers encode_batch tokens/s | encode_batch_fast tokens/s | kiln / encode_batch |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        fast = f"{r['tokens'] / r['fast']:,.0f}" if r["fast"] else "-"
        print(f"| {r['name']} | {r['vocab']} (uint{r['width']}) | {r['tokens']:,} "
              f"| {r['tokens'] / r['kiln']:,.0f} | {r['tokens'] / r['hf']:,.0f} | {fast} "
              f"| {r['hf'] / r['kiln']:.2f}x |")


if __name__ == "__main__":
    main()
