"""A text corpus from what Python ships, and a byte-level BPE tokenizer trained on it, for runs
that need real text without a download (bench/fp8-loss.sh): the .py sources of the standard
library and of any of the named packages that are installed, one document per file, in a fixed
order, up to --max-mb; the tokenizer (Hugging Face `tokenizers`, GPT-2's byte-level pre-tokenizer,
<|endoftext|> as its one special token) is trained on the same text.

usage: python3 tools/code_corpus.py OUT_DIR [--max-mb 60] [--vocab 16384] [--packages torch,transformers]
writes OUT_DIR/corpus.jsonl ({"text": ...} per document) and OUT_DIR/tokenizer.json
"""
import argparse
import importlib.util
import json
import os
import sys
import sysconfig


def sources(packages):
    roots = [sysconfig.get_paths()["stdlib"]]
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots.extend(spec.submodule_search_locations)
    for root in roots:
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            if "site-packages" in folder[len(root):] or "/test" in folder[len(root):]:
                continue
            for f in sorted(files):
                if f.endswith(".py"):
                    yield os.path.join(folder, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--max-mb", type=float, default=60)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--packages", default="torch,transformers")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    budget, docs = int(a.max_mb * 2**20), []
    for path in sources([p for p in a.packages.split(",") if p]):
        try:
            text = open(path, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 200:
            continue
        docs.append(text)
        budget -= len(text)
        if budget <= 0:
            break
    with open(os.path.join(a.out, "corpus.jsonl"), "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    print(f"code_corpus: {len(docs)} documents, {sum(map(len, docs)) / 2**20:.1f} MiB, "
          f"vocabulary {tok.get_vocab_size()}", file=sys.stderr)


if __name__ == "__main__":
    main()
