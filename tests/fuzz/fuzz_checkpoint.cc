// The checkpoint loader: any bytes as a safetensors file, as the checkpoint state text, or as a
// manifest beside valid files give a loaded checkpoint or an InputError, never a crash.
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/check.h"
#include "core/safetensors.h"
#include "tests/fuzz/fuzz_util.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string path = kiln::fuzz::write_temp("st", data, size);
  try {
    kiln::load_safetensors(path);
  } catch (const kiln::InputError&) {
  }
  std::remove(path.c_str());
  kiln::config::CheckpointState state;
  google::protobuf::TextFormat::Parser parser;
  parser.AllowPartialMessage(true);
  struct Quiet : google::protobuf::io::ErrorCollector {
    void AddError(int, int, const std::string&) override {}
  } quiet;
  parser.RecordErrorsTo(&quiet);
  parser.ParseFromString(std::string(reinterpret_cast<const char*>(data), size), &state);
  // A checkpoint directory whose MANIFEST is the input.
  std::string dir = "/tmp/kiln-fuzz-ckpt-" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0755);
  std::FILE* f = std::fopen((dir + "/MANIFEST").c_str(), "wb");
  if (f != nullptr) {
    if (size > 0) std::fwrite(data, 1, size, f);
    std::fclose(f);
    try {
      kiln::train::CheckpointStore::load(dir);
    } catch (const kiln::InputError&) {
    }
  }
  return 0;
}
