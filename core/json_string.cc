#include "core/json_string.h"

namespace kiln {
namespace {

std::uint32_t hex4(const std::string& text, std::size_t& pos, const JsonFailure& fail) {
  if (pos + 4 > text.size()) fail(pos, "a \\u escape needs 4 hex digits");
  std::uint32_t v = 0;
  for (int k = 0; k < 4; ++k, ++pos) {
    const char c = text[pos];
    v <<= 4;
    if (c >= '0' && c <= '9') {
      v |= static_cast<std::uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      v |= static_cast<std::uint32_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      v |= static_cast<std::uint32_t>(c - 'A' + 10);
    } else {
      fail(pos, "a \\u escape needs 4 hex digits");
    }
  }
  return v;
}

char simple_escape(char e) {
  switch (e) {
    case '"':
    case '\\':
    case '/':
      return e;
    case 'b':
      return '\b';
    case 'f':
      return '\f';
    case 'n':
      return '\n';
    case 'r':
      return '\r';
    case 't':
      return '\t';
    default:
      return 0;
  }
}

}  // namespace

void append_utf8(std::uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string read_json_string(const std::string& text, std::size_t& pos, const JsonFailure& fail) {
  std::string s;
  while (true) {
    if (pos >= text.size()) fail(pos, "unterminated string");
    const char c = text[pos++];
    if (c == '"') return s;
    if (static_cast<unsigned char>(c) < 0x20) fail(pos - 1, "a control character inside a string");
    if (c != '\\') {
      s += c;
      continue;
    }
    if (pos >= text.size()) fail(pos, "unterminated escape");
    const char e = text[pos++];
    if (e != 'u') {
      const char plain = simple_escape(e);
      if (plain == 0) fail(pos - 1, std::string("unknown escape '\\") + e + "' in a string");
      s += plain;
      continue;
    }
    std::uint32_t cp = hex4(text, pos, fail);
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail(pos - 4, "a \\u escape of a lone low surrogate");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (pos + 2 > text.size() || text[pos] != '\\' || text[pos + 1] != 'u') {
        fail(pos, "a \\u escape of a high surrogate without its low surrogate");
      }
      pos += 2;
      const std::uint32_t low = hex4(text, pos, fail);
      if (low < 0xDC00 || low > 0xDFFF) {
        fail(pos - 4, "a \\u escape of a high surrogate without its low surrogate");
      }
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    append_utf8(cp, &s);
  }
}

}  // namespace kiln
