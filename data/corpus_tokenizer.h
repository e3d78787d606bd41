#pragma once
// Text in, llm.c token shards out: what `kiln tokenize` does (docs/data.md, "kiln tokenize").
//
// The reader (data/text_documents.h) cuts the input into documents on the calling thread;
// worker threads parse, check and encode batches of them with one shared HfTokenizer (each with
// its own EncodeCache); the calling thread takes the batches back in input order and writes each
// document as [separator, its ids...] into the shards (data/llmc_shard_writer.h). So the shards
// are the same bytes whatever the thread count.
//
// Documents are split between validation and training by their order: with val_fraction f,
// document k (counting the documents written, from 0) goes to the val shards when
// ceil((k + 1)·f) > ceil(k·f): the first document, then every 1/f-th, spread over the whole
// corpus, ceil(N·f) of N documents.
//
// Chat data (`chat`): each .jsonl line is a conversation, one document, rendered by a chat
// template and encoded with its loss mask (data/chat_template.h); every shard gets a mask shard
// beside it (data/llmc_shards.h), the separator's mask value 0. The separator is left out where
// the template's first token already is it (Llama 3's <|begin_of_text|>), so no conversation
// starts with two.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/hf_tokenizer.h"

namespace kiln::data {

enum class OnDocumentError { kStop, kSkip };

struct CorpusTokenizeOptions {
  std::vector<std::string> inputs;  // globs of .txt, .jsonl, .txt.gz, .jsonl.gz
  std::string field = "text";       // a .jsonl line's string field
  std::string output_dir;           // created when missing
  std::string name;                 // shards NAME_val_000000.bin, ...; empty: the folder's name
  std::int64_t shard_tokens = 100'000'000;  // llm.c's fineweb.py
  double val_fraction = 0.01;               // [0, 1): the share of documents in val shards
  std::string separator;  // a token before each document; empty: chosen (choose_separator)
  int threads = 0;        // encoding threads; 0: the hardware's
  OnDocumentError on_error = OnDocumentError::kStop;
  bool chat = false;          // .jsonl conversations, with loss masks
  std::string chat_template;  // "chatml", "llama3"; empty: from the tokenizer's tokens
  std::string messages_field = "messages";  // a chat line's array of messages
};

struct CorpusProgress {
  std::int64_t documents = 0;  // written
  std::int64_t skipped = 0;    // bad documents left out (OnDocumentError::kSkip)
  std::int64_t tokens = 0;     // written, separators included
  std::int64_t trained = 0;    // tokens whose mask is 1 (chat data)
  std::uint64_t bytes = 0;     // input read (decompressed)
  double seconds = 0;
};

struct CorpusTokenizeResult : CorpusProgress {
  std::string separator;  // the token before each document, and its id
  std::int64_t separator_id = -1;
  int token_bytes = 2;        // 2 (uint16 shards) or 4 (uint32)
  std::string chat_template;  // the template's name (chat data)
  int threads = 1;
  std::int64_t val_documents = 0, val_tokens = 0;
  std::vector<std::string> val_shards, train_shards;  // final paths
};

// The token written before each document: `requested` when given (InputError when the tokenizer
// has no such token), else <|begin_of_text|> (Llama 3, as llm.c's llama3 branch), else
// <|endoftext|> (GPT-2, Qwen2, as llm.c's fineweb.py), else InputError asking for --separator.
// Returns the token and sets its id.
std::string choose_separator(const HfTokenizer& tokenizer, const std::string& requested,
                             std::int64_t* id);

// The default shard name: the output folder's last component ("/data/fineweb10B/" ->
// "fineweb10B").
std::string default_shard_name(const std::string& output_dir);

// Reads, encodes and writes the whole corpus (with masks for chat data). `progress` (may be empty)
// is called from the calling thread after each batch is written; `skipped` (may be empty) with each
// bad document's message, in input order, under kSkip. InputError for bad options, an input that
// matches nothing, an output folder that already holds shards or masks of this name, a chat input
// other than .jsonl[.gz], and under kStop the first bad document
// ("FILE:LINE: what"): then every shard this run wrote is removed (and the output folder, if
// this run created it and it is empty again). Nothing appears under a shard's name until all
// are written.
CorpusTokenizeResult tokenize_corpus(const HfTokenizer& tokenizer,
                                     const CorpusTokenizeOptions& options,
                                     const std::function<void(const CorpusProgress&)>& progress,
                                     const std::function<void(const std::string&)>& skipped);

}  // namespace kiln::data
