#!/usr/bin/env python3
"""Writes a byte-level BPE tokenizer.json for the command-line tests: the 256 byte symbols (GPT-2's
bytes_to_unicode) as ids 0..255, no merges, then the given special tokens from id 256.

Usage: write_byte_tokenizer.py PATH SPECIAL_TOKEN...
"""
import json
import sys

bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
added = [{"id": 256 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
          "normalized": False, "special": True} for i, t in enumerate(sys.argv[2:])]
with open(sys.argv[1], "w") as f:
    json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
               "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
               "trim_offsets": True, "use_regex": True}, "post_processor": None,
               "decoder": {"type": "ByteLevel"},
               "model": {"type": "BPE", "dropout": None, "unk_token": None, "vocab": vocab,
                         "merges": []}}, f)
