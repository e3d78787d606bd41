#pragma once
// Chat templates in C++, for `kiln tokenize --chat` (docs/data.md, "Chat data"): a conversation
// ({"messages": [{"role", "content"}, ...]}, the format of TRL and LLaMA-Factory) rendered as the
// model's jinja chat template renders it (transformers' apply_chat_template with
// add_generation_prompt=False), then encoded with its tokenizer into ids and a loss mask.
//
//   ChatMlTemplate  "chatml": Qwen2.5's template: <|im_start|>role\ncontent<|im_end|>\n per
//                   message, and Qwen2.5's system message when the conversation has none
//   Llama3Template  "llama3": Llama 3.1's template: <|begin_of_text|>, a system turn that always
//                   holds "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n",
//                   then <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>, with the
//                   content trimmed as jinja's trim (Python's str.strip) does
//
// Trained (mask 1): the assistant's content and its end-of-turn token (<|im_end|>, <|eot_id|>),
// as TRL's assistant_only_loss marks them; everything else (system and user turns, the assistant's
// header, the newline after <|im_end|>) is 0. Each template is a small class; the command picks
// one by name or from the tokenizer's tokens (make_chat_template), no registry.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/json_value.h"
#include "data/hf_tokenizer.h"

namespace kiln::data {

enum class ChatRole { kSystem, kUser, kAssistant };

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
};

// A piece of a rendered conversation: text, or one of the template's special tokens.
struct ChatPiece {
  std::string text;      // empty for a special token
  int special = -1;      // index into ChatTemplate::special_tokens(), or -1 for text
  bool trained = false;  // in the loss: the assistant's content and end-of-turn token
};

class ChatTemplate {
 public:
  virtual ~ChatTemplate() = default;
  virtual std::string name() const = 0;
  // The special tokens the rendering uses, as the tokenizer spells them.
  virtual std::vector<std::string> special_tokens() const = 0;
  // The conversation as pieces (cleared first), in order: their texts, with the special tokens
  // spelled out, are the jinja template's rendering.
  virtual void render(const std::vector<ChatMessage>& messages,
                      std::vector<ChatPiece>* pieces) const = 0;
  // What add_generation_prompt=True appends: the assistant's header, which a reply follows.
  virtual void generation_prompt(std::vector<ChatPiece>* pieces) const = 0;
  // The token that ends a turn (a reply ends there): as the tokenizer spells it.
  virtual std::string end_of_turn() const = 0;
};

class ChatMlTemplate : public ChatTemplate {
 public:
  std::string name() const override { return "chatml"; }
  std::vector<std::string> special_tokens() const override;
  void render(const std::vector<ChatMessage>& messages,
              std::vector<ChatPiece>* pieces) const override;
  void generation_prompt(std::vector<ChatPiece>* pieces) const override;
  std::string end_of_turn() const override;
};

class Llama3Template : public ChatTemplate {
 public:
  std::string name() const override { return "llama3"; }
  std::vector<std::string> special_tokens() const override;
  void render(const std::vector<ChatMessage>& messages,
              std::vector<ChatPiece>* pieces) const override;
  void generation_prompt(std::vector<ChatPiece>* pieces) const override;
  std::string end_of_turn() const override;
};

// The template called `name` ("chatml" or "llama3"); an empty name picks it from the tokenizer:
// <|im_start|> -> chatml, else <|start_header_id|> -> llama3. InputError for an unknown name
// (listing the known ones) and for a tokenizer with neither token (naming its file and asking
// for --chat-template).
std::unique_ptr<ChatTemplate> make_chat_template(const std::string& name,
                                                 const HfTokenizer& tokenizer);

// The conversation of a .jsonl line's object: its `field` (normally "messages"), an array of
// objects with a string "role" (system, user or assistant) and a string "content"; other members
// are ignored, except "tool_calls", which the templates here do not render. InputError
// "WHERE: ..." for a missing or non-array field, an empty array, a message that is not an
// object, lacks role or content, has a role or content that is not a string, an unknown role, or
// a conversation without an assistant message (nothing in it would be trained).
std::vector<ChatMessage> parse_conversation(const JsonValue& object, const std::string& where,
                                            const std::string& field);

// Python's str.strip(), which jinja's trim filter is: `text` without the whitespace (str.isspace:
// Unicode White_Space and U+001C..U+001F) at either end.
std::string python_strip(const std::string& text);

// A template's pieces into ids and a loss mask with one tokenizer. The text between two special
// tokens is encoded in one piece, as the tokenizer splits the whole rendering at its added tokens,
// so the ids are those of encoding the rendered text; a token that holds any byte of a trained
// piece is trained (TRL's char_to_token marking: a token that joins the header's last newline
// and the content's first one is trained). Text that spells a special token is encoded as text
// (split_special_tokens, as kiln tokenize does for documents): content cannot forge a turn.
class ChatEncoder {
 public:
  // InputError naming the tokenizer's file when it lacks a special token the template uses.
  ChatEncoder(const HfTokenizer& tokenizer, const ChatTemplate& chat_template);

  // The conversation's ids and mask (0 or 1) appended to `ids` and `mask`. InputError for a
  // byte the vocabulary lacks.
  // With `generation_prompt`, the assistant's header follows (a prompt for a reply, mask 0).
  void encode(const std::vector<ChatMessage>& messages, HfTokenizer::EncodeCache* cache,
              std::vector<std::int64_t>* ids, std::vector<std::uint8_t>* mask,
              bool generation_prompt = false) const;
  // The id of the template's end-of-turn token in this tokenizer.
  std::int64_t end_of_turn_id() const;

  const ChatTemplate& chat_template() const { return template_; }

 private:
  const HfTokenizer& tokenizer_;
  const ChatTemplate& template_;
  std::vector<std::int64_t> special_ids_;   // beside template_.special_tokens()
  std::vector<std::uint32_t> token_bytes_;  // by id: the bytes each token stands for
};

}  // namespace kiln::data
