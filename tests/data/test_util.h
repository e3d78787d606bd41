#pragma once
// Helpers shared by the data tests: a scratch directory removed at the end, an assertion that a
// call throws InputError whose message holds given fragments, and a small byte-level
// tokenizer.json.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/json_writer.h"
#include "data/byte_level_bpe.h"

namespace kiln::data::testing {

class ScratchDir {
 public:
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kiln-data-XXXXXX").string();
    path_ = mkdtemp(pattern.data()) ? pattern : std::string();
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed";
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Fails unless `call` throws kiln::InputError whose message holds every fragment.
inline void expect_input_error(const std::function<void()>& call,
                               const std::vector<std::string>& fragments) {
  try {
    call();
    ADD_FAILURE() << "expected InputError holding '" << (fragments.empty() ? "" : fragments[0])
                  << "', nothing was thrown";
  } catch (const InputError& e) {
    std::string message = e.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "': " << message;
    }
  }
}

// A file in llm.c's shard layout: a 1024-byte header of int32 (magic, version, count, then zeros)
// and `size` bytes of payload. The test host is little-endian.
inline std::vector<std::uint8_t> llmc_layout_bytes(std::int32_t magic, std::int32_t version,
                                                   std::int32_t count, const void* payload,
                                                   std::size_t size) {
  std::vector<std::int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = count;
  std::vector<std::uint8_t> bytes(header.size() * sizeof(std::int32_t) + size);
  std::memcpy(bytes.data(), header.data(), header.size() * sizeof(std::int32_t));
  if (size > 0) std::memcpy(bytes.data() + header.size() * sizeof(std::int32_t), payload, size);
  return bytes;
}

// A byte-level BPE tokenizer.json (GPT-2's pre-tokenizer): the 256 byte symbols as ids 0..255,
// then each merge's result, in order, then `specials` as special added tokens.
inline std::string byte_level_tokenizer_json(
    const std::vector<std::pair<std::string, std::string>>& merges,
    const std::vector<std::string>& specials) {
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    vocab += (b ? ", " : "") + JsonWriter::quote(gpt2_byte_symbols()[static_cast<std::size_t>(b)]) +
             ": " + std::to_string(b);
  }
  std::string merge_list;
  int id = 256;
  for (const auto& [a, b] : merges) {
    vocab += ", " + JsonWriter::quote(a + b) + ": " + std::to_string(id++);
    merge_list += std::string(merge_list.empty() ? "" : ", ") + "[" + JsonWriter::quote(a) + ", " +
                  JsonWriter::quote(b) + "]";
  }
  std::string added;
  for (const std::string& s : specials) {
    added += std::string(added.empty() ? "" : ", ") + "{\"id\": " + std::to_string(id++) +
             ", \"content\": " + JsonWriter::quote(s) +
             ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": "
             "false, \"special\": true}";
  }
  return R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [)" + added +
         R"(], "normalizer": null, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
         "trim_offsets": true, "use_regex": true}, "post_processor": null,
         "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "dropout": null,
         "unk_token": null, "vocab": {)" +
         vocab + "}, \"merges\": [" + merge_list + "]}}";
}

}  // namespace kiln::data::testing
