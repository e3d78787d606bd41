"""Stand-in for tiktoken on a machine without it (and without internet): llm.c's train_gpt2.py
calls tiktoken.get_encoding("gpt2") at start and uses the encoding only to write the tokenizer
file (--write_tensors 1) and to print samples (--sample_every > 0); run it with both off.
Token ids are printed as numbers; nothing here is GPT-2's real BPE."""

__all__ = ["get_encoding", "Encoding"]


class Encoding:
    name = "gpt2-standin"
    eot_token = 50256
    max_token_value = 50256
    n_vocab = 50257

    def encode(self, text, allowed_special=(), disallowed_special=()):
        return [b % self.n_vocab for b in str(text).encode("utf-8")]

    def encode_ordinary(self, text):
        return self.encode(text)

    def decode(self, tokens, errors="replace"):
        return " ".join(str(int(t)) for t in tokens)

    def decode_bytes(self, tokens):
        return self.decode(tokens).encode("utf-8")


def get_encoding(name="gpt2"):
    return Encoding()


def encoding_for_model(name):
    return Encoding()
