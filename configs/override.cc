// `--set path=value` overrides: the path resolved through reflection, the value parsed by
// the field's type (see docs/configs.md, "Overrides"). The schema walker parses declared
// defaults with the same set_scalar, so a default is written exactly as an override would be.
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <sstream>

#include "configs/experiment.h"
#include "configs/internal.h"

namespace kiln::config {
namespace {

using namespace detail;  // NOLINT: the helpers of configs/
using pb::Descriptor;
using pb::FieldDescriptor;
using pb::Message;
using pb::Reflection;

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
  // ERANGE with a non-zero result is a subnormal (1e-320): a finite double like any other. An
  // underflow to 0 or an overflow to inf is refused (number_problem says which).
  const bool subnormal = errno == ERANGE && value != 0 && std::isfinite(value);
  return (errno == 0 || subnormal) && end == text.c_str() + text.size() && std::isfinite(value);
}

// Why a number-like value is refused, beyond "not a finite number": out of a double's range.
std::string number_problem(const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != ERANGE) return "";
  if (value == 0) {
    return " (it is too small for a double and would round to 0; the smallest positive double is "
           "4.9e-324)";
  }
  if (!std::isfinite(value)) return " (it is too large for a double, whose largest is 1.8e308)";
  return "";
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

}  // namespace

namespace detail {

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

}  // namespace detail

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
      const bool real = field->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE ||
                        field->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT;
      return ConfigError(where + ": " + here + ": '" + item + "' is not " +
                         type_description(field) + (real ? number_problem(item) : ""));
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

}  // namespace kiln::config
