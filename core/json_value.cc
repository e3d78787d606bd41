#include "core/json_value.h"

#include <charconv>
#include <unordered_set>
#include <utility>

#include "core/check.h"

namespace kiln {
namespace {

constexpr int kMaxDepth = 64;

class JsonParser {
 public:
  JsonParser(const std::string& text, const JsonFailure& fail) : text_(text), fail_(fail) {}

  JsonValue document() {
    JsonValue v = value();
    skip_space();
    if (pos_ != text_.size()) fail_at(pos_, "text after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail_at(std::size_t at, const std::string& what) const {
    fail_(at, what);
    throw InputError("bad JSON at byte " + std::to_string(at) + ": " + what);  // `fail_` returned
  }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t')) {
      ++pos_;
    }
  }
  char peek() {
    skip_space();
    if (pos_ >= text_.size()) fail_at(pos_, "unexpected end of the text");
    return text_[pos_];
  }
  void expect(char c, const char* what) {
    if (peek() != c) fail_at(pos_, std::string("expected ") + what);
    ++pos_;
  }
  std::string string_literal(const char* what) {
    expect('"', what);
    return read_json_string(text_, pos_,
                            [this](std::size_t at, const std::string& why) { fail_at(at, why); });
  }

  JsonValue value() {
    if (++depth_ > kMaxDepth) fail_at(pos_, "nesting too deep (more than 64 levels)");
    JsonValue v;
    const char c = peek();
    v.offset = pos_;
    if (c == '{') {
      v.kind = JsonValue::Kind::Object;
      object(&v);
    } else if (c == '[') {
      v.kind = JsonValue::Kind::Array;
      ++pos_;
      if (peek() == ']') {
        ++pos_;
      } else {
        do {
          v.items.push_back(value());
        } while (more(']'));
      }
    } else if (c == '"') {
      v.kind = JsonValue::Kind::String;
      v.string = string_literal("a string");
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = JsonValue::Kind::Number;
      number(&v);
    } else if (literal("true")) {
      v.kind = JsonValue::Kind::Bool;
      v.boolean = true;
    } else if (literal("false")) {
      v.kind = JsonValue::Kind::Bool;
    } else if (!literal("null")) {
      fail_at(pos_, std::string("unexpected character '") + c + "'");
    }
    --depth_;
    return v;
  }

  // After an element: true after ',', false after `close`.
  bool more(char close) {
    const char c = peek();
    ++pos_;
    if (c == ',') return true;
    if (c != close) fail_at(pos_ - 1, std::string("expected ',' or '") + close + "'");
    return false;
  }

  void object(JsonValue* v) {
    ++pos_;
    if (peek() == '}') {
      ++pos_;
      return;
    }
    std::unordered_set<std::string> seen;
    do {
      skip_space();
      const std::size_t name_at = pos_;
      std::string name = string_literal("a string (a member's name)");
      if (!seen.insert(name).second) {
        fail_at(name_at, "the name '" + name + "' appears twice (names must be unique)");
      }
      expect(':', "':'");
      v->items.push_back(value());
      v->names.push_back(std::move(name));
    } while (more('}'));
  }

  bool literal(const char* word) {
    const std::string w(word);
    if (text_.compare(pos_, w.size(), w) != 0) return false;
    pos_ += w.size();
    return true;
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  void number(JsonValue* v) {
    const std::size_t start = pos_;
    const auto digits = [&] {
      const std::size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (text_[pos_] == '-') ++pos_;
    const std::size_t int_at = pos_;
    if (digits() == 0) fail_at(pos_, "a number without digits");
    if (text_[int_at] == '0' && pos_ - int_at > 1) fail_at(int_at, "a number with a leading zero");
    bool integral = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      integral = false;
      if (digits() == 0) fail_at(pos_, "no digits after a decimal point");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      integral = false;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (digits() == 0) fail_at(pos_, "no digits in an exponent");
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (integral) {
      const auto r = std::from_chars(first, last, v->integer);
      v->is_integer = r.ec == std::errc() && r.ptr == last;
    }
    const auto r = std::from_chars(first, last, v->number);
    if (r.ec != std::errc() || r.ptr != last) fail_at(start, "a number out of range");
  }

  const std::string& text_;
  const JsonFailure& fail_;
  std::size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

const JsonValue* JsonValue::find(const std::string& name) const {
  if (kind != Kind::Object) return nullptr;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return &items[i];
  }
  return nullptr;
}

const char* json_kind_name(JsonValue::Kind kind) {
  static const char* const names[] = {"null",     "a boolean", "a number",
                                      "a string", "an array",  "an object"};
  return names[static_cast<int>(kind)];
}

JsonValue parse_json(const std::string& text, const JsonFailure& fail) {
  return JsonParser(text, fail).document();
}

std::string json_line_column(const std::string& text, std::size_t offset) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
}

JsonFailure json_failure_in_file(const std::string& text, const std::string& file) {
  return [&text, file](std::size_t at, const std::string& what) {
    throw InputError(file + ": bad JSON at " + json_line_column(text, at) + ": " + what);
  };
}

}  // namespace kiln
