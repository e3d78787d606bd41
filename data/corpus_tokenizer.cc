#include "data/corpus_tokenizer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "data/chat_template.h"
#include "data/file_io.h"
#include "data/llmc_shard_writer.h"
#include "data/llmc_shards.h"
#include "data/text_documents.h"

namespace kiln::data {
namespace {

// A batch is what one worker encodes at a time: big enough that handing it over costs nothing,
// small enough that a few per thread keep every thread busy to the end.
constexpr std::uint64_t kBatchBytes = 256 * 1024;
constexpr std::size_t kBatchDocuments = 1024;
constexpr std::size_t kBatchesPerThread = 4;  // in flight: read ahead, encoded or being written

struct Batch {
  std::vector<RawDocument> docs;
  std::uint64_t bytes = 0;
  // Results, by document: the ids of all of them in order (and for chat data their mask values),
  // where each one's end, its error.
  std::vector<std::uint32_t> ids;
  std::vector<std::uint8_t> mask;
  std::vector<std::size_t> ends;
  std::vector<std::string> errors;  // empty: the document is good
  std::string fatal;                // a failure that is not the input's (out of memory)
  bool done = false;
};

// Worker threads encoding batches (documents, or conversations with `chat`); the caller waits for
// each batch in its own order.
class EncodePool {
 public:
  EncodePool(const HfTokenizer& tokenizer, const ChatEncoder* chat,
             const std::vector<TextFile>& files, const std::string& field, int threads)
      : tokenizer_(tokenizer), chat_(chat), files_(files), field_(field) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  }
  // Workers finish the batch they hold (never one still queued) and stop.
  ~EncodePool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_ready_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  EncodePool(const EncodePool&) = delete;
  EncodePool& operator=(const EncodePool&) = delete;

  void submit(Batch* batch) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(batch);
    }
    work_ready_.notify_one();
  }
  void wait(const Batch* batch) {
    std::unique_lock<std::mutex> lock(mutex_);
    batch_done_.wait(lock, [&] { return batch->done; });
  }

 private:
  void work() {
    HfTokenizer::EncodeCache cache;
    std::vector<std::int64_t> ids;
    std::vector<std::uint8_t> mask;
    for (;;) {
      Batch* batch;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        work_ready_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        batch = queue_.front();
        queue_.pop_front();
      }
      try {
        encode(batch, &cache, &ids, &mask);
      } catch (const std::exception& e) {
        batch->fatal = e.what();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        batch->done = true;
      }
      batch_done_.notify_all();
    }
  }

  void encode(Batch* batch, HfTokenizer::EncodeCache* cache, std::vector<std::int64_t>* ids,
              std::vector<std::uint8_t>* mask) {
    HfTokenizer::EncodeOptions options;
    options.add_special_tokens = false;   // the separator is written by the caller
    options.split_special_tokens = true;  // a document cannot forge one
    batch->errors.resize(batch->docs.size());
    for (std::size_t i = 0; i < batch->docs.size(); ++i) {
      RawDocument& doc = batch->docs[i];
      if (!doc.error.empty()) {
        batch->errors[i] = doc.error;
      } else {
        const TextFile& file = files_[doc.file];
        const std::int64_t line = doc.line;
        // Built only when needed: text documents are many and small.
        const auto where = [&] { return file.path + ":" + std::to_string(line); };
        // The tokenizer's errors (a byte the vocabulary lacks) do not know the document.
        const auto naming_document = [&](const auto& encode_one) {
          try {
            encode_one();
          } catch (const InputError& e) {
            throw InputError(where() + ": " + e.what());
          }
        };
        try {
          ids->clear();
          mask->clear();
          if (chat_ != nullptr) {
            const JsonValue object =
                document_object(std::move(doc), file, "a field '" + field_ + "' of messages");
            const std::vector<ChatMessage> messages = parse_conversation(object, where(), field_);
            naming_document([&] { chat_->encode(messages, cache, ids, mask); });
          } else {
            const std::string text = document_text(std::move(doc), file, field_);
            naming_document([&] { tokenizer_.encode(text, options, cache, ids); });
          }
          for (std::int64_t id : *ids) batch->ids.push_back(static_cast<std::uint32_t>(id));
          batch->mask.insert(batch->mask.end(), mask->begin(), mask->end());
        } catch (const InputError& e) {
          batch->errors[i] = e.what();
        }
      }
      batch->ends.push_back(batch->ids.size());
      doc.bytes = std::string();  // the text is no longer needed
    }
  }

  const HfTokenizer& tokenizer_;
  const ChatEncoder* chat_;  // nullptr: text documents
  const std::vector<TextFile>& files_;
  const std::string& field_;
  std::mutex mutex_;
  std::condition_variable work_ready_, batch_done_;
  std::deque<Batch*> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// The output folder: made when missing, removed again if the run fails and leaves it empty.
class OutputFolder {
 public:
  explicit OutputFolder(const std::string& path) : path_(path) {
    if (path.empty()) throw InputError("no output folder");
    if (path_exists(path)) {
      if (!is_directory(path)) throw InputError(path + ": the output must be a folder");
      return;
    }
    std::error_code error;
    std::filesystem::create_directories(path, error);
    if (error) throw InputError(path + ": cannot create the output folder: " + error.message());
    created_ = true;
  }
  ~OutputFolder() {
    if (created_ && !kept_) KILN_IGNORE_ERROR(::rmdir(path_.c_str()));  // only if empty
  }
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;
  void keep() { kept_ = true; }

 private:
  std::string path_;
  bool created_ = false, kept_ = false;
};

std::string format_fraction(double f) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", f);
  return text;
}

void check_options(const CorpusTokenizeOptions& o) {
  if (o.shard_tokens < 1 || o.shard_tokens > 0x7fffffff) {
    throw InputError("--shard-tokens " + std::to_string(o.shard_tokens) +
                     ": must be from 1 to 2147483647 (llm.c's header counts tokens in an int32)");
  }
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    throw InputError("--val-fraction " + format_fraction(o.val_fraction) +
                     ": must be at least 0 and below 1 (the share of documents that go to the "
                     "val shards)");
  }
  if (o.threads < 0) throw InputError("--threads " + std::to_string(o.threads) + ": must be >= 0");
  if (o.field.empty() || o.messages_field.empty()) {
    throw InputError("--field: the JSON field name is empty");
  }
  if (!o.chat && !o.chat_template.empty()) {
    throw InputError("--chat-template " + o.chat_template +
                     ": a chat template applies to conversations: add --chat");
  }
}

bool goes_to_val(std::int64_t k, double fraction) {
  const double x = static_cast<double>(k);
  return std::ceil((x + 1) * fraction) > std::ceil(x * fraction);
}

}  // namespace

std::string choose_separator(const HfTokenizer& tokenizer, const std::string& requested,
                             std::int64_t* id) {
  if (!requested.empty()) {
    *id = tokenizer.token_to_id(requested);
    if (*id < 0) {
      throw InputError("--separator '" + requested + "': the tokenizer " + tokenizer.source() +
                       " has no such token (give a token as its vocabulary or added_tokens "
                       "spell it, such as <|endoftext|>)");
    }
    return requested;
  }
  for (const char* token : {"<|begin_of_text|>", "<|endoftext|>"}) {
    *id = tokenizer.token_to_id(token);
    if (*id >= 0) return token;
  }
  throw InputError(tokenizer.source() +
                   ": the tokenizer has neither <|begin_of_text|> (Llama 3) nor <|endoftext|> "
                   "(GPT-2, Qwen2) to put before each document: name the token with --separator");
}

std::string default_shard_name(const std::string& output_dir) {
  std::filesystem::path dir = std::filesystem::path(output_dir).lexically_normal();
  if (!dir.empty() && dir.filename().empty()) dir = dir.parent_path();  // a trailing slash
  std::string name = dir.filename().string();
  if (name.empty() || name == "." || name == "..") {
    name = std::filesystem::absolute(dir).lexically_normal().filename().string();
  }
  return name;
}

CorpusTokenizeResult tokenize_corpus(const HfTokenizer& tokenizer,
                                     const CorpusTokenizeOptions& options,
                                     const std::function<void(const CorpusProgress&)>& progress,
                                     const std::function<void(const std::string&)>& skipped) {
  check_options(options);
  const auto start = std::chrono::steady_clock::now();
  CorpusTokenizeResult result;
  result.separator = choose_separator(tokenizer, options.separator, &result.separator_id);
  const std::vector<TextFile> files = expand_text_inputs(options.inputs);
  std::unique_ptr<ChatTemplate> chat_template;
  std::unique_ptr<ChatEncoder> chat;
  if (options.chat) {
    for (const TextFile& file : files) {
      if (!file.json_lines) {
        throw InputError(file.path +
                         ": kiln tokenize --chat reads conversations from .jsonl[.gz] files, one "
                         "{\"" +
                         options.messages_field + "\": [...]} per line");
      }
    }
    chat_template = make_chat_template(options.chat_template, tokenizer);
    chat = std::make_unique<ChatEncoder>(tokenizer, *chat_template);
    result.chat_template = chat_template->name();
  }
  const std::string name =
      options.name.empty() ? default_shard_name(options.output_dir) : options.name;
  if (name.empty() || name.find('/') != std::string::npos) {
    throw InputError("--name '" + name + "': a shard name must be non-empty, without '/'");
  }
  result.threads = options.threads > 0
                       ? options.threads
                       : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const std::int64_t vocab = tokenizer.vocab_size();
  result.token_bytes = LlmcShardWriter::token_bytes_for(vocab);

  OutputFolder folder(options.output_dir);
  // Masks too: an earlier chat run's masks would attach themselves to this run's shards.
  for (const char* split : {"val", "train"}) {
    for (const char* kind : {".bin", ".mask"}) {
      const std::string files_named = name + "_" + split + "_*" + kind;
      const std::vector<std::string> old = glob_paths(join_path(options.output_dir, files_named));
      if (!old.empty()) {
        throw InputError(options.output_dir + " already holds " + std::to_string(old.size()) +
                         (kind == std::string(".bin") ? " shard(s)" : " mask(s)") + " named " +
                         files_named + " (" + old.front() +
                         "): remove them, or choose another --output or --name (a run never "
                         "mixes its shards with an earlier run's)");
      }
    }
  }
  // llm.c's numbering: the val shards from 000000, the train shards from 000001.
  LlmcShardWriter val(options.output_dir, name, "val", 0, options.shard_tokens, vocab,
                      options.chat);
  LlmcShardWriter train(options.output_dir, name, "train", 1, options.shard_tokens, vocab,
                        options.chat);
  const auto separator = static_cast<std::uint32_t>(result.separator_id);

  TextDocumentReader reader(files);
  std::deque<std::unique_ptr<Batch>> in_flight;
  // After in_flight: destroyed first, so no worker outlives the batches it holds.
  EncodePool pool(tokenizer, chat.get(), files,
                  options.chat ? options.messages_field : options.field, result.threads);
  const std::size_t max_in_flight = kBatchesPerThread * static_cast<std::size_t>(result.threads);
  bool input_done = false;
  for (;;) {
    while (!input_done && in_flight.size() < max_in_flight) {
      auto batch = std::make_unique<Batch>();
      RawDocument doc;
      while (batch->bytes < kBatchBytes && batch->docs.size() < kBatchDocuments) {
        if (!reader.next(&doc)) {
          input_done = true;
          break;
        }
        batch->bytes += doc.bytes.size();
        batch->docs.push_back(std::move(doc));
      }
      if (batch->docs.empty()) break;
      pool.submit(batch.get());
      in_flight.push_back(std::move(batch));
    }
    if (in_flight.empty()) break;
    Batch& batch = *in_flight.front();
    pool.wait(&batch);
    if (!batch.fatal.empty()) throw Error("kiln tokenize: encoding failed: " + batch.fatal);
    std::size_t begin = 0;
    for (std::size_t i = 0; i < batch.docs.size(); ++i) {
      const std::size_t end = batch.ends[i];
      if (!batch.errors[i].empty()) {
        if (options.on_error == OnDocumentError::kStop) {
          throw InputError(batch.errors[i] +
                           " (--on-error skip leaves such documents out; nothing was written)");
        }
        ++result.skipped;
        if (skipped) skipped(batch.errors[i]);
        begin = end;
        continue;
      }
      const bool to_val = goes_to_val(result.documents, options.val_fraction);
      LlmcShardWriter& out = to_val ? val : train;
      // A conversation whose template begins with the separator (Llama 3's <|begin_of_text|>)
      // is not given a second one.
      const bool separate = !options.chat || end == begin || batch.ids[begin] != separator;
      const std::int64_t n = static_cast<std::int64_t>(end - begin) + (separate ? 1 : 0);
      if (separate) out.write(separator, 0);
      out.write(batch.ids.data() + begin, options.chat ? batch.mask.data() + begin : nullptr,
                end - begin);
      if (options.chat) {
        result.trained += std::count(batch.mask.begin() + static_cast<std::ptrdiff_t>(begin),
                                     batch.mask.begin() + static_cast<std::ptrdiff_t>(end), 1);
      }
      ++result.documents;
      result.tokens += n;
      if (to_val) {
        ++result.val_documents;
        result.val_tokens += n;
      }
      begin = end;
    }
    result.bytes += batch.bytes;
    in_flight.pop_front();
    result.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (progress) progress(result);
  }
  if (result.documents == 0) {
    throw InputError("no document to write: every document of the input was " +
                     std::string(result.skipped > 0 ? "bad and skipped" : "empty") +
                     " (blank .jsonl lines are not documents)");
  }
  result.val_shards = val.commit();
  try {
    result.train_shards = train.commit();
  } catch (...) {
    for (const std::string& path : result.val_shards) KILN_IGNORE_ERROR(::unlink(path.c_str()));
    throw;
  }
  folder.keep();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace kiln::data
