// kiln tokenize --tokenizer tokenizer.json --input GLOB [--input GLOB ...] --output DIR
//               [--field text] [--name NAME] [--shard-tokens 100000000] [--val-fraction 0.01]
//               [--separator TOKEN] [--threads N] [--on-error stop|skip] [--progress]
//               [--chat [--chat-template chatml|llama3]]:
// text (.txt, .jsonl, gzip of either) into llm.c token shards, encoded on every core
// (data/corpus_tokenizer.h, docs/data.md "kiln tokenize"); with --chat, .jsonl conversations
// through the model's chat template into shards and loss masks (docs/data.md "Chat data").

#include <unistd.h>
#include <boost/program_options.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "core/check.h"
#include "data/corpus_tokenizer.h"
#include "data/hf_tokenizer.h"
#include "launch/commands.h"

namespace po = boost::program_options;

namespace kiln::launch {
namespace {

// Skipped documents named one by one up to this many, then only counted.
constexpr std::int64_t kSkipMessages = 10;

data::OnDocumentError parse_on_error(const std::string& value) {
  if (value == "stop") return data::OnDocumentError::kStop;
  if (value == "skip") return data::OnDocumentError::kSkip;
  throw InputError("--on-error '" + value +
                   "': expected stop (the first bad document ends the run, nothing written) or "
                   "skip (bad documents are left out and counted)");
}

// The progress line: rewritten in place on a terminal, one line per update otherwise, at most
// every `interval` seconds.
class ProgressLine {
 public:
  ProgressLine(bool enabled, bool terminal)
      : enabled_(enabled), terminal_(terminal), interval_(terminal ? 0.25 : 1.0) {}

  void update(const data::CorpusProgress& p) {
    if (!enabled_ || p.seconds - last_ < interval_) return;
    last_ = p.seconds;
    std::fprintf(stderr, "%skiln tokenize: %lld documents, %lld tokens, %.1f MB/s%s",
                 terminal_ ? "\r" : "", static_cast<long long>(p.documents),
                 static_cast<long long>(p.tokens),
                 p.seconds > 0 ? static_cast<double>(p.bytes) / 1e6 / p.seconds : 0.0,
                 terminal_ ? "   " : "\n");
    std::fflush(stderr);
    shown_ = true;
  }
  void end() {
    if (shown_ && terminal_) std::fprintf(stderr, "\n");
    shown_ = false;
  }

 private:
  bool enabled_, terminal_;
  double interval_, last_ = -1e9;
  bool shown_ = false;
};

}  // namespace

int run_tokenize(const Arguments& args) {
  po::options_description options("kiln tokenize: text into llm.c token shards");
  options.add_options()("help,h", "show this help")(
      "tokenizer", po::value<std::string>()->required(),
      "Hugging Face's tokenizer.json, byte-level BPE (GPT-2, Llama 3, Qwen2)")(
      "input", po::value<std::vector<std::string>>()->required()->composing(),
      "files or globs (quoted) of .txt (a document per file), .jsonl (a document per line), "
      ".txt.gz, .jsonl.gz; repeatable, read in the order given")(
      "field", po::value<std::string>()->default_value("text"),
      "the string field of a .jsonl line that holds the document; with --chat the array of "
      "messages, default messages")("output", po::value<std::string>()->required(),
                                    "the folder of the shards (made if missing)")(
      "name", po::value<std::string>(),
      "shards NAME_val_000000.bin, NAME_train_000001.bin, ...; default: the output folder's name")(
      "shard-tokens", po::value<std::int64_t>()->default_value(100'000'000),
      "tokens per shard (llm.c's fineweb.py: 100,000,000)")(
      "val-fraction", po::value<double>()->default_value(0.01),
      "the share of documents in the val shards: the first, then every 1/F-th")(
      "separator", po::value<std::string>(),
      "the token before each document; default <|begin_of_text|> (Llama 3), else <|endoftext|>")(
      "threads", po::value<int>()->default_value(0),
      "encoding threads; 0 = one per core (the output does not depend on it)")(
      "on-error", po::value<std::string>()->default_value("stop"),
      "a bad document (invalid UTF-8, a bad JSON line, a corrupt gzip): stop (exit 2, nothing "
      "written) or skip (leave it out, count it)")(
      "progress", "show the progress line even when stderr is not a terminal")(
      "chat",
      "conversations: each .jsonl line {\"messages\": [{\"role\": \"system\"|\"user\"|"
      "\"assistant\", \"content\": \"...\"}]} through the model's chat template, with a loss "
      "mask beside each shard (only the assistant's replies and their end-of-turn token trained)")(
      "chat-template", po::value<std::string>(),
      "chatml (Qwen2.5's) or llama3 (Llama 3.1's); default: from the tokenizer's tokens "
      "(<|im_start|> or <|start_header_id|>)");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(options).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: kiln tokenize --tokenizer tokenizer.json --input GLOB [--input GLOB ...] "
                 "--output DIR\n"
                 "         [--field text] [--name NAME] [--shard-tokens 100000000] "
                 "[--val-fraction 0.01]\n"
                 "         [--separator TOKEN] [--threads N] [--on-error stop|skip] "
                 "[--progress]\n"
                 "         [--chat [--chat-template chatml|llama3]]\n\n"
              << options << "\n";
    return 0;
  }
  po::notify(vm);

  data::CorpusTokenizeOptions o;
  o.on_error = parse_on_error(vm["on-error"].as<std::string>());
  o.inputs = vm["input"].as<std::vector<std::string>>();
  o.chat = vm.count("chat") > 0;
  if (o.chat && !vm["field"].defaulted()) {
    o.messages_field = vm["field"].as<std::string>();
  } else {
    o.field = vm["field"].as<std::string>();
  }
  if (vm.count("chat-template")) o.chat_template = vm["chat-template"].as<std::string>();
  o.output_dir = vm["output"].as<std::string>();
  if (vm.count("name")) o.name = vm["name"].as<std::string>();
  o.shard_tokens = vm["shard-tokens"].as<std::int64_t>();
  o.val_fraction = vm["val-fraction"].as<double>();
  if (vm.count("separator")) o.separator = vm["separator"].as<std::string>();
  o.threads = vm["threads"].as<int>();
  const data::HfTokenizer tokenizer = data::HfTokenizer::load(vm["tokenizer"].as<std::string>());

  const bool terminal = ::isatty(STDERR_FILENO) == 1;
  ProgressLine line(terminal || vm.count("progress") > 0, terminal);
  std::int64_t skipped = 0;
  const auto on_skip = [&](const std::string& message) {
    line.end();
    if (++skipped <= kSkipMessages) {
      std::fprintf(stderr, "kiln tokenize: skipped %s\n", message.c_str());
    } else if (skipped == kSkipMessages + 1) {
      std::fprintf(stderr, "kiln tokenize: more documents skipped; the summary counts them\n");
    }
  };
  data::CorpusTokenizeResult r;
  try {
    r = data::tokenize_corpus(
        tokenizer, o, [&](const data::CorpusProgress& p) { line.update(p); }, on_skip);
  } catch (...) {
    line.end();
    throw;
  }
  line.end();
  const double seconds = r.seconds > 0 ? r.seconds : 1e-9;
  std::fprintf(stderr,
               "kiln tokenize: %lld documents (%lld skipped), %lld tokens with %s (id %lld) "
               "before each document; %zu val + %zu train shards of uint%d in %s; "
               "%.1f MB of input in %.2f s on %d threads: %.0f tokens/s, %.1f MB/s\n",
               static_cast<long long>(r.documents), static_cast<long long>(r.skipped),
               static_cast<long long>(r.tokens), r.separator.c_str(),
               static_cast<long long>(r.separator_id), r.val_shards.size(), r.train_shards.size(),
               8 * r.token_bytes, o.output_dir.c_str(), static_cast<double>(r.bytes) / 1e6,
               r.seconds, r.threads, static_cast<double>(r.tokens) / seconds,
               static_cast<double>(r.bytes) / 1e6 / seconds);
  if (o.chat) {
    std::fprintf(stderr,
                 "kiln tokenize: chat template %s; %lld of %lld tokens trained (mask 1), a .mask "
                 "beside each shard\n",
                 r.chat_template.c_str(), static_cast<long long>(r.trained),
                 static_cast<long long>(r.tokens));
  }
  return 0;
}

}  // namespace kiln::launch
