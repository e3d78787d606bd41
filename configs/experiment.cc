#include "configs/experiment.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/reflection.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <utility>

namespace kiln::config {
namespace {

namespace pb = google::protobuf;
using pb::Descriptor;
using pb::FieldDescriptor;
using pb::Message;
using pb::Reflection;

// ---------------------------------------------------------------------------------------
// Small string helpers.

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += separator;
    out += items[i];
  }
  return out;
}

// Shortest textual form that round-trips ("0.001", "65536", "1e-08").
std::string number_text(double value) {
  std::ostringstream out;
  out.precision(std::numeric_limits<double>::max_digits10);
  out << value;
  std::string text = out.str();
  for (int precision = 1; precision <= 17; ++precision) {
    std::ostringstream shorter;
    shorter.precision(precision);
    shorter << value;
    if (std::strtod(shorter.str().c_str(), nullptr) == value) return shorter.str();
  }
  return text;
}

// The same for a float, so 0.1f prints as "0.1" and not as its double expansion.
std::string number_text(float value) {
  for (int precision = 1; precision <= 9; ++precision) {
    std::ostringstream shorter;
    shorter.precision(precision);
    shorter << value;
    if (std::strtof(shorter.str().c_str(), nullptr) == value) return shorter.str();
  }
  return number_text(static_cast<double>(value));
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1u : 0u)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::vector<std::string> field_names(const Descriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->field_count(); ++i) names.push_back(type->field(i)->name());
  return names;
}

// "fields of optimizer: kind, lr, ... (did you mean lr?)"
std::string describe_fields(const Descriptor* type, const std::string& level,
                            const std::string& unknown_name) {
  std::string text = "fields of " + (level.empty() ? std::string("the experiment") : level) + ": " +
                     join(field_names(type), ", ");
  std::string best;
  std::size_t best_distance = 3;  // suggest only near misses
  for (const std::string& name : field_names(type)) {
    const std::size_t distance = edit_distance(lower(unknown_name), name);
    if (distance < best_distance) {
      best_distance = distance;
      best = name;
    }
  }
  if (!best.empty()) text += " (did you mean " + best + "?)";
  return text;
}

std::string enum_names(const pb::EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) names.push_back(type->value(i)->name());
  return join(names, ", ");
}

std::string read_file(const std::string& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw ConfigError(path + ": cannot read the experiment: it is a directory, not a .pbtxt file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const bool exists = std::filesystem::exists(path, error);
    throw ConfigError(path + ": cannot read the experiment: " +
                      (exists ? "permission denied or unreadable" : "no such file"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw ConfigError(path + ": cannot read the experiment: read error");
  return text.str();
}

// ---------------------------------------------------------------------------------------
// Field paths: "optimizer.param_groups[1].lr_multiplier".

struct PathSegment {
  std::string name;
  int index = -1;  // -1: no [i]
};

// Splits a dotted path; returns false with `problem` set on bad syntax.
bool split_path(const std::string& path, std::vector<PathSegment>& segments, std::string& problem) {
  segments.clear();
  std::stringstream stream(path);
  std::string part;
  while (std::getline(stream, part, '.')) {
    PathSegment segment;
    const auto bracket = part.find('[');
    segment.name = part.substr(0, bracket);
    if (bracket != std::string::npos) {
      const auto close = part.find(']', bracket);
      const std::string digits =
          close == std::string::npos ? "" : part.substr(bracket + 1, close - bracket - 1);
      if (close != part.size() - 1 || digits.empty() ||
          !std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c); })) {
        problem = "bad index in '" + part + "' (write name[N] with N >= 0)";
        return false;
      }
      segment.index = std::stoi(digits);
    }
    if (segment.name.empty()) {
      problem = "empty field name in the path";
      return false;
    }
    segments.push_back(segment);
  }
  if (segments.empty() || path.back() == '.') {
    problem = "empty field path";
    return false;
  }
  return true;
}

std::string path_prefix(const std::vector<PathSegment>& segments, std::size_t count) {
  std::string text;
  for (std::size_t i = 0; i < count; ++i) {
    if (i) text += ".";
    text += segments[i].name;
    if (segments[i].index >= 0) text += "[" + std::to_string(segments[i].index) + "]";
  }
  return text;
}

// ---------------------------------------------------------------------------------------
// Text-format parse errors, with the dotted path of the enclosing message.

class FirstErrorCollector : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (!has_error) {
      has_error = true;
      this->line = line;
      this->column = column;
      this->message = message;
    }
  }
  void AddWarning(int, pb::io::ColumnNumber, const std::string&) override {}

  bool has_error = false;
  int line = -1;
  int column = -1;
  std::string message;
};

// Where a parse error sits in text-format input: the field names of the messages open at
// (line, column), outermost first, found by following braces, and the field whose value
// starts there ("" if none). Turns protobuf's bare "field x" into a dotted path.
struct TextPosition {
  std::vector<std::string> open_messages;
  std::string value_of;
  int previous_token_line = -1;  // the last token before the position
  int previous_token_column = -1;
};

TextPosition position_in_text(const std::string& text, int line, int column) {
  pb::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  FirstErrorCollector ignored;
  pb::io::Tokenizer tokenizer(&input, &ignored);
  tokenizer.set_comment_style(pb::io::Tokenizer::SH_COMMENT_STYLE);
  TextPosition position;
  std::vector<std::string> open_lists;  // one entry per open '['
  std::string last_identifier;
  std::string previous_symbol;
  while (tokenizer.Next()) {
    const auto& token = tokenizer.current();
    if (token.line > line || (token.line == line && token.column >= column)) break;
    position.previous_token_line = token.line;
    position.previous_token_column = token.column;
    if (token.type == pb::io::Tokenizer::TYPE_IDENTIFIER) {
      last_identifier = token.text;
      previous_symbol.clear();
      continue;
    }
    if (token.type != pb::io::Tokenizer::TYPE_SYMBOL) {
      previous_symbol.clear();
      continue;
    }
    const bool in_list = (previous_symbol == "[" || previous_symbol == ",") && !open_lists.empty();
    if (token.text == "{" || token.text == "<") {
      position.open_messages.push_back(in_list ? open_lists.back() : last_identifier);
    } else if ((token.text == "}" || token.text == ">") && !position.open_messages.empty()) {
      position.open_messages.pop_back();
    } else if (token.text == "[") {
      open_lists.push_back(last_identifier);
    } else if (token.text == "]" && !open_lists.empty()) {
      open_lists.pop_back();
    }
    previous_symbol = token.text;
  }
  if (previous_symbol == ":") {
    position.value_of = last_identifier;
  } else if ((previous_symbol == "[" || previous_symbol == ",") && !open_lists.empty()) {
    position.value_of = open_lists.back();
  }
  return position;
}

// Resolves field names from the experiment root; stops at the first name that is not a
// message field. Returns the deepest message type reached.
const Descriptor* descend(const std::vector<std::string>& names, std::string& dotted) {
  const Descriptor* type = Experiment::descriptor();
  dotted.clear();
  for (const std::string& name : names) {
    const FieldDescriptor* field = type->FindFieldByName(name);
    if (!field || field->type() != FieldDescriptor::TYPE_MESSAGE) break;
    dotted += (dotted.empty() ? "" : ".") + name;
    type = field->message_type();
  }
  return type;
}

// The text between the first pair of double quotes after `marker`, or "".
std::string quoted_after(const std::string& message, const std::string& marker) {
  const auto at = message.find(marker);
  if (at == std::string::npos) return "";
  const auto open = message.find('"', at + marker.size());
  if (open == std::string::npos) return "";
  const auto close = message.find('"', open + 1);
  if (close == std::string::npos) return "";
  return message.substr(open + 1, close - open - 1);
}

// One message out of protobuf's parse error: FILE:LINE:COLUMN: path: problem; allowed.
std::string explain_parse_error(const std::string& text, const std::string& source_name,
                                const FirstErrorCollector& error) {
  const TextPosition position = position_in_text(text, error.line, error.column);
  // These errors are raised after protobuf consumed the offending name or value, at the
  // token that follows it; point at the name or value itself.
  const char* raised_after_token[] = {"has no field named", "Unknown enumeration value",
                                      "specified multiple times", "another member of oneof",
                                      "Invalid value for boolean"};
  int line = error.line;
  int column = error.column;
  for (const char* marker : raised_after_token) {
    if (error.message.find(marker) != std::string::npos && position.previous_token_line >= 0) {
      line = position.previous_token_line;
      column = position.previous_token_column;
    }
  }
  const std::string where =
      source_name + ":" + std::to_string(line + 1) + ":" + std::to_string(column + 1);
  std::string level;
  const Descriptor* type = descend(position.open_messages, level);
  const auto qualify = [&](const std::string& name) {
    return level.empty() ? name : level + "." + name;
  };

  const std::string unknown_field = quoted_after(error.message, "has no field named");
  if (!unknown_field.empty()) {
    return where + ": " + qualify(unknown_field) + ": no such field; " +
           describe_fields(type, level, unknown_field);
  }
  const std::string bad_enum = quoted_after(error.message, "Unknown enumeration value of");
  if (!bad_enum.empty()) {
    const std::string name = quoted_after(error.message, "for field");
    const FieldDescriptor* field = type->FindFieldByName(name);
    std::string text_out = where + ": " + qualify(name) + ": unknown value " + bad_enum;
    if (field && field->enum_type()) text_out += "; allowed: " + enum_names(field->enum_type());
    return text_out;
  }
  // Other errors name the field (or none); keep protobuf's wording and add the path.
  std::string field_name = quoted_after(lower(error.message), "field");
  if (field_name.empty()) field_name = position.value_of;
  std::string context = field_name.empty() ? (level.empty() ? "" : " (in " + level + ")")
                                           : " (field " + qualify(field_name) + ")";
  std::string message = error.message;
  if (message.size() >= 5 && message.compare(message.size() - 5, 5, "got: ") == 0) {
    message += "the end of the file";
  }
  return where + ": " + message + context;
}

bool parse_text(const std::string& text, Message& out, FirstErrorCollector& errors,
                pb::TextFormat::ParseInfoTree* locations) {
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.AllowUnknownField(false);
  if (locations) parser.WriteLocationsTo(locations);
  return parser.ParseFromString(text, &out) && !errors.has_error;
}

// ---------------------------------------------------------------------------------------
// Overrides through reflection.

bool parse_int(const std::string& text, long long& value) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  value = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && end == text.c_str() + text.size();
}

bool parse_uint(const std::string& text, unsigned long long& value) {
  if (text.empty() || text[0] == '-') return false;
  errno = 0;
  char* end = nullptr;
  value = std::strtoull(text.c_str(), &end, 10);
  return errno == 0 && end == text.c_str() + text.size();
}

bool parse_double(const std::string& text, double& value) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return errno == 0 && end == text.c_str() + text.size() && std::isfinite(value);
}

bool parse_bool(const std::string& text, bool& value) {
  const std::string word = lower(text);
  if (word == "true" || word == "1" || word == "yes" || word == "on") {
    value = true;
    return true;
  }
  if (word == "false" || word == "0" || word == "no" || word == "off") {
    value = false;
    return true;
  }
  return false;
}

std::string unquote(const std::string& text) {
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
      text.back() == text.front()) {
    return text.substr(1, text.size() - 2);
  }
  return text;
}

std::string type_description(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return "an integer (32-bit)";
    case FieldDescriptor::CPPTYPE_INT64:
      return "an integer";
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return "a non-negative integer";
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return "a finite number";
    case FieldDescriptor::CPPTYPE_BOOL:
      return "true or false";
    case FieldDescriptor::CPPTYPE_ENUM:
      return "one of " + enum_names(field->enum_type());
    case FieldDescriptor::CPPTYPE_STRING:
      return "a string";
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return "a message";
  }
  return "a value";
}

// Sets one scalar (element `index` of a repeated field, index == size appends; -1 for a
// singular field). Returns false when `text` is not a value of the field's type.
bool set_scalar(Message& message, const FieldDescriptor* field, int index,
                const std::string& text) {
  const Reflection* reflection = message.GetReflection();
  const bool repeated = field->is_repeated();
  const bool append = repeated && index == reflection->FieldSize(message, field);
  long long int_value = 0;
  unsigned long long uint_value = 0;
  double double_value = 0;
  bool bool_value = false;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32: {
      if (!parse_int(text, int_value) || int_value < std::numeric_limits<std::int32_t>::min() ||
          int_value > std::numeric_limits<std::int32_t>::max()) {
        return false;
      }
      const auto value = static_cast<std::int32_t>(int_value);
      if (!repeated)
        reflection->SetInt32(&message, field, value);
      else if (append)
        reflection->AddInt32(&message, field, value);
      else
        reflection->SetRepeatedInt32(&message, field, index, value);
      return true;
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      if (!parse_int(text, int_value)) return false;
      const auto value = static_cast<std::int64_t>(int_value);
      if (!repeated)
        reflection->SetInt64(&message, field, value);
      else if (append)
        reflection->AddInt64(&message, field, value);
      else
        reflection->SetRepeatedInt64(&message, field, index, value);
      return true;
    }
    case FieldDescriptor::CPPTYPE_UINT32: {
      if (!parse_uint(text, uint_value) || uint_value > std::numeric_limits<std::uint32_t>::max()) {
        return false;
      }
      const auto value = static_cast<std::uint32_t>(uint_value);
      if (!repeated)
        reflection->SetUInt32(&message, field, value);
      else if (append)
        reflection->AddUInt32(&message, field, value);
      else
        reflection->SetRepeatedUInt32(&message, field, index, value);
      return true;
    }
    case FieldDescriptor::CPPTYPE_UINT64: {
      if (!parse_uint(text, uint_value)) return false;
      const auto value = static_cast<std::uint64_t>(uint_value);
      if (!repeated)
        reflection->SetUInt64(&message, field, value);
      else if (append)
        reflection->AddUInt64(&message, field, value);
      else
        reflection->SetRepeatedUInt64(&message, field, index, value);
      return true;
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      if (!parse_double(text, double_value)) return false;
      if (!repeated)
        reflection->SetDouble(&message, field, double_value);
      else if (append)
        reflection->AddDouble(&message, field, double_value);
      else
        reflection->SetRepeatedDouble(&message, field, index, double_value);
      return true;
    }
    case FieldDescriptor::CPPTYPE_FLOAT: {
      if (!parse_double(text, double_value)) return false;
      const auto value = static_cast<float>(double_value);
      if (!repeated)
        reflection->SetFloat(&message, field, value);
      else if (append)
        reflection->AddFloat(&message, field, value);
      else
        reflection->SetRepeatedFloat(&message, field, index, value);
      return true;
    }
    case FieldDescriptor::CPPTYPE_BOOL: {
      if (!parse_bool(text, bool_value)) return false;
      if (!repeated)
        reflection->SetBool(&message, field, bool_value);
      else if (append)
        reflection->AddBool(&message, field, bool_value);
      else
        reflection->SetRepeatedBool(&message, field, index, bool_value);
      return true;
    }
    case FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumDescriptor* type = field->enum_type();
      const pb::EnumValueDescriptor* value = nullptr;
      for (int i = 0; i < type->value_count() && !value; ++i) {
        if (lower(type->value(i)->name()) == lower(text)) value = type->value(i);
      }
      if (!value) return false;
      if (!repeated)
        reflection->SetEnum(&message, field, value);
      else if (append)
        reflection->AddEnum(&message, field, value);
      else
        reflection->SetRepeatedEnum(&message, field, index, value);
      return true;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string value = unquote(text);
      if (!repeated)
        reflection->SetString(&message, field, value);
      else if (append)
        reflection->AddString(&message, field, value);
      else
        reflection->SetRepeatedString(&message, field, index, value);
      return true;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return false;
  }
  return false;
}

// Replaces `target` with the text-format body `text` ("{ a: 1 b: 2 }" or "a: 1 b: 2").
void parse_message_value(const std::string& text, Message& target, const std::string& where) {
  std::string body = trim(text);
  if (body.size() >= 2 && body.front() == '{' && body.back() == '}') {
    body = body.substr(1, body.size() - 2);
  }
  std::unique_ptr<Message> parsed(target.New());
  FirstErrorCollector errors;
  if (!parse_text(body, *parsed, errors, nullptr)) {
    std::string message = errors.message;
    const std::string unknown = quoted_after(message, "has no field named");
    if (!unknown.empty()) {
      message = "no field " + unknown + "; " + describe_fields(target.GetDescriptor(), "", unknown);
    }
    throw ConfigError(where + ": column " + std::to_string(errors.column + 1) +
                      " of the value: " + message);
  }
  target.CopyFrom(*parsed);
}

std::vector<std::string> split_list(const std::string& text) {
  std::string body = trim(text);
  if (body.size() >= 2 && body.front() == '[' && body.back() == ']') {
    body = body.substr(1, body.size() - 2);
  }
  std::vector<std::string> items;
  if (trim(body).empty()) return items;
  std::stringstream stream(body);
  std::string item;
  while (std::getline(stream, item, ',')) items.push_back(trim(item));
  return items;
}

// ---------------------------------------------------------------------------------------
// Finding where a field's value came from, for validation errors.

struct Origin {
  std::string where;        // "exp.pbtxt:12:3", "--set a.b=1", or "exp.pbtxt"
  bool is_default = false;  // neither the file nor an override set it
};

class FieldLocator {
 public:
  explicit FieldLocator(const ValidationContext& context) : context_(context) {
    if (context.config_path.empty()) return;
    std::ifstream in(context.config_path, std::ios::binary);
    if (!in) return;
    std::ostringstream text;
    text << in.rdbuf();
    Experiment parsed;
    FirstErrorCollector errors;
    if (parse_text(text.str(), parsed, errors, &tree_)) have_tree_ = true;
  }

  Origin locate(const std::string& path) const {
    // The last override that set this field, or a message containing it, wins.
    for (auto it = context_.overrides.rbegin(); it != context_.overrides.rend(); ++it) {
      const std::string set_path = trim(it->substr(0, it->find('=')));
      if (path == set_path || starts_with_segment(path, set_path) ||
          starts_with_segment(set_path, path)) {
        return {"--set " + *it, false};
      }
    }
    const std::string file = context_.config_path.empty() ? "<experiment>" : context_.config_path;
    std::vector<PathSegment> segments;
    std::string problem;
    if (!have_tree_ || !split_path(path, segments, problem)) return {file, true};
    // Falls back to the innermost enclosing message the file wrote, when the field itself
    // was left at its default.
    const pb::TextFormat::ParseInfoTree* tree = &tree_;
    const Descriptor* type = Experiment::descriptor();
    pb::TextFormat::ParseLocation found;
    std::size_t matched = 0;
    for (std::size_t i = 0; i < segments.size() && tree; ++i) {
      const FieldDescriptor* field = type->FindFieldByName(segments[i].name);
      if (!field) break;
      // A repeated field named without [i] is located at its first element.
      const int index = field->is_repeated() ? std::max(segments[i].index, 0) : -1;
      pb::TextFormat::ParseLocation location = tree->GetLocation(field, index);
      // `name: [a, b]` records one location for the whole list: use the latest recorded.
      for (int earlier = index - 1; location.line < 0 && earlier >= 0; --earlier) {
        location = tree->GetLocation(field, earlier);
      }
      if (location.line < 0) break;
      found = location;
      ++matched;
      if (i + 1 < segments.size()) {
        if (field->type() != FieldDescriptor::TYPE_MESSAGE) break;
        tree = tree->GetTreeForNested(field, index);
        type = field->message_type();
      }
    }
    if (found.line < 0) return {file, true};
    return {file + ":" + std::to_string(found.line + 1) + ":" + std::to_string(found.column + 1),
            matched != segments.size()};
  }

 private:
  static bool starts_with_segment(const std::string& path, const std::string& prefix) {
    return path.size() > prefix.size() && path.compare(0, prefix.size(), prefix) == 0 &&
           (path[prefix.size()] == '.' || path[prefix.size()] == '[');
  }

  const ValidationContext& context_;
  pb::TextFormat::ParseInfoTree tree_;
  bool have_tree_ = false;
};

// ---------------------------------------------------------------------------------------
// Defaults.

bool is_image_model(const std::string& name) {
  return name != "bert_base";
}

void fill_loss_scale(LossScaleConfig& scale, PrecisionConfig::Half half) {
  if (!scale.has_dynamic()) scale.set_dynamic(half == PrecisionConfig::FP16);
  if (!scale.has_init_scale()) scale.set_init_scale(65536.0);
  if (!scale.has_growth_factor()) scale.set_growth_factor(2.0);
  if (!scale.has_backoff_factor()) scale.set_backoff_factor(0.5);
  if (!scale.has_growth_interval()) scale.set_growth_interval(2000);
  if (!scale.has_static_scale()) scale.set_static_scale(1.0);
  if (!scale.has_min_scale()) scale.set_min_scale(1.0);
  if (!scale.has_max_scale()) scale.set_max_scale(16777216.0);
}

// ---------------------------------------------------------------------------------------
// Batch arithmetic shared by plan_batches and validate: "" when fine, else the problem.

struct BatchResult {
  BatchPlan plan;
  std::string problem;
  std::string field;  // the field the problem is reported on
};

BatchResult compute_batches(const Experiment& experiment, int world_size) {
  BatchResult result;
  const TrainConfig& train = experiment.train();
  const int per_gpu = train.has_batch_per_gpu() ? train.batch_per_gpu() : 32;
  result.plan.per_gpu = per_gpu;
  result.plan.world_size = world_size;
  if (world_size < 1) {
    result.field = "train.batch_per_gpu";
    result.problem = "the job has " + std::to_string(world_size) + " ranks; need at least 1";
    return result;
  }
  if (per_gpu < 1) {
    result.field = "train.batch_per_gpu";
    result.problem = "must be >= 1";
    return result;
  }
  if (train.has_accumulation_steps() && train.accumulation_steps() < 1) {
    result.field = "train.accumulation_steps";
    result.problem = "must be >= 1 (1 = no accumulation)";
    return result;
  }
  const std::int64_t per_step = static_cast<std::int64_t>(per_gpu) * world_size;
  if (!train.has_global_batch()) {
    result.plan.accumulation = train.has_accumulation_steps() ? train.accumulation_steps() : 1;
    result.plan.global = per_step * result.plan.accumulation;
    return result;
  }
  const std::int64_t global = train.global_batch();
  result.field = "train.global_batch";
  if (global < 1) {
    result.problem =
        "must be >= 1 (or unset, to derive it from batch_per_gpu × "
        "accumulation_steps × ranks)";
    return result;
  }
  const std::string product = std::to_string(per_gpu) + " × " + std::to_string(world_size) + " = " +
                              std::to_string(per_step);
  if (train.has_accumulation_steps()) {
    const std::int64_t implied = per_step * train.accumulation_steps();
    if (implied != global) {
      result.problem =
          "differs from batch_per_gpu × accumulation_steps × ranks = " + std::to_string(per_gpu) +
          " × " + std::to_string(train.accumulation_steps()) + " × " + std::to_string(world_size) +
          " = " + std::to_string(implied) + "; unset one of global_batch and accumulation_steps";
    }
    result.plan.accumulation = train.accumulation_steps();
    result.plan.global = global;
    return result;
  }
  if (global % per_step != 0) {
    const std::int64_t below = global / per_step * per_step;
    std::string suggestion = "global batches that divide: ";
    if (below > 0) suggestion += std::to_string(below) + " or ";
    suggestion +=
        std::to_string(below + per_step) + " (multiples of " + std::to_string(per_step) + ")";
    if (global % world_size == 0) {
      const std::int64_t per_rank = global / world_size;
      std::vector<std::string> divisors;
      for (std::int64_t d = 1; d <= per_rank && d <= std::numeric_limits<int>::max(); ++d) {
        if (per_rank % d == 0) divisors.push_back(std::to_string(d));
      }
      if (divisors.size() > 16) divisors.erase(divisors.begin(), divisors.end() - 16);
      suggestion += "; or a batch_per_gpu dividing " + std::to_string(global) + " / " +
                    std::to_string(world_size) + " = " + std::to_string(per_rank) + ": " +
                    join(divisors, ", ");
    } else {
      suggestion += "; " + std::to_string(global) + " is not even a multiple of the " +
                    std::to_string(world_size) + " ranks";
    }
    result.problem = "not divisible by batch_per_gpu × ranks = " + product +
                     ", so accumulation_steps cannot be derived; " + suggestion;
    return result;
  }
  result.plan.accumulation = static_cast<int>(global / per_step);
  result.plan.global = global;
  return result;
}

// ---------------------------------------------------------------------------------------
// Validation.

class Validator {
 public:
  Validator(const Experiment& experiment, const ValidationContext& context)
      : experiment_(experiment), context_(context), locator_(context) {}

  // Throws "WHERE: PATH = VALUE: PROBLEM".
  [[noreturn]] void fail(const std::string& path, const std::string& value,
                         const std::string& problem) const {
    const Origin origin = locator_.locate(path);
    std::string message = origin.where + ": " + path + " = " + value;
    if (origin.is_default) message += " (the default)";
    throw ConfigError(message + ": " + problem);
  }

  void check(bool ok, const std::string& path, const std::string& value,
             const std::string& problem) const {
    if (!ok) fail(path, value, problem);
  }
  void check(bool ok, const std::string& path, double value, const std::string& problem) const {
    if (!ok) fail(path, number_text(value), problem);
  }

  void run() const {
    check(context_.world_size >= 1, "train.batch_per_gpu", std::to_string(context_.world_size),
          "the job reports fewer than 1 rank");
    check(!experiment_.name().empty() && experiment_.name().find('/') == std::string::npos, "name",
          quote(experiment_.name()),
          "must be non-empty and contain no '/' (it names "
          "directories)");
    const bool on_cpu = check_device();
    check_model();
    check_data();
    check_optimizer();
    check_schedule();
    check_precision(on_cpu);
    check_parallel(on_cpu);
    check_train();
    check_checkpoint();
    check(!experiment_.logging().dir().empty(), "logging.dir", "\"\"", "must be a directory");
  }

 private:
  static std::string quote(const std::string& text) { return "\"" + text + "\""; }
  static bool exists(const std::string& path) {
    std::error_code error;
    return std::filesystem::exists(path, error);
  }

  // Returns true when training runs on the CPU.
  bool check_device() const {
    const TrainConfig::Device device = experiment_.train().device();
    check(device != TrainConfig::CUDA || context_.cuda_available, "train.device", "CUDA",
          "no CUDA device is usable by this process; use CPU or AUTO, or check "
          "CUDA_VISIBLE_DEVICES and the driver");
    return device == TrainConfig::CPU || (device == TrainConfig::AUTO && !context_.cuda_available);
  }

  void check_model() const {
    const ModelConfig& model = experiment_.model();
    const auto& known = known_model_names();
    check(std::find(known.begin(), known.end(), model.name()) != known.end(), "model.name",
          quote(model.name()), "unknown model; allowed: " + join(known, ", "));
    const bool image = is_image_model(model.name());
    if (image) {
      check(model.num_classes() >= 2, "model.num_classes", std::to_string(model.num_classes()),
            "must be >= 2");
      check(model.image_size() >= 8 && model.image_size() <= 4096, "model.image_size",
            std::to_string(model.image_size()), "must be in [8, 4096]");
      check(model.image_channels() >= 1 && model.image_channels() <= 4, "model.image_channels",
            std::to_string(model.image_channels()), "must be in [1, 4]");
      if (model.name() == "vit_b16") {
        check(model.image_size() % 16 == 0, "model.image_size", std::to_string(model.image_size()),
              "vit_b16 needs a multiple of the 16-pixel patch");
      }
      check(experiment_.data().kind() != DataConfig::TOKENS, "data.kind", "TOKENS",
            "model " + model.name() + " takes images; TOKENS data needs model bert_base");
    } else {
      const BertShape& bert = model.bert();
      const std::pair<const char*, int> sizes[] = {
          {"model.bert.vocab_size", bert.vocab_size()},
          {"model.bert.seq_len", bert.seq_len()},
          {"model.bert.hidden_size", bert.hidden_size()},
          {"model.bert.num_layers", bert.num_layers()},
          {"model.bert.num_heads", bert.num_heads()},
          {"model.bert.intermediate_size", bert.intermediate_size()}};
      for (const auto& [path, size] : sizes) {
        check(size >= 1, path, std::to_string(size), "must be >= 1");
      }
      check(bert.hidden_size() % bert.num_heads() == 0, "model.bert.hidden_size",
            std::to_string(bert.hidden_size()),
            "must be a multiple of model.bert.num_heads = " + std::to_string(bert.num_heads()));
      const DataConfig::Kind kind = experiment_.data().kind();
      check(kind == DataConfig::TOKENS || kind == DataConfig::SYNTHETIC, "data.kind",
            DataConfig::Kind_Name(kind), "bert_base needs TOKENS or SYNTHETIC data");
    }
    check(model.dropout() >= 0 && model.dropout() < 1, "model.dropout", model.dropout(),
          "must be in [0, 1)");
    for (int i = 0; i < model.mlp_hidden_size(); ++i) {
      check(model.mlp_hidden(i) >= 1, "model.mlp_hidden[" + std::to_string(i) + "]",
            std::to_string(model.mlp_hidden(i)), "hidden widths must be >= 1");
    }
    check(model.init_from().empty() || exists(model.init_from()), "model.init_from",
          quote(model.init_from()), "no such file (a safetensors file, or \"\" for random init)");
  }

  void check_data() const {
    const DataConfig& data = experiment_.data();
    const std::string kind = DataConfig::Kind_Name(data.kind());
    if (data.kind() != DataConfig::SYNTHETIC) {
      check(!data.path().empty(), "data.path", "\"\"",
            "a dataset directory is required for " + kind);
      check(exists(data.path()), "data.path", quote(data.path()),
            "no such directory (the " + kind + " dataset)");
    }
    check(data.workers() >= 0 && data.workers() <= 256, "data.workers",
          std::to_string(data.workers()), "must be in [0, 256] (0 = load on the training thread)");
    check(data.prefetch() >= 1, "data.prefetch", std::to_string(data.prefetch()),
          "must be >= 1 batch");
    check(data.mlm_probability() > 0 && data.mlm_probability() < 1, "data.mlm_probability",
          data.mlm_probability(), "must be in (0, 1)");
    const std::string& split = data.eval_split();
    check(split == "test" || split == "train" || split == "none", "data.eval_split", quote(split),
          "allowed: test, train, none");

    const AugmentationConfig& augmentation = data.augmentation();
    const int channels = experiment_.model().image_channels();
    check(augmentation.random_crop_padding() >= 0, "data.augmentation.random_crop_padding",
          std::to_string(augmentation.random_crop_padding()), "must be >= 0 (0 = off)");
    check(augmentation.normalize_mean_size() == augmentation.normalize_std_size(),
          "data.augmentation.normalize_std", list(augmentation.normalize_std()),
          "needs as many values as normalize_mean (" +
              std::to_string(augmentation.normalize_mean_size()) + ")");
    if (augmentation.normalize_mean_size() > 0) {
      check(augmentation.normalize_mean_size() == channels, "data.augmentation.normalize_mean",
            list(augmentation.normalize_mean()),
            "needs one value per image channel (model.image_channels = " +
                std::to_string(channels) + ")");
    }
    for (float std_value : augmentation.normalize_std()) {
      check(std_value > 0, "data.augmentation.normalize_std", list(augmentation.normalize_std()),
            "every value must be > 0");
    }
    const auto& scale = augmentation.random_resized_crop_scale();
    if (!scale.empty()) {
      check(scale.size() == 2 && scale[0] > 0 && scale[0] <= scale[1] && scale[1] <= 1,
            "data.augmentation.random_resized_crop_scale", list(scale),
            "needs two values min, max with 0 < min <= max <= 1 (e.g. 0.08, 1)");
    }
  }

  template <typename Values>
  static std::string list(const Values& values) {
    std::vector<std::string> items;
    for (const auto& value : values) items.push_back(number_text(value));
    return "[" + join(items, ", ") + "]";
  }

  void check_optimizer() const {
    const OptimizerConfig& optimizer = experiment_.optimizer();
    const std::string kind = OptimizerConfig::Kind_Name(optimizer.kind());
    check(optimizer.lr() > 0 && std::isfinite(optimizer.lr()), "optimizer.lr", optimizer.lr(),
          "must be > 0");
    check(optimizer.momentum() >= 0 && optimizer.momentum() < 1, "optimizer.momentum",
          optimizer.momentum(), "must be in [0, 1)");
    check(optimizer.weight_decay() >= 0, "optimizer.weight_decay", optimizer.weight_decay(),
          "must be >= 0");
    check(optimizer.betas_size() == 2, "optimizer.betas", list(optimizer.betas()),
          "needs exactly two values: beta1, beta2");
    for (int i = 0; i < 2; ++i) {
      check(optimizer.betas(i) >= 0 && optimizer.betas(i) < 1,
            "optimizer.betas[" + std::to_string(i) + "]", optimizer.betas(i), "must be in [0, 1)");
    }
    check(optimizer.eps() > 0, "optimizer.eps", optimizer.eps(), "must be > 0");
    check(optimizer.max_grad_norm() >= 0, "optimizer.max_grad_norm", optimizer.max_grad_norm(),
          "must be >= 0 (0 = no clipping)");
    if (optimizer.nesterov()) {
      check(optimizer.kind() == OptimizerConfig::SGD, "optimizer.nesterov", "true",
            "applies to SGD only (optimizer.kind is " + kind + ")");
      check(optimizer.momentum() > 0, "optimizer.nesterov", "true", "needs optimizer.momentum > 0");
    }
    check(!optimizer.amsgrad() || optimizer.kind() == OptimizerConfig::ADAMW, "optimizer.amsgrad",
          "true", "applies to ADAMW only (optimizer.kind is " + kind + ")");
    for (int i = 0; i < optimizer.param_groups_size(); ++i) {
      const ParamGroup& group = optimizer.param_groups(i);
      const std::string path = "optimizer.param_groups[" + std::to_string(i) + "]";
      check(!group.name_pattern().empty(), path + ".name_pattern", "\"\"",
            "required: a glob over parameter names such as \"*.bias\"");
      check(group.lr_multiplier() >= 0, path + ".lr_multiplier", group.lr_multiplier(),
            "must be >= 0");
      check(!group.has_weight_decay() || group.weight_decay() >= 0, path + ".weight_decay",
            group.weight_decay(), "must be >= 0");
    }
  }

  void check_schedule() const {
    const ScheduleConfig& schedule = experiment_.schedule();
    const TrainConfig& train = experiment_.train();
    check(schedule.warmup_steps() >= 0, "schedule.warmup_steps",
          std::to_string(schedule.warmup_steps()), "must be >= 0");
    if (train.has_steps() && schedule.warmup_steps() > 0) {
      check(schedule.warmup_steps() < train.steps(), "schedule.warmup_steps",
            std::to_string(schedule.warmup_steps()),
            "must be less than train.steps = " + std::to_string(train.steps()));
    }
    check(schedule.min_lr() >= 0 && schedule.min_lr() <= experiment_.optimizer().lr(),
          "schedule.min_lr", schedule.min_lr(),
          "must be in [0, optimizer.lr = " + number_text(experiment_.optimizer().lr()) + "]");
    check(schedule.power() > 0, "schedule.power", schedule.power(), "must be > 0");
    check(schedule.gamma() > 0 && schedule.gamma() <= 1, "schedule.gamma", schedule.gamma(),
          "must be in (0, 1]");
    if (schedule.kind() == ScheduleConfig::STEP) {
      check(schedule.step_size() >= 1, "schedule.step_size", std::to_string(schedule.step_size()),
            "must be >= 1 with kind STEP");
    }
  }

  void check_precision(bool on_cpu) const {
    const PrecisionConfig& precision = experiment_.precision();
    const std::string level = PrecisionConfig::OptLevel_Name(precision.opt_level());
    if (on_cpu) {
      check(precision.opt_level() <= PrecisionConfig::O1, "precision.opt_level", level,
            "O2 and O3 need a GPU and training runs on the CPU; the CPU backend allows O0, "
            "or O1 with half BF16");
      check(
          precision.opt_level() == PrecisionConfig::O0 || precision.half() != PrecisionConfig::FP16,
          "precision.half", "FP16",
          "the CPU backend has no fp16 arithmetic; use BF16 or opt_level O0");
    }
    const LossScaleConfig& scale = precision.loss_scale();
    const std::string prefix = "precision.loss_scale.";
    check(scale.init_scale() > 0, prefix + "init_scale", scale.init_scale(), "must be > 0");
    check(scale.growth_factor() > 1, prefix + "growth_factor", scale.growth_factor(),
          "must be > 1");
    check(scale.backoff_factor() > 0 && scale.backoff_factor() < 1, prefix + "backoff_factor",
          scale.backoff_factor(), "must be in (0, 1)");
    check(scale.growth_interval() >= 1, prefix + "growth_interval",
          std::to_string(scale.growth_interval()), "must be >= 1 step");
    check(scale.static_scale() > 0, prefix + "static_scale", scale.static_scale(), "must be > 0");
    check(scale.min_scale() > 0 && scale.min_scale() <= scale.init_scale(), prefix + "min_scale",
          scale.min_scale(),
          "must be in (0, init_scale = " + number_text(scale.init_scale()) + "]");
    check(scale.max_scale() >= scale.init_scale(), prefix + "max_scale", scale.max_scale(),
          "must be >= init_scale = " + number_text(scale.init_scale()));
  }

  void check_parallel(bool on_cpu) const {
    const ParallelConfig& parallel = experiment_.parallel();
    check(parallel.bucket_mb() > 0 && parallel.bucket_mb() <= 1024, "parallel.bucket_mb",
          parallel.bucket_mb(), "must be in (0, 1024] MiB");
    check(parallel.collective_timeout_s() >= 1, "parallel.collective_timeout_s",
          std::to_string(parallel.collective_timeout_s()), "must be >= 1 second");
    check(!(on_cpu && parallel.backend() == ParallelConfig::NCCL), "parallel.backend", "NCCL",
          "NCCL needs CUDA and training runs on the CPU; use MPI or AUTO");
  }

  void check_train() const {
    const TrainConfig& train = experiment_.train();
    if (train.has_steps()) {
      check(train.steps() >= 1, "train.steps", std::to_string(train.steps()), "must be >= 1");
    } else {
      check(train.epochs() > 0 && std::isfinite(train.epochs()), "train.epochs", train.epochs(),
            "must be > 0");
      check(experiment_.data().kind() != DataConfig::SYNTHETIC, "train.epochs", train.epochs(),
            "SYNTHETIC data has no epochs; set train.steps instead");
    }
    const BatchResult batches = compute_batches(experiment_, context_.world_size);
    if (!batches.problem.empty()) {
      const FieldDescriptor* field =
          TrainConfig::descriptor()->FindFieldByName(batches.field.substr(6));
      std::string value;
      pb::TextFormat::PrintFieldValueToString(train, field, -1, &value);
      fail(batches.field, value, batches.problem);
    }
    check(train.eval_every() >= 0, "train.eval_every", std::to_string(train.eval_every()),
          "must be >= 0 (0 = evaluate at the end only)");
    check(train.eval_batches() >= 0, "train.eval_batches", std::to_string(train.eval_batches()),
          "must be >= 0 (0 = the whole split)");
    check(train.log_every() >= 1, "train.log_every", std::to_string(train.log_every()),
          "must be >= 1 step");
    check(train.max_memory_mb() >= 0, "train.max_memory_mb", std::to_string(train.max_memory_mb()),
          "must be >= 0 (0 = no limit)");
    check(train.preemption_grace_s() >= 0, "train.preemption_grace_s",
          std::to_string(train.preemption_grace_s()), "must be >= 0 seconds");
  }

  void check_checkpoint() const {
    const CheckpointConfig& checkpoint = experiment_.checkpoint();
    check(checkpoint.keep_last() >= 1, "checkpoint.keep_last",
          std::to_string(checkpoint.keep_last()), "must be >= 1");
    check(checkpoint.every_steps() >= 0, "checkpoint.every_steps",
          std::to_string(checkpoint.every_steps()), "must be >= 0 (0 = at the end only)");
    check(!checkpoint.dir().empty(), "checkpoint.dir", "\"\"", "must be a directory");
    const std::string& resume = checkpoint.resume();
    check(resume.empty() || resume == "latest" || exists(resume), "checkpoint.resume",
          quote(resume),
          "no such checkpoint directory; allowed: \"\" (fresh), \"latest\", or an existing "
          "checkpoint path");
  }

  const Experiment& experiment_;
  const ValidationContext& context_;
  FieldLocator locator_;
};

}  // namespace

// ---------------------------------------------------------------------------------------

const std::vector<std::string>& known_model_names() {
  static const std::vector<std::string> names = {"mlp",      "fashion_cnn", "resnet18",
                                                 "resnet50", "bert_base",   "vit_b16"};
  return names;
}

Experiment parse_experiment_text(const std::string& text, const std::string& source_name) {
  Experiment experiment;
  FirstErrorCollector errors;
  if (!parse_text(text, experiment, errors, nullptr)) {
    if (!errors.has_error) throw ConfigError(source_name + ": cannot parse the experiment");
    throw ConfigError(explain_parse_error(text, source_name, errors));
  }
  return experiment;
}

void apply_override(Experiment& experiment, const std::string& assignment) {
  const std::string where = "--set " + assignment;
  const auto equals = assignment.find('=');
  if (equals == std::string::npos) {
    throw ConfigError(where + ": expected path=value, e.g. --set optimizer.lr=3e-4");
  }
  const std::string path = trim(assignment.substr(0, equals));
  const std::string value = trim(assignment.substr(equals + 1));
  std::vector<PathSegment> segments;
  std::string problem;
  if (!split_path(path, segments, problem)) throw ConfigError(where + ": " + problem);

  Message* message = &experiment;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const PathSegment& segment = segments[i];
    const Descriptor* type = message->GetDescriptor();
    const std::string level = path_prefix(segments, i);
    const std::string here = path_prefix(segments, i + 1);
    const FieldDescriptor* field = type->FindFieldByName(segment.name);
    if (!field) {
      throw ConfigError(where + ": " + here + ": no such field; " +
                        describe_fields(type, level, segment.name));
    }
    const Reflection* reflection = message->GetReflection();
    const bool last = i + 1 == segments.size();
    if (segment.index >= 0 && !field->is_repeated()) {
      throw ConfigError(where + ": " + here + ": " + segment.name + " is not a list; drop the [" +
                        std::to_string(segment.index) + "]");
    }
    const int size = field->is_repeated() ? reflection->FieldSize(*message, field) : 0;
    if (segment.index > size) {
      throw ConfigError(where + ": " + here + ": index " + std::to_string(segment.index) +
                        " is past the end; the list has " + std::to_string(size) +
                        " elements (index " + std::to_string(size) + " appends one)");
    }
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      Message* child = nullptr;
      if (!field->is_repeated()) {
        child = reflection->MutableMessage(message, field);
      } else if (segment.index >= 0) {
        child = segment.index == size
                    ? reflection->AddMessage(message, field)
                    : reflection->MutableRepeatedMessage(message, field, segment.index);
      } else if (last) {
        // A list of messages named without [i]: "" clears it, a message body appends one.
        if (value.empty()) {
          reflection->ClearField(message, field);
        } else {
          parse_message_value(value, *reflection->AddMessage(message, field), where);
        }
        return;
      } else {
        throw ConfigError(where + ": " + here + " is a list; pick an element with " + here + "[N]");
      }
      if (last) {
        parse_message_value(value, *child, where);
        return;
      }
      message = child;
      continue;
    }
    if (!last) {
      throw ConfigError(where + ": " + here + " is " + type_description(field) +
                        ", not a message; nothing below it to set");
    }
    const auto bad_value = [&](const std::string& item) {
      return ConfigError(where + ": " + here + ": '" + item + "' is not " +
                         type_description(field));
    };
    if (field->is_repeated() && segment.index < 0) {
      // A comma list replaces the whole list ("" empties it).
      std::unique_ptr<Message> scratch(message->New());
      scratch->CopyFrom(*message);
      scratch->GetReflection()->ClearField(scratch.get(), field);
      int index = 0;
      for (const std::string& item : split_list(value)) {
        if (!set_scalar(*scratch, field, index++, item)) throw bad_value(item);
      }
      message->CopyFrom(*scratch);
      return;
    }
    if (!set_scalar(*message, field, segment.index, value)) throw bad_value(value);
    return;
  }
}

void fill_defaults(Experiment& experiment, const std::string& config_path) {
  if (!experiment.has_name()) {
    std::string stem = std::filesystem::path(config_path).stem().string();
    experiment.set_name(stem.empty() ? "experiment" : stem);
  }

  DataConfig& data = *experiment.mutable_data();
  const bool fashion = data.kind() == DataConfig::FASHION_MNIST;
  const bool cifar = data.kind() == DataConfig::CIFAR10;
  if (!data.has_path() && fashion) data.set_path("/usr/share/datasets/fashion-mnist");
  if (!data.has_workers()) data.set_workers(4);
  if (!data.has_prefetch()) data.set_prefetch(2);
  if (!data.has_shuffle()) data.set_shuffle(true);
  if (!data.has_drop_last()) data.set_drop_last(true);
  if (!data.has_mlm_probability()) data.set_mlm_probability(0.15);
  if (!data.has_eval_split()) data.set_eval_split("test");

  ModelConfig& model = *experiment.mutable_model();
  if (!model.has_name()) model.set_name("fashion_cnn");
  if (!model.has_num_classes()) model.set_num_classes(fashion || cifar ? 10 : 1000);
  if (!model.has_image_size()) model.set_image_size(fashion ? 28 : cifar ? 32 : 224);
  if (!model.has_image_channels()) model.set_image_channels(fashion ? 1 : 3);
  // The reference models' own: BertConfig's hidden dropout 0.1; torchvision's vit_b_16 has none.
  if (!model.has_dropout()) model.set_dropout(model.name() == "bert_base" ? 0.1 : 0.0);
  if (model.name() == "mlp" && model.mlp_hidden_size() == 0) {
    model.add_mlp_hidden(512);
    model.add_mlp_hidden(256);
  }
  if (model.name() == "bert_base") {
    BertShape& bert = *model.mutable_bert();
    if (!bert.has_vocab_size()) bert.set_vocab_size(30522);
    if (!bert.has_seq_len()) bert.set_seq_len(128);
    if (!bert.has_hidden_size()) bert.set_hidden_size(768);
    if (!bert.has_num_layers()) bert.set_num_layers(12);
    if (!bert.has_num_heads()) bert.set_num_heads(12);
    if (!bert.has_intermediate_size()) bert.set_intermediate_size(4 * bert.hidden_size());
  }

  OptimizerConfig& optimizer = *experiment.mutable_optimizer();
  const bool sgd = optimizer.kind() == OptimizerConfig::SGD;
  const bool lamb = optimizer.kind() == OptimizerConfig::LAMB;
  if (!optimizer.has_lr()) optimizer.set_lr(sgd ? 0.1 : 1e-3);
  if (!optimizer.has_momentum()) optimizer.set_momentum(0.9);
  if (!optimizer.has_weight_decay()) optimizer.set_weight_decay(sgd ? 0.0 : 0.01);
  if (optimizer.betas_size() == 0) {
    optimizer.add_betas(0.9);
    optimizer.add_betas(0.999);
  }
  if (!optimizer.has_eps()) optimizer.set_eps(lamb ? 1e-6 : 1e-8);
  if (!optimizer.has_bias_correction()) optimizer.set_bias_correction(true);
  if (!optimizer.has_no_weight_decay_for_bias_and_norm()) {
    optimizer.set_no_weight_decay_for_bias_and_norm(true);
  }
  for (ParamGroup& group : *optimizer.mutable_param_groups()) {
    if (!group.has_lr_multiplier()) group.set_lr_multiplier(1.0);
    if (!group.has_weight_decay()) group.set_weight_decay(optimizer.weight_decay());
  }

  ScheduleConfig& schedule = *experiment.mutable_schedule();
  if (!schedule.has_power()) schedule.set_power(1.0);
  if (!schedule.has_gamma()) schedule.set_gamma(0.1);

  PrecisionConfig& precision = *experiment.mutable_precision();
  fill_loss_scale(*precision.mutable_loss_scale(), precision.half());

  ParallelConfig& parallel = *experiment.mutable_parallel();
  if (!parallel.has_bucket_mb()) parallel.set_bucket_mb(25.0);
  if (!parallel.has_collective_timeout_s()) parallel.set_collective_timeout_s(600);

  TrainConfig& train = *experiment.mutable_train();
  if (train.duration_case() == TrainConfig::DURATION_NOT_SET) {
    if (data.kind() == DataConfig::SYNTHETIC) {
      train.set_steps(100);
    } else {
      train.set_epochs(1.0);
    }
  }
  if (!train.has_batch_per_gpu()) train.set_batch_per_gpu(32);
  // With global_batch set, accumulation is derived from the world size (plan_batches).
  if (!train.has_accumulation_steps() && !train.has_global_batch()) {
    train.set_accumulation_steps(1);
  }
  if (!train.has_log_every()) train.set_log_every(10);
  if (!train.has_cuda_graphs()) train.set_cuda_graphs(false);
  if (!train.has_preemption_grace_s()) train.set_preemption_grace_s(120);

  LoggingConfig& logging = *experiment.mutable_logging();
  if (!logging.has_dir()) logging.set_dir("runs/" + experiment.name());
  if (!logging.has_jsonl()) logging.set_jsonl(true);

  CheckpointConfig& checkpoint = *experiment.mutable_checkpoint();
  if (!checkpoint.has_dir()) checkpoint.set_dir(logging.dir() + "/checkpoints");
  if (!checkpoint.has_keep_last()) checkpoint.set_keep_last(3);
}

Experiment load_experiment(const std::string& path, const std::vector<std::string>& overrides) {
  Experiment experiment = parse_experiment_text(read_file(path), path);
  for (const std::string& assignment : overrides) apply_override(experiment, assignment);
  fill_defaults(experiment, path);
  return experiment;
}

void validate(const Experiment& experiment, const ValidationContext& context) {
  Validator(experiment, context).run();
}

BatchPlan plan_batches(const Experiment& experiment, int world_size) {
  const BatchResult result = compute_batches(experiment, world_size);
  if (!result.problem.empty()) throw ConfigError(result.field + ": " + result.problem);
  return result.plan;
}

std::string to_text(const Experiment& experiment) {
  std::string text;
  pb::TextFormat::Printer printer;
  printer.PrintToString(experiment, &text);
  return text;
}

std::string to_json(const Experiment& experiment) {
  pb::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status = pb::util::MessageToJsonString(experiment, &json, options);
  if (!status.ok()) throw ConfigError("cannot print the experiment as JSON: " + status.ToString());
  return json;
}

std::uint64_t experiment_hash(const Experiment& experiment) {
  std::string bytes;
  {
    pb::io::StringOutputStream stream(&bytes);
    pb::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    experiment.SerializeToCodedStream(&coded);
  }
  std::uint64_t hash = 14695981039346656037ull;  // FNV-1a 64-bit offset basis
  for (unsigned char byte : bytes) {
    hash ^= byte;
    hash *= 1099511628211ull;
  }
  return hash;
}

}  // namespace kiln::config
