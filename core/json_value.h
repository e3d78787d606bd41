#pragma once
// A JSON document read whole into a tree (RFC 8259, strictly): the safetensors header, a
// tokenizer's vocab.json and tokenizer.json. Strings decode as core/json_string.h says; numbers
// keep both their double value and, when written as an integer that fits, their exact int64; an
// object keeps its members in file order and refuses a name given twice. Every value remembers
// where it starts, so a reader that finds the wrong kind of value can say where.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/json_string.h"

namespace kiln {

struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object };

  Kind kind = Kind::Null;
  std::size_t offset = 0;  // of the value's first character in the text
  bool boolean = false;
  double number = 0;
  bool is_integer = false;  // a Number written without fraction or exponent, within int64
  std::int64_t integer = 0;
  std::string string;
  std::vector<JsonValue> items;    // an Array's elements, or an Object's values
  std::vector<std::string> names;  // an Object's names, beside `items`

  // An Object's member by name, or nullptr (also for a value that is not an Object).
  const JsonValue* find(const std::string& name) const;
};

// "null", "a boolean", "a number", "a string", "an array", "an object".
const char* json_kind_name(JsonValue::Kind kind);

// The whole of `text` as one value (nested at most 64 deep, so hostile input cannot exhaust the
// stack). On bad JSON calls `fail` with the offset and what is wrong; `fail` must throw.
JsonValue parse_json(const std::string& text, const JsonFailure& fail);

// "line 3, column 14" of byte `offset` of `text` (columns count bytes, from 1).
std::string json_line_column(const std::string& text, std::size_t offset);

// A JsonFailure that throws InputError "<file>: bad JSON at line L, column C: <what>".
JsonFailure json_failure_in_file(const std::string& text, const std::string& file);

}  // namespace kiln
