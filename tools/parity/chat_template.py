#!/usr/bin/env python3
"""kiln tokenize --chat against transformers' own apply_chat_template (run on the GPU machine, which
has transformers; written for transformers 5.17, reading 4's return type as well; no network, no
weights).

For each template, chatml (Qwen2.5's chat_template) and llama3 (Llama 3.1's), the tokenizer.json
that tests/data/chat_tokenize_check.py trains (a Qwen2-like and a Llama-3-like one, with "\\n\\n" a
token) is loaded as a PreTrainedTokenizerFast (bos_token <|begin_of_text|> for Llama), its
chat_template set to the verbatim template text of that check, and each of its conversations
(system present and absent, multi-turn, unicode, empty contents, replies starting with newlines,
text that spells special tokens) goes through apply_chat_template(messages, tokenize=True). Kiln
tokenizes the same conversations from a .jsonl with `kiln tokenize --chat`; its shard, cut at its
separators (<|endoftext|> before each ChatML conversation, which Kiln adds; Llama 3's own
<|begin_of_text|>), must hold the same ids conversation for conversation. A conversation whose
content spells a special token differs on purpose (Kiln encodes such text as text, transformers
matches the token): it must decode to the same text, and is reported as such.

Usage: python3 tools/parity/chat_template.py --kiln build-gpu/bin/kiln
Prints PASS/FAIL lines; exits 1 on any FAIL.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))
import chat_tokenize_check as ci  # noqa: E402  the templates, conversations and tokenizers

from transformers import PreTrainedTokenizerFast  # noqa: E402

failures = 0


def check(ok, label, text):
    global failures
    failures += not ok
    print(f"{'PASS' if ok else 'FAIL'} {label}: {text}", flush=True)


def kiln_conversations(kiln, work, name, tok_path, convs, separator):
    """kiln tokenize --chat's ids, one list per conversation (the separator Kiln adds removed)."""
    path = os.path.join(work, name + ".jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for c in convs:
            f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
    out = os.path.join(work, name)
    p = subprocess.run([kiln, "tokenize", "--chat", "--tokenizer", tok_path, "--input", path,
                        "--output", out, "--name", name, "--val-fraction", "0"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        check(False, name, f"kiln tokenize --chat: exit {p.returncode}: {p.stderr}")
        return None
    with open(os.path.join(out, f"{name}_train_000001.bin"), "rb") as f:
        data = f.read()
    magic, _, count = struct.unpack("<3i", data[:12])
    ids = list(struct.unpack(f"<{count}{'H' if magic == 20240520 else 'I'}", data[1024:]))
    # Each conversation begins at a separator: text that spells it is text, so it is never an id
    # inside one.
    starts = [i for i, t in enumerate(ids) if t == separator]
    docs = [ids[a:b] for a, b in zip(starts, starts[1:] + [len(ids)])]
    return [d if name == "llama3" else d[1:] for d in docs]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", required=True, help="the kiln binary")
    args = parser.parse_args()
    with open(os.path.join(ROOT, "tests", "infer", "tokenizer_corpus.txt"), encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n") if line]
    convs = ci.conversations(lines)
    with tempfile.TemporaryDirectory() as work:
        for name, template, tok_path in ci.tokenizers_for_chat(lines, work):
            tokens = ci.TEMPLATES[template][3]
            hf = PreTrainedTokenizerFast(tokenizer_file=tok_path,
                                         **{k: v for k, v in tokens.items() if v})
            hf.chat_template = ci.TEMPLATES[template][0]
            sep = hf.convert_tokens_to_ids(
                "<|begin_of_text|>" if template == "llama3" else "<|endoftext|>")
            kiln = kiln_conversations(args.kiln, work, name, tok_path, convs, sep)
            if kiln is None:
                continue
            check(len(kiln) == len(convs), name,
                  f"{len(kiln)} conversations in Kiln's shard, {len(convs)} written")
            specials = {t.content for t in hf.added_tokens_decoder.values() if t.special}
            same = spelled = 0
            for k, (conv, got) in enumerate(zip(convs, kiln)):
                want = hf.apply_chat_template(conv, tokenize=True)
                if not isinstance(want, list):  # transformers 5: a BatchEncoding
                    want = want["input_ids"]
                if got == want:
                    same += 1
                    continue
                if any(s in m["content"] for m in conv for s in specials):
                    spelled += 1
                    check(hf.decode(got) == hf.decode(want), f"{name} conversation {k}",
                          "content spells a special token: Kiln keeps it as text, transformers "
                          "matches the token; the same text decoded")
                    continue
                at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                          min(len(got), len(want)))
                check(False, f"{name} conversation {k}",
                      f"ids differ at {at}: kiln {got[max(0, at - 4):at + 8]}, transformers "
                      f"{want[max(0, at - 4):at + 8]} ({len(got)} vs {len(want)}): {conv!r}")
            check(same + spelled == len(convs) and same > 0, f"{name} ({template})",
                  f"{same} of {len(convs)} conversations have apply_chat_template(tokenize=True)'s "
                  f"ids; {spelled} differ only where content spells a special token")
    print(f"{'FAIL' if failures else 'PASS'}: {failures} failures", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
