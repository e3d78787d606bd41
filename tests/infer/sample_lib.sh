# Shared by kiln sample's script tests: a tiny GPT-2 trained here, and BPE files for it.
GPT=$SRC/tests/infer/tiny_gpt2.pbtxt
RUN=(--set logging.dir="$WORK/run")

train_tiny_gpt2() {
  "$KILN" train --config "$GPT" "${RUN[@]}" --quiet > "$WORK/train.log" 2>&1 ||
    { cat "$WORK/train.log"; fail "kiln train of the tiny GPT-2"; }
}

# The token ids a `kiln sample --json` printed, one line.
json_tokens() { python3 -c 'import json, sys; print(*json.load(sys.stdin)["tokens"])'; }

# vocab.json and merges.txt of a byte-level BPE covering ids 0..511 exactly: byte b is id b (its
# GPT-2 symbol), then the 256 pairs of the letters a..p, merged in order ("a a" -> "aa" = 256).
write_bpe_files() {  # directory
  python3 - "$1" <<'PY'
import json, os, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
symbol = dict(zip(bs, map(chr, cs)))
vocab = {symbol[b]: b for b in range(256)}
letters = "abcdefghijklmnop"
pairs = [(x, y) for x in letters for y in letters]
for i, (x, y) in enumerate(pairs):
    vocab[x + y] = 256 + i
with open(os.path.join(sys.argv[1], "vocab.json"), "w", encoding="utf-8") as f:
    json.dump(vocab, f, ensure_ascii=False)
with open(os.path.join(sys.argv[1], "merges.txt"), "w", encoding="utf-8") as f:
    f.write("#version: 0.2\n" + "".join("%s %s\n" % p for p in pairs))
PY
}

# tokenizer.json of the same tokenizer in the layout tokenizers writes for GPT-2 (ByteLevel
# pre-tokenizer and decoder, BPE model), from the directory's vocab.json and merges.txt.
write_tokenizer_json() {  # directory
  python3 - "$1" <<'PY'
import json, os, sys
d = sys.argv[1]
vocab = json.load(open(os.path.join(d, "vocab.json"), encoding="utf-8"))
merges = [line.split(" ") for line in open(os.path.join(d, "merges.txt"), encoding="utf-8")
          .read().splitlines()[1:] if line]
byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": True}
t = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
     "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level,
     "decoder": byte_level,
     "model": {"type": "BPE", "dropout": None, "unk_token": None,
               "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
               "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": merges}}
with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(t, f, ensure_ascii=False, indent=2)
PY
}
