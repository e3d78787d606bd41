// The walkers over the schema's declarations (configs/kiln_options.proto): declared defaults
// filled into unset fields, declared bounds and allowed values checked, both put into words.
#include "configs/schema.h"

#include <cmath>
#include <memory>
#include <stdexcept>

#include "configs/experiment.h"
#include "configs/internal.h"
#include "configs/kiln_options.pb.h"

namespace kiln::config {
namespace {

using namespace detail;  // NOLINT: the helpers of configs/
using pb::Descriptor;
using pb::FieldDescriptor;
using pb::Message;
using pb::Reflection;

const pb::FieldOptions& options(const FieldDescriptor* field) {
  return field->options();
}

bool only_when(const FieldDescriptor* field) {
  return options(field).GetExtension(kiln::default_only_when);
}

bool is_number(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
    case FieldDescriptor::CPPTYPE_DOUBLE:
    case FieldDescriptor::CPPTYPE_FLOAT:
      return true;
    default:
      return false;
  }
}

bool has_bounds(const FieldDescriptor* field) {
  return options(field).HasExtension(kiln::min) || options(field).HasExtension(kiln::max);
}

// Sets the declared default, which must parse: a default that does not is a schema bug.
void write_default(Message& message, const FieldDescriptor* field) {
  const std::string text = options(field).GetExtension(kiln::default_);
  bool ok = true;
  if (field->is_repeated()) {
    int index = 0;
    for (const std::string& item : split_list(text)) {
      ok = ok && set_scalar(message, field, index++, item);
    }
  } else {
    ok = set_scalar(message, field, -1, text);
  }
  if (!ok) {
    throw std::logic_error("configs/kiln.proto: (kiln.default) = \"" + text + "\" of " +
                           field->full_name() + " is not " + type_description(field));
  }
}

bool is_unset(const Message& message, const FieldDescriptor* field) {
  const Reflection* reflection = message.GetReflection();
  if (field->is_repeated()) return reflection->FieldSize(message, field) == 0;
  return field->has_presence() && !reflection->HasField(message, field);
}

// One scalar as a number, for bound checks.
double number_of(const Message& message, const FieldDescriptor* field, int index) {
  const Reflection* r = message.GetReflection();
  const bool rep = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return rep ? r->GetRepeatedInt32(message, field, index) : r->GetInt32(message, field);
    case FieldDescriptor::CPPTYPE_INT64:
      return static_cast<double>(rep ? r->GetRepeatedInt64(message, field, index)
                                     : r->GetInt64(message, field));
    case FieldDescriptor::CPPTYPE_UINT32:
      return rep ? r->GetRepeatedUInt32(message, field, index) : r->GetUInt32(message, field);
    case FieldDescriptor::CPPTYPE_UINT64:
      return static_cast<double>(rep ? r->GetRepeatedUInt64(message, field, index)
                                     : r->GetUInt64(message, field));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return rep ? r->GetRepeatedDouble(message, field, index) : r->GetDouble(message, field);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return rep ? r->GetRepeatedFloat(message, field, index) : r->GetFloat(message, field);
    default:
      return 0;
  }
}

// One scalar as errors print it: numbers as they round-trip, strings quoted, enums by name.
std::string value_text(const Message& message, const FieldDescriptor* field, int index) {
  const Reflection* r = message.GetReflection();
  const bool rep = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return number_text(number_of(message, field, index));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return number_text(rep ? r->GetRepeatedFloat(message, field, index)
                             : r->GetFloat(message, field));
    case FieldDescriptor::CPPTYPE_STRING:
      return quote(rep ? r->GetRepeatedString(message, field, index)
                       : r->GetString(message, field));
    default: {
      std::string text;
      pb::TextFormat::PrintFieldValueToString(message, field, index, &text);
      return text;
    }
  }
}

bool in_bounds(const FieldDescriptor* field, double value) {
  const pb::FieldOptions& o = options(field);
  if (!std::isfinite(value)) return false;
  if (o.HasExtension(kiln::min)) {
    const double min = o.GetExtension(kiln::min);
    if (o.GetExtension(kiln::min_exclusive) ? !(value > min) : !(value >= min)) return false;
  }
  if (o.HasExtension(kiln::max)) {
    const double max = o.GetExtension(kiln::max);
    if (o.GetExtension(kiln::max_exclusive) ? !(value < max) : !(value <= max)) return false;
  }
  return true;
}

// "" when `index` (-1: the singular value) of `field` keeps its declaration, else the problem.
std::string scalar_problem(const Message& message, const FieldDescriptor* field, int index) {
  if (is_number(field) && has_bounds(field)) {
    if (in_bounds(field, number_of(message, field, index))) return "";
    const std::string range = describe_range(field);
    return "must be " + std::string(range[0] == '[' || range[0] == '(' ? "in " : "") + range;
  }
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_ENUM) {
    // Text format takes an enum by number too, and a proto3 enum keeps numbers it has no name for.
    const Reflection* r = message.GetReflection();
    const int value = index >= 0 ? r->GetRepeatedEnumValue(message, field, index)
                                 : r->GetEnumValue(message, field);
    const pb::EnumDescriptor* type = field->enum_type();
    if (type->FindValueByNumber(value) != nullptr) return "";
    std::vector<std::string> names;
    for (int i = 0; i < type->value_count(); ++i) names.push_back(type->value(i)->name());
    return "unknown value; allowed: " + join(names, ", ");
  }
  const std::vector<std::string> allowed = allowed_values(field);
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING && !allowed.empty()) {
    const Reflection* r = message.GetReflection();
    const std::string value =
        index >= 0 ? r->GetRepeatedString(message, field, index) : r->GetString(message, field);
    for (const std::string& name : allowed) {
      if (value == name) return "";
    }
    return "unknown value; allowed: " + join(allowed, ", ");
  }
  return "";
}

// The zero value of a field that declares no default, as the reference shows it.
std::string zero_value(const FieldDescriptor* field) {
  if (field->is_repeated()) return "[]";
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL:
      return "`false`";
    case FieldDescriptor::CPPTYPE_STRING:
      return "`\"\"`";
    case FieldDescriptor::CPPTYPE_ENUM:
      return "`" + field->enum_type()->value(0)->name() + "`";
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return "";
    default:
      return "`0`";
  }
}

void check_field_declarations(const FieldDescriptor* field, std::vector<std::string>& problems) {
  const pb::FieldOptions& o = options(field);
  const std::string name = field->full_name();
  if ((has_bounds(field) && !is_number(field)) ||
      (o.ExtensionSize(kiln::allowed) > 0 &&
       field->cpp_type() != FieldDescriptor::CPPTYPE_STRING)) {
    problems.push_back(name + ": bounds on a non-number or allowed values on a non-string");
  }
  if (!o.HasExtension(kiln::default_)) return;
  if (!field->is_repeated() && !field->has_presence()) {
    problems.push_back(name +
                       ": a (kiln.default) needs an optional field (proto3 cannot tell an "
                       "unset implicit field from zero)");
    return;
  }
  std::unique_ptr<Message> scratch(
      pb::MessageFactory::generated_factory()->GetPrototype(field->containing_type())->New());
  try {
    write_default(*scratch, field);
  } catch (const std::logic_error& error) {
    problems.push_back(error.what());
    return;
  }
  const int count = field->is_repeated() ? scratch->GetReflection()->FieldSize(*scratch, field) : 1;
  for (int i = 0; i < count; ++i) {
    const std::string problem = scalar_problem(*scratch, field, field->is_repeated() ? i : -1);
    if (!problem.empty()) problems.push_back(name + ": the declared default " + problem);
  }
}

void check_message_declarations(const Descriptor* type, std::vector<std::string>& problems,
                                std::vector<const Descriptor*>& seen) {
  for (const Descriptor* done : seen) {
    if (done == type) return;
  }
  seen.push_back(type);
  for (int i = 0; i < type->field_count(); ++i) {
    const FieldDescriptor* field = type->field(i);
    check_field_declarations(field, problems);
    if (field->message_type()) check_message_declarations(field->message_type(), problems, seen);
  }
}

}  // namespace

void fill_declared_defaults(Message& message) {
  const Descriptor* type = message.GetDescriptor();
  const Reflection* reflection = message.GetReflection();
  for (int i = 0; i < type->field_count(); ++i) {
    const FieldDescriptor* field = type->field(i);
    if (only_when(field)) continue;
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
      if (options(field).HasExtension(kiln::default_) && is_unset(message, field)) {
        write_default(message, field);
      }
      continue;
    }
    if (field->is_repeated()) {
      for (int j = 0; j < reflection->FieldSize(message, field); ++j) {
        fill_declared_defaults(*reflection->MutableRepeatedMessage(&message, field, j));
      }
      continue;
    }
    // Descend into an unset section too, but leave it unset when nothing was filled in.
    const bool was_set = reflection->HasField(message, field);
    Message* child = reflection->MutableMessage(&message, field);
    fill_declared_defaults(*child);
    std::vector<const FieldDescriptor*> filled;
    child->GetReflection()->ListFields(*child, &filled);
    if (!was_set && filled.empty()) reflection->ClearField(&message, field);
  }
}

void apply_declared_default(Message& message, const std::string& field_name) {
  const FieldDescriptor* field = message.GetDescriptor()->FindFieldByName(field_name);
  if (!field || !options(field).HasExtension(kiln::default_)) {
    throw std::logic_error("configs/kiln.proto: " + message.GetDescriptor()->full_name() + "." +
                           field_name + " declares no (kiln.default)");
  }
  if (is_unset(message, field)) write_default(message, field);
}

std::string declared_default(const FieldDescriptor* field) {
  return options(field).GetExtension(kiln::default_);
}

std::optional<RangeProblem> find_range_problem(const Message& message, const std::string& prefix) {
  const Descriptor* type = message.GetDescriptor();
  const Reflection* reflection = message.GetReflection();
  for (int i = 0; i < type->field_count(); ++i) {
    const FieldDescriptor* field = type->field(i);
    const std::string path = prefix.empty() ? field->name() : prefix + "." + field->name();
    const auto element = [&](int index) { return path + "[" + std::to_string(index) + "]"; };
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (field->is_repeated()) {
        for (int j = 0; j < reflection->FieldSize(message, field); ++j) {
          auto found =
              find_range_problem(reflection->GetRepeatedMessage(message, field, j), element(j));
          if (found) return found;
        }
      } else if (reflection->HasField(message, field)) {
        auto found = find_range_problem(reflection->GetMessage(message, field), path);
        if (found) return found;
      }
      continue;
    }
    if (field->is_repeated()) {
      for (int j = 0; j < reflection->FieldSize(message, field); ++j) {
        const std::string problem = scalar_problem(message, field, j);
        if (!problem.empty())
          return RangeProblem{element(j), value_text(message, field, j), problem};
      }
      continue;
    }
    if (is_unset(message, field)) continue;
    const std::string problem = scalar_problem(message, field, -1);
    if (!problem.empty()) return RangeProblem{path, value_text(message, field, -1), problem};
  }
  return std::nullopt;
}

std::string describe_range(const FieldDescriptor* field) {
  const pb::FieldOptions& o = options(field);
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING)
    return join(allowed_values(field), ", ");
  const bool has_min = o.HasExtension(kiln::min);
  const bool has_max = o.HasExtension(kiln::max);
  const bool min_open = o.GetExtension(kiln::min_exclusive);
  const bool max_open = o.GetExtension(kiln::max_exclusive);
  const std::string min = number_text(o.GetExtension(kiln::min));
  const std::string max = number_text(o.GetExtension(kiln::max));
  if (has_min && has_max) {
    return (min_open ? "(" : "[") + min + ", " + max + (max_open ? ")" : "]");
  }
  if (has_min) return (min_open ? "> " : ">= ") + min;
  if (has_max) return (max_open ? "< " : "<= ") + max;
  return "";
}

std::string describe_default(const FieldDescriptor* field) {
  const pb::FieldOptions& o = options(field);
  const std::string rule = o.GetExtension(kiln::default_rule);
  if (!o.HasExtension(kiln::default_)) {
    if (!rule.empty()) return rule;
    return field->has_presence() && !field->message_type() ? "unset" : zero_value(field);
  }
  std::string value = o.GetExtension(kiln::default_);
  if (field->is_repeated()) value = "[" + join(split_list(value), ", ") + "]";
  if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) value = quote(value);
  value = "`" + value + "`";
  if (rule.empty()) return value;
  return value + (only_when(field) ? " " : "; ") + rule;
}

std::vector<std::string> allowed_values(const FieldDescriptor* field) {
  const pb::FieldOptions& o = options(field);
  std::vector<std::string> values;
  for (int i = 0; i < o.ExtensionSize(kiln::allowed); ++i) {
    values.push_back(o.GetExtension(kiln::allowed, i));
  }
  return values;
}

std::vector<std::string> check_declarations(const Descriptor* root) {
  std::vector<std::string> problems;
  std::vector<const Descriptor*> seen;
  check_message_declarations(root, problems, seen);
  return problems;
}

const std::vector<std::string>& known_model_names() {
  static const std::vector<std::string> names =
      allowed_values(ModelConfig::descriptor()->FindFieldByName("name"));
  return names;
}

}  // namespace kiln::config
