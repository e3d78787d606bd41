// Hugging Face's tokenizer.json reader (data/hf_tokenizer.h): any bytes give a tokenizer or an
// InputError; a tokenizer that loads encodes and decodes a text of every kind of character.
#include <cstdint>
#include <string>

#include "core/check.h"
#include "data/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const kiln::data::HfTokenizer t = kiln::data::HfTokenizer::from_json(text, "fuzz.json");
    const auto ids =
        t.encode("Hello  world's 1234 caf\xC3\xA9 e\xCC\x81 \xE6\x97\xA5\n\n<s>\xFF", true);
    t.decode(ids, false);
    t.decode({0, 1, 255, 256, 100000, -1}, true);
  } catch (const kiln::InputError&) {
  }
  return 0;
}
