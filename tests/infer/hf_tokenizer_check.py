#!/usr/bin/env python3
"""Kiln's tokenizer.json reader (data/hf_tokenizer.h) against Hugging Face's `tokenizers`, id for id.

Trains small byte-level BPE tokenizers with `tokenizers` itself (no download) on
tests/infer/tokenizer_corpus.txt, one per family Kiln reads: GPT-2's (ByteLevel alone, merges
written the old way, as "a b" strings), a RoBERTa-like one (add_prefix_space, added tokens with
lstrip and rstrip, <s> text </s> by RobertaProcessing), Llama 3's (Split by its pattern, then ByteLevel; ignore_merges; special tokens
after the vocabulary; <|begin_of_text|> by TemplateProcessing) and Qwen2's (single digits, NFC,
<|endoftext|> <|im_start|> <|im_end|>, a normalized added token). Each is saved as tokenizer.json
and a few thousand texts (the corpus's lines, edge cases, random mixtures of scripts, digits,
spaces, emoji and special tokens) are encoded by both, with and without special tokens, and decoded
(keeping and skipping special tokens); random id lists are decoded (characters cut between
tokens); NFC is checked against Python's unicodedata over every code point; tokenizer.json files
Kiln cannot read are refused with a message naming the file and the part.

Usage: hf_tokenizer_check.py path/to/hf_tokenizer_ids   (ctest test_infer_hf_tokenizer_parity)
Fails (never skips) when `tokenizers` is missing: scripts/install-deps.sh installs it.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import unicodedata

try:
    from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                            pre_tokenizers, processors, trainers)
except ImportError as e:
    sys.exit(f"FAIL: python3 cannot import tokenizers ({e}): run scripts/install-deps.sh")

HERE = os.path.dirname(os.path.abspath(__file__))
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
FAILURES = []


def fail(what):
    FAILURES.append(what)
    print("FAIL: " + what)
    if len(FAILURES) >= 20:
        sys.exit("FAIL: stopping after 20 failures")


def train(tokenizer, lines, vocab_size, special_tokens=()):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(special_tokens))
    tokenizer.train_from_iterator(lines, trainer)
    return tokenizer


def edited(tokenizer, edit):
    """The tokenizer after `edit` changed its JSON (as a dict); tokenizers reads it back."""
    data = json.loads(tokenizer.to_str())
    edit(data)
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def legacy_merges(path):
    """Rewrites a saved tokenizer.json's merges as older tokenizers wrote them: "a b" strings."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=2)


def whole_words(data):
    """Vocabulary entries no merge makes: with ignore_merges a piece equal to one is one token."""
    vocab = data["model"]["vocab"]
    for word in ["Ġzyxw", "Ġqqqq", "quux", "Ġthe"]:
        vocab.setdefault(word, len(vocab))


def digit_merges(data):
    """Merges of digits, so that where a pattern splits numbers shows in the ids."""
    vocab, merges = data["model"]["vocab"], data["model"]["merges"]
    for a, b in [("1", "2"), ("12", "3"), ("2", "0"), ("20", "2"), ("202", "4")]:
        vocab.setdefault(a + b, len(vocab))
        merges.append([a, b])


def gpt2_like(lines):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    return train(t, lines, 700, ["<|endoftext|>"])


def roberta_like(lines):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.decoder = decoders.ByteLevel()
    train(t, lines, 600, ["<s>", "</s>"])
    t.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    t.add_tokens([AddedToken("[R]", rstrip=True, normalized=False),
                  AddedToken("[LR]", lstrip=True, rstrip=True, normalized=False)])
    t.post_processor = processors.RobertaProcessing(("</s>", t.token_to_id("</s>")),
                                                    ("<s>", t.token_to_id("<s>")))
    return t


def llama3_like(lines):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    train(t, lines, 900)

    def edit(data):
        data["model"]["ignore_merges"] = True
        whole_words(data)

    t = edited(t, edit)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos = t.token_to_id("<|begin_of_text|>")
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return t


def qwen2_like(lines):
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    train(t, lines, 900)
    t = edited(t, lambda data: (whole_words(data), digit_merges(data)))
    t.add_special_tokens([AddedToken(s, special=True, normalized=False)
                          for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    # Matched in the NFC text, decoded as its NFC form.
    t.add_tokens([AddedToken("Cafe\u0301Bar", normalized=True, special=False)])
    return t


def texts(lines):
    """The texts both encode: edge cases, the corpus, and seeded random mixtures."""
    edge = ["", " ", "  ", "\n", "\r\n", "\t", "a", " a", "a ", "  a", "a  b", "a\n\nb", "x  \n  y",
            "end   ", "\n\n\n", " \n \n ", "\r\r\n\n", "hello world", "Hello  World!!", "'s", "'S",
            "'ſt", "x'ſt", "'RE 'Ve 'LL 'D 'M 'T", "don't DON'T", "''", "' s", "1", "12", "123",
            "1234", "12345678901", "a1b22c333d4444", "١٢٣٤٥", "²³¹", "Ⅻ", "½¾", "３４５",
            "\u00a0\u00a0x", "\u3000漢字", "\u2028\u2029", "x\u0085y", "\t\tword", " \tword",
            "!?", " !?", " !?\n\n", "...\r\n", "😀", " 😀", "👨‍👩‍👧", "🇫🇷", "e\u0301", "Cafe\u0301",
            "n\u0303o\u0308", "\u1100\u1161\u11a8", "가\u11a8", "A\u0328\u0301", "q\u0307\u0323",
            "<|endoftext|>", "<|endoftext|><|endoftext|>", "x<|endoftext|>y", "<|endoftext",
            "<|eot_id|><|eot_id|>", " <|im_start|>system\nHi<|im_end|>\n",
            "<|begin_of_text|>hi", "<mask>", "a <mask> b", "a   <mask>   b", "[R]   x", "  [LR]  ",
            "[R][R] [LR][LR]", "CaféBar", "Cafe\u0301Bar", "a CaféBar b", " zyxw", " qqqq",
            "quux", " the", "the", "\x00\x01\x1f\x7f", "\ufeffBOM", "\ufffd", "\U0010fffd"]
    out = edge + lines + ["\n".join(lines), "\r\n".join(lines[:10])]
    rng = random.Random(20260614)
    pieces = [line[i:j] for line in lines if line for _ in range(3)
              for i, j in [sorted(rng.sample(range(len(line) + 1), 2))]]
    alphabet = ("abcXYZ  \t\n\r'’0123456789٣७¼Ⅳ.,!?-_()[]{}<>|\"\\/@#$%^&*+=~`éüßçñøåœ"
                "ıİſжЖλΩ中文日本한국ไทยעבעربي😀👍🏽❤️🔥\u00a0\u3000\u200d\u0301\u0308\u0323")
    specials = ["<|endoftext|>", "<|eot_id|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>",
                "<mask>", "[R]", "[LR]", "CaféBar", "Cafe\u0301Bar"]
    for _ in range(1500):
        parts = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.4:
                parts.append(rng.choice(pieces))
            elif r < 0.8:
                parts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))))
            else:
                parts.append(rng.choice(specials))
        out.append("".join(parts))
    return out


def run_helper(helper, tokenizer_json, requests):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    try:
        p = subprocess.run([helper, tokenizer_json, f.name], capture_output=True, timeout=600)
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        fail(f"{helper} {tokenizer_json}: exit {p.returncode}: {p.stderr.decode(errors='replace')}")
        return None
    # split("\n"), not splitlines(): the answers hold U+2028 and U+0085 unescaped.
    answers = [json.loads(line) for line in p.stdout.decode("utf-8").split("\n") if line]
    if len(answers) != len(requests):
        fail(f"{len(answers)} answers to {len(requests)} requests")
        return None
    return answers


def tokens_of(t, ids):
    return [t.id_to_token(i) for i in ids]


def compare(name, t, path, helper, samples):
    rng = random.Random(7)
    size = max(t.get_vocab(with_added_tokens=True).values()) + 1
    id_lists = [[rng.randrange(size + 3) for _ in range(rng.randint(1, 8))] for _ in range(400)]
    probes = ["<|endoftext|>", "<|eot_id|>", "<|im_end|>", "Ġthe", "a", "nothing-like-this"]
    requests = ([{"encode": s} for s in samples] + [{"decode": ids} for ids in id_lists] +
                [{"token_to_id": p} for p in probes] + [{"info": True}])
    answers = run_helper(helper, path, requests)
    if answers is None:
        return
    n = len(samples)
    for s, a in zip(samples, answers[:n]):
        want = t.encode(s).ids
        if a["ids"] != want:
            fail(f"{name}: encode({s!r}): kiln {a['ids']} {tokens_of(t, a['ids'])}, tokenizers "
                 f"{want} {tokens_of(t, want)}")
            continue
        plain = t.encode(s, add_special_tokens=False).ids
        if a["ids_plain"] != plain:
            fail(f"{name}: encode({s!r}, add_special_tokens=False): kiln {a['ids_plain']}, "
                 f"tokenizers {plain}")
        for key, skip in [("decoded", False), ("decoded_skip", True)]:
            if a[key] != t.decode(want, skip_special_tokens=skip):
                fail(f"{name}: decode({want}, skip_special_tokens={skip}): kiln {a[key]!r}, "
                     f"tokenizers {t.decode(want, skip_special_tokens=skip)!r}")
    for ids, a in zip(id_lists, answers[n:n + len(id_lists)]):
        for key, skip in [("text", False), ("text_skip", True)]:
            if a[key] != t.decode(ids, skip_special_tokens=skip):
                fail(f"{name}: decode({ids}, skip_special_tokens={skip}): kiln {a[key]!r}, "
                     f"tokenizers {t.decode(ids, skip_special_tokens=skip)!r}")
    for p, a in zip(probes, answers[n + len(id_lists):]):
        want = t.token_to_id(p)
        if a["id"] != (-1 if want is None else want):
            fail(f"{name}: token_to_id({p!r}): kiln {a['id']}, tokenizers {want}")
    info = answers[-1]
    if info["vocab_size"] != size:
        fail(f"{name}: vocab_size: kiln {info['vocab_size']}, tokenizers' largest id + 1 {size}")
    stops = [t.token_to_id(s) for s in ["<|endoftext|>", "<|end_of_text|>", "<|eot_id|>",
                                        "<|im_end|>"] if t.token_to_id(s) is not None]
    if info["stop_token_ids"] != stops or info["end_of_text_id"] != (stops[0] if stops else -1):
        fail(f"{name}: stop tokens: kiln {info}, tokenizers {stops}")
    print(f"PASS: {name}: {n} texts, {len(id_lists)} id lists, {len(probes)} lookups")


def check_nfc(helper, path):
    """NFC of every code point, in runs (neighbours compose), and of random mark sequences."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    runs = ["".join(map(chr, cps[i:i + 64])) for i in range(0, len(cps), 64)]
    marks = [chr(c) for c in range(0x300, 0x370)] + ["\u05b0", "\u0f71", "\u0f72", "\u0f80",
                                                      "\u302a", "\u3099", "\u1161", "\u11a8"]
    bases = list("aeiouAEIOUnNcCsSzZ") + ["\u1100", "\uac00", "\uac01", "\u03b1", "\u0391",
                                         "\u0435", "\u3046", "\u30cf", "\u0915", "\u00c5"]
    rng = random.Random(3)
    mixed = ["".join(rng.choice(bases if rng.random() < 0.4 else marks)
                     for _ in range(rng.randint(1, 8))) for _ in range(5000)]
    samples = runs + mixed
    answers = run_helper(helper, path, [{"nfc": s} for s in samples])
    if answers is None:
        return
    bad = [(s, a["nfc"]) for s, a in zip(samples, answers)
           if a["nfc"] != unicodedata.normalize("NFC", s)]
    for s, got in bad[:5]:
        fail(f"nfc({s!r}): kiln {got!r}, unicodedata {unicodedata.normalize('NFC', s)!r}")
    if not bad:
        print(f"PASS: NFC of every code point and {len(mixed)} mark sequences "
              f"(Unicode {unicodedata.unidata_version})")


def check_refusals(helper, work, lines):
    """tokenizer.json files Kiln does not read: exit 2, a message naming the file and the part."""
    def with_pre(pre):
        t = Tokenizer(models.BPE())
        t.pre_tokenizer = pre
        t.decoder = decoders.ByteLevel()
        return train(t, lines[:5], 300)

    metaspace = Tokenizer(models.BPE())
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    metaspace.decoder = decoders.Metaspace()
    train(metaspace, lines[:5], 300)
    nfkc = with_pre(pre_tokenizers.ByteLevel())
    nfkc.normalizer = normalizers.NFKC()
    cases = [
        ("other_regex", with_pre(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+"), behavior="isolated"),
            pre_tokenizers.ByteLevel(use_regex=False)])),
         "pre_tokenizer.pretokenizers[0].pattern.Regex (line"),
        ("removed", with_pre(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="removed"),
            pre_tokenizers.ByteLevel(use_regex=False)])),
         "pre_tokenizer.pretokenizers[0].behavior (line"),
        ("metaspace", metaspace, "type 'Metaspace' is not supported"),
        ("nfkc", nfkc, "normalizer (line"),
        ("digits", with_pre(pre_tokenizers.Sequence([pre_tokenizers.Digits(),
                                                     pre_tokenizers.ByteLevel()])),
         "type 'Digits' is not supported (Kiln reads ByteLevel, Split)"),
    ]
    for name, t, part in cases:
        path = os.path.join(work, name + ".json")
        t.save(path)
        p = subprocess.run([helper, path, os.devnull], capture_output=True, timeout=60)
        message = p.stderr.decode(errors="replace")
        if p.returncode != 2 or not message.startswith(path + ": ") or part not in message:
            fail(f"refusal {name}: exit {p.returncode}, message {message!r} (expected '{part}')")
        else:
            print(f"PASS: refused {name}: {message.strip()}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    helper = sys.argv[1]
    with open(os.path.join(HERE, "tokenizer_corpus.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    samples = texts(lines)
    with tempfile.TemporaryDirectory() as work:
        for name, build in [("gpt2", gpt2_like), ("roberta", roberta_like),
                            ("llama3", llama3_like), ("qwen2", qwen2_like)]:
            path = os.path.join(work, name + ".json")
            build(lines).save(path)
            if name == "gpt2":
                legacy_merges(path)
            compare(name, Tokenizer.from_file(path), path, helper, samples)
        check_nfc(helper, os.path.join(work, "qwen2.json"))
        check_refusals(helper, work, lines)
    if FAILURES:
        sys.exit(f"FAIL: {len(FAILURES)} disagreements with tokenizers")
    print("PASS: Kiln's tokenizer.json reader gives tokenizers' ids")


if __name__ == "__main__":
    main()
