// core/json_value.h: every kind of value, numbers exact where they are integers, members in file
// order, and each kind of bad JSON refused with where it is.

#include <gtest/gtest.h>

#include "core/check.h"
#include "core/json_value.h"

namespace kiln {
namespace {

JsonValue parse(const std::string& text) {
  return parse_json(text, json_failure_in_file(text, "t.json"));
}

std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(JsonValue, ReadsEveryKind) {
  const std::string text =
      R"( {"s": "a\u00e9\n", "i": -42, "big": 12345678901234, "f": 2.5e-3, "t": true,
           "no": false, "n": null, "a": [1, [], {}], "o": {"z": 1, "a": 2}} )";
  const JsonValue v = parse(text);
  ASSERT_EQ(v.kind, JsonValue::Kind::Object);
  EXPECT_EQ(v.offset, 1u);
  EXPECT_EQ(v.names, (std::vector<std::string>{"s", "i", "big", "f", "t", "no", "n", "a", "o"}));
  EXPECT_EQ(v.find("s")->string, "a\xC3\xA9\n");
  EXPECT_TRUE(v.find("i")->is_integer);
  EXPECT_EQ(v.find("i")->integer, -42);
  EXPECT_EQ(v.find("big")->integer, 12345678901234);
  EXPECT_FALSE(v.find("f")->is_integer);
  EXPECT_DOUBLE_EQ(v.find("f")->number, 2.5e-3);
  EXPECT_TRUE(v.find("t")->boolean);
  EXPECT_EQ(v.find("no")->kind, JsonValue::Kind::Bool);
  EXPECT_FALSE(v.find("no")->boolean);
  EXPECT_EQ(v.find("n")->kind, JsonValue::Kind::Null);
  const JsonValue& a = *v.find("a");
  ASSERT_EQ(a.items.size(), 3u);
  EXPECT_EQ(a.items[1].kind, JsonValue::Kind::Array);
  EXPECT_EQ(a.items[2].kind, JsonValue::Kind::Object);
  EXPECT_EQ(v.find("o")->names, (std::vector<std::string>{"z", "a"}));  // file order
  EXPECT_EQ(v.find("o")->find("a")->integer, 2);
  EXPECT_EQ(text.substr(v.find("o")->offset, 8), R"({"z": 1,)");
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(a.find("x"), nullptr);  // not an object
  // An integer past int64 is still a number, not an exact integer.
  const JsonValue huge = parse("123456789012345678901");
  EXPECT_EQ(huge.kind, JsonValue::Kind::Number);
  EXPECT_FALSE(huge.is_integer);
  EXPECT_STREQ(json_kind_name(JsonValue::Kind::Array), "an array");
}

TEST(JsonValue, RefusesBadJsonNamingWhere) {
  const struct {
    std::string text, where_and_what;
  } cases[] = {
      {"{\"a\": 1,\n }", "line 2, column 2: expected a string (a member's name)"},
      {"{\"a\": 1, \"a\": 2}",
       "line 1, column 10: the name 'a' appears twice (names must be unique)"},
      {"[1 2]", "line 1, column 4: expected ',' or ']'"},
      {"[1] x", "line 1, column 5: text after the JSON value"},
      {"[01]", "line 1, column 2: a number with a leading zero"},
      {"[1.]", "line 1, column 4: no digits after a decimal point"},
      {"-", "line 1, column 2: a number without digits"},
      {"1e999", "line 1, column 1: a number out of range"},
      {"tru", "line 1, column 1: unexpected character 't'"},
      {"", "line 1, column 1: unexpected end of the text"},
      {"\"\\x\"", "line 1, column 3: unknown escape '\\x' in a string"},
      {std::string(65, '[') + std::string(65, ']'),
       "line 1, column 65: nesting too deep (more than 64 levels)"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(error_of(c.text), "t.json: bad JSON at " + c.where_and_what) << c.text;
  }
  EXPECT_EQ(parse(std::string(64, '[') + std::string(64, ']')).kind, JsonValue::Kind::Array);
  EXPECT_EQ(json_line_column("ab\ncd", 4), "line 2, column 2");
}

}  // namespace
}  // namespace kiln
