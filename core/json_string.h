#pragma once
// Reading JSON strings (the safetensors header, a tokenizer's vocab.json) the one strict way:
// escapes decoded, \uXXXX to UTF-8 with surrogate pairs joined; control characters, unknown
// escapes and lone surrogates refused, so a name reads as its writer meant it or not at all
// (never "weigh\u00f4" as "weight").

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace kiln {

// Called with the offset of the problem in the text and what it is; it must throw.
using JsonFailure = std::function<void(std::size_t at, const std::string& what)>;

// Reads the string that starts after its opening quote at text[pos], up to and including the
// closing quote; `pos` ends after it.
std::string read_json_string(const std::string& text, std::size_t& pos, const JsonFailure& fail);

void append_utf8(std::uint32_t code_point, std::string* out);

}  // namespace kiln
