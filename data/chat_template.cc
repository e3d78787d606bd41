#include "data/chat_template.h"

#include <algorithm>

#include "core/check.h"
#include "data/byte_level_bpe.h"
#include "data/text_documents.h"
#include "data/unicode_text.h"

namespace kiln::data {
namespace {

const char* role_name(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
      return "system";
    case ChatRole::kUser:
      return "user";
    case ChatRole::kAssistant:
      return "assistant";
  }
  return "?";
}

ChatPiece text_piece(std::string text, bool trained = false) {
  return ChatPiece{std::move(text), -1, trained};
}

ChatPiece special_piece(int index, bool trained = false) {
  return ChatPiece{std::string(), index, trained};
}

// Python's str.isspace for one code point: White_Space plus the four separators U+001C..U+001F.
bool is_python_space(std::uint32_t cp) {
  return is_space(cp) || (cp >= 0x1C && cp <= 0x1F);
}

// A string member of a message, or InputError naming it.
const std::string& message_string(const JsonValue& message, const char* name,
                                  const std::string& where) {
  const JsonValue* value = message.find(name);
  if (value == nullptr) {
    throw InputError(where + " has no \"" + name +
                     "\" (a message is {\"role\": \"system\"|\"user\"|\"assistant\", "
                     "\"content\": \"...\"})");
  }
  if (value->kind != JsonValue::Kind::String) {
    throw InputError(where + "." + name + " is " + json_kind_name(value->kind) + ", not a string");
  }
  return value->string;
}

}  // namespace

std::string python_strip(const std::string& text) {
  std::size_t begin = text.size(), end = 0;
  std::uint32_t cp = 0;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_next(text, i, &cp);
    if (!is_python_space(cp)) {
      begin = std::min(begin, i);
      end = i + n;
    }
    i += n;
  }
  return begin < end ? text.substr(begin, end - begin) : std::string();
}

// ---------------------------------------------------------------------------------------------
// ChatML as Qwen2.5's tokenizer_config.json writes it (without tools):
//   {%- if messages[0]['role'] == 'system' %}
//       {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
//   {%- else %}
//       {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful
//            assistant.<|im_end|>\n' }}
//   {%- endif %}
//   then for every other message '<|im_start|>' + role + '\n' + content + '<|im_end|>' + '\n'

namespace {
enum ChatMlSpecial { kImStart, kImEnd };
constexpr const char* kQwenSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
}  // namespace

std::vector<std::string> ChatMlTemplate::special_tokens() const {
  return {"<|im_start|>", "<|im_end|>"};
}

void ChatMlTemplate::render(const std::vector<ChatMessage>& messages,
                            std::vector<ChatPiece>* pieces) const {
  pieces->clear();
  const auto turn = [&](const char* role, const std::string& content, bool trained) {
    pieces->push_back(special_piece(kImStart));
    pieces->push_back(text_piece(std::string(role) + "\n"));
    pieces->push_back(text_piece(content, trained));
    pieces->push_back(special_piece(kImEnd, trained));
    pieces->push_back(text_piece("\n"));
  };
  const bool has_system = !messages.empty() && messages[0].role == ChatRole::kSystem;
  if (!has_system) turn("system", kQwenSystem, false);
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    turn(role_name(m.role), m.content, m.role == ChatRole::kAssistant);
  }
}

void ChatMlTemplate::generation_prompt(std::vector<ChatPiece>* pieces) const {
  pieces->push_back(special_piece(kImStart));
  pieces->push_back(text_piece("assistant\n"));
}

std::string ChatMlTemplate::end_of_turn() const {
  return "<|im_end|>";
}

// ---------------------------------------------------------------------------------------------
// Llama 3.1's tokenizer_config.json template (without tools): bos_token; a system turn that
// always holds the knowledge and today's dates (date_string's default, "26 Jul 2024") before the
// first message's content when it is a system message (trimmed); then
// '<|start_header_id|>' + role + '<|end_header_id|>\n\n' + content | trim + '<|eot_id|>'.

namespace {
enum Llama3Special { kBeginOfText, kStartHeader, kEndHeader, kEotId };
constexpr const char* kLlama3Dates =
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";
}  // namespace

std::vector<std::string> Llama3Template::special_tokens() const {
  return {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
}

void Llama3Template::render(const std::vector<ChatMessage>& messages,
                            std::vector<ChatPiece>* pieces) const {
  pieces->clear();
  const auto header = [&](const char* role) {
    pieces->push_back(special_piece(kStartHeader));
    pieces->push_back(text_piece(role));
    pieces->push_back(special_piece(kEndHeader));
    pieces->push_back(text_piece("\n\n"));
  };
  pieces->push_back(special_piece(kBeginOfText));
  const bool has_system = !messages.empty() && messages[0].role == ChatRole::kSystem;
  header("system");
  pieces->push_back(text_piece(kLlama3Dates));
  if (has_system) pieces->push_back(text_piece(python_strip(messages[0].content)));
  pieces->push_back(special_piece(kEotId));
  for (std::size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool trained = m.role == ChatRole::kAssistant;
    header(role_name(m.role));
    pieces->push_back(text_piece(python_strip(m.content), trained));
    pieces->push_back(special_piece(kEotId, trained));
  }
}

void Llama3Template::generation_prompt(std::vector<ChatPiece>* pieces) const {
  pieces->push_back(special_piece(kStartHeader));
  pieces->push_back(text_piece("assistant"));
  pieces->push_back(special_piece(kEndHeader));
  pieces->push_back(text_piece("\n\n"));
}

std::string Llama3Template::end_of_turn() const {
  return "<|eot_id|>";
}

// ---------------------------------------------------------------------------------------------

std::unique_ptr<ChatTemplate> make_chat_template(const std::string& name,
                                                 const HfTokenizer& tokenizer) {
  if (name == "chatml") return std::make_unique<ChatMlTemplate>();
  if (name == "llama3") return std::make_unique<Llama3Template>();
  if (!name.empty()) {
    throw InputError("--chat-template '" + name +
                     "': unknown; the known templates are chatml (Qwen2.5's) and llama3 "
                     "(Llama 3.1's)");
  }
  if (tokenizer.token_to_id("<|im_start|>") >= 0) return std::make_unique<ChatMlTemplate>();
  if (tokenizer.token_to_id("<|start_header_id|>") >= 0) return std::make_unique<Llama3Template>();
  throw InputError(tokenizer.source() +
                   ": the tokenizer has neither <|im_start|> (ChatML, Qwen2) nor "
                   "<|start_header_id|> (Llama 3) to pick a chat template by: pass "
                   "--chat-template chatml|llama3");
}

std::vector<ChatMessage> parse_conversation(const JsonValue& object, const std::string& where,
                                            const std::string& field) {
  const JsonValue& list = object.items[document_field(
      object, where, field,
      "a chat line is {\"" + field + "\": [{\"role\": \"user\", \"content\": \"...\"}, ...]}")];
  if (list.kind != JsonValue::Kind::Array) {
    throw InputError(where + ": field '" + field + "' is " + json_kind_name(list.kind) +
                     ", not an array of messages");
  }
  if (list.items.empty()) throw InputError(where + ": field '" + field + "' holds no message");
  std::vector<ChatMessage> messages;
  bool assistant = false;
  for (std::size_t i = 0; i < list.items.size(); ++i) {
    const JsonValue& item = list.items[i];
    const std::string at = where + ": " + field + "[" + std::to_string(i) + "]";
    if (item.kind != JsonValue::Kind::Object) {
      throw InputError(at + " is " + json_kind_name(item.kind) +
                       ", not an object with role and content");
    }
    if (item.find("tool_calls") != nullptr) {
      throw InputError(at + " has tool_calls, which kiln tokenize --chat does not render");
    }
    const std::string& role = message_string(item, "role", at);
    ChatMessage m;
    if (role == "system") {
      m.role = ChatRole::kSystem;
    } else if (role == "user") {
      m.role = ChatRole::kUser;
    } else if (role == "assistant") {
      m.role = ChatRole::kAssistant;
      assistant = true;
    } else {
      throw InputError(at + ".role '" + role +
                       "': unknown (kiln tokenize --chat knows system, user and assistant)");
    }
    m.content = message_string(item, "content", at);
    messages.push_back(std::move(m));
  }
  if (!assistant) {
    throw InputError(where +
                     ": the conversation has no assistant message, so none of it would be "
                     "trained");
  }
  return messages;
}

// ---------------------------------------------------------------------------------------------

namespace {

// The bytes a token stands for: its byte symbols decoded, or (an added token whose characters
// are not byte symbols) its own UTF-8, as HfTokenizer::decode writes it.
std::uint32_t token_byte_length(const HfTokenizer& tokenizer, std::int64_t id) {
  const std::string* token = tokenizer.id_to_token(id);
  if (token == nullptr) return 0;
  std::string bytes;
  return static_cast<std::uint32_t>(byte_symbols_to_bytes(*token, &bytes) ? bytes.size()
                                                                          : token->size());
}

}  // namespace

ChatEncoder::ChatEncoder(const HfTokenizer& tokenizer, const ChatTemplate& chat_template)
    : tokenizer_(tokenizer), template_(chat_template) {
  for (const std::string& token : template_.special_tokens()) {
    const std::int64_t id = tokenizer.token_to_id(token);
    if (id < 0) {
      throw InputError(tokenizer.source() + ": the tokenizer has no " + token + ", which the " +
                       template_.name() +
                       " chat template writes (choose the template of this "
                       "model with --chat-template)");
    }
    special_ids_.push_back(id);
  }
  token_bytes_.resize(static_cast<std::size_t>(tokenizer.vocab_size()));
  for (std::size_t id = 0; id < token_bytes_.size(); ++id) {
    token_bytes_[id] = token_byte_length(tokenizer, static_cast<std::int64_t>(id));
  }
}

std::int64_t ChatEncoder::end_of_turn_id() const {
  const std::vector<std::string> specials = template_.special_tokens();
  const auto it = std::find(specials.begin(), specials.end(), template_.end_of_turn());
  KILN_CHECK(it != specials.end(), "chat template " + template_.name() + ": no end-of-turn token");
  return special_ids_[static_cast<std::size_t>(it - specials.begin())];
}

void ChatEncoder::encode(const std::vector<ChatMessage>& messages, HfTokenizer::EncodeCache* cache,
                         std::vector<std::int64_t>* ids, std::vector<std::uint8_t>* mask,
                         bool generation_prompt) const {
  HfTokenizer::EncodeOptions options;
  options.add_special_tokens = false;   // the template writes its own
  options.split_special_tokens = true;  // content cannot forge a turn
  std::vector<ChatPiece> pieces;
  template_.render(messages, &pieces);
  if (generation_prompt) template_.generation_prompt(&pieces);
  std::string text;  // the text since the last special token
  std::vector<std::pair<std::size_t, std::size_t>> trained;  // byte ranges of `text`, in order
  const auto encode_text = [&] {
    if (text.empty()) return;
    const std::size_t first = ids->size();
    tokenizer_.encode(text, options, cache, ids);
    const auto bytes_of = [&](std::int64_t id) {
      return id >= 0 && id < static_cast<std::int64_t>(token_bytes_.size())
                 ? token_bytes_[static_cast<std::size_t>(id)]
                 : 0u;
    };
    // Each token's bytes [begin, end) within `text`; trained when they meet a trained range. The
    // untrained text before a trained piece is the template's ASCII, which normalization keeps,
    // so the offsets there are exact.
    std::size_t begin = 0, range = 0;
    for (std::size_t i = first; i < ids->size(); ++i) {
      const std::size_t end = begin + bytes_of((*ids)[i]);
      while (range < trained.size() && trained[range].second <= begin) ++range;
      const bool on = range < trained.size() && trained[range].first < end;
      mask->push_back(on ? 1 : 0);
      begin = end;
    }
    text.clear();
    trained.clear();
  };
  for (const ChatPiece& piece : pieces) {
    if (piece.special >= 0) {
      encode_text();
      ids->push_back(special_ids_[static_cast<std::size_t>(piece.special)]);
      mask->push_back(piece.trained ? 1 : 0);
      continue;
    }
    if (piece.trained && !piece.text.empty()) {
      trained.emplace_back(text.size(), text.size() + piece.text.size());
    }
    text += piece.text;
  }
  encode_text();
}

}  // namespace kiln::data
