// hf_tokenizer_ids TOKENIZER_JSON REQUESTS_JSONL: answers hf_tokenizer_check.py's requests, one
// JSON object a line, with HfTokenizer (data/hf_tokenizer.h), one JSON line each on stdout:
//   {"encode": TEXT}        -> {"ids": [...], "ids_plain": [...], "decoded": S, "decoded_skip": S}
//                              (add_special_tokens true / false; decode of "ids" keeping / skipping
//                              special tokens)
//   {"decode": [IDS]}       -> {"text": S, "text_skip": S}
//   {"nfc": TEXT}           -> {"nfc": S}
//   {"token_to_id": TOKEN}  -> {"id": N}  (-1 for none)
//   {"info": true}          -> {"vocab_size": N, "end_of_text_id": N, "stop_token_ids": [...]}
// An InputError (loading the tokenizer included) is printed on stderr, exit code 2.

#include <cstdio>
#include <iostream>
#include <sstream>

#include "core/check.h"
#include "core/file_kind.h"
#include "core/json_value.h"
#include "core/json_writer.h"
#include "data/hf_tokenizer.h"
#include "data/unicode_text.h"

namespace {

using kiln::JsonValue;
using kiln::JsonWriter;

void ids_field(JsonWriter& w, const char* name, const std::vector<std::int64_t>& ids) {
  w.key(name);
  w.begin_array();
  for (std::int64_t id : ids) w.value(static_cast<long long>(id));
  w.end_array();
}

std::string answer(const kiln::data::HfTokenizer& t, const JsonValue& request) {
  JsonWriter w;
  w.begin_object();
  if (const JsonValue* text = request.find("encode")) {
    const std::vector<std::int64_t> ids = t.encode(text->string, true);
    ids_field(w, "ids", ids);
    ids_field(w, "ids_plain", t.encode(text->string, false));
    w.field("decoded", t.decode(ids, false));
    w.field("decoded_skip", t.decode(ids, true));
  } else if (const JsonValue* list = request.find("decode")) {
    std::vector<std::int64_t> ids;
    for (const JsonValue& id : list->items) ids.push_back(id.integer);
    w.field("text", t.decode(ids, false));
    w.field("text_skip", t.decode(ids, true));
  } else if (const JsonValue* nfc_text = request.find("nfc")) {
    w.field("nfc", kiln::data::nfc(nfc_text->string));
  } else if (const JsonValue* token = request.find("token_to_id")) {
    w.field("id", static_cast<long long>(t.token_to_id(token->string)));
  } else {
    w.field("vocab_size", static_cast<long long>(t.vocab_size()));
    w.field("end_of_text_id", static_cast<long long>(t.end_of_text_id()));
    ids_field(w, "stop_token_ids", t.stop_token_ids());
  }
  w.end_object();
  return w.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: hf_tokenizer_ids TOKENIZER_JSON REQUESTS_JSONL\n");
    return 1;
  }
  try {
    const kiln::data::HfTokenizer t = kiln::data::HfTokenizer::load(argv[1]);
    const std::string requests = kiln::read_regular_file(argv[2], "the requests");
    std::istringstream lines(requests);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      const JsonValue request = kiln::parse_json(line, kiln::json_failure_in_file(line, argv[2]));
      std::cout << answer(t, request) << "\n";
    }
  } catch (const kiln::InputError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return 0;
}
