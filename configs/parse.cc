// Reading experiments: the file (checked to be a regular file), protobuf's text-format
// parser with its errors turned into FILE:LINE:COLUMN: dotted.path: problem; allowed values,
// and the effective experiment printed back (text, JSON, fingerprint).
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/json_util.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>

#include "configs/experiment.h"
#include "configs/internal.h"

namespace kiln::config {
namespace {

using namespace detail;  // NOLINT: the helpers of configs/
using pb::Descriptor;
using pb::FieldDescriptor;

std::string read_file(const std::string& path) {
  std::string kind;
  switch (path_kind(path, &kind)) {
    case PathKind::kRegular:
      break;
    case PathKind::kMissing:
      throw ConfigError(path + ": cannot read the experiment: no such file");
    default:
      throw ConfigError(path + ": cannot read the experiment: it is " + kind +
                        ", not a .pbtxt file");
  }
  // Checked again on the open file: a FIFO or device swapped in after the check above would
  // block or never end (O_NONBLOCK keeps the open itself from waiting for a FIFO's writer).
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    throw ConfigError(path + ": cannot read the experiment: " + std::strerror(errno));
  }
  struct stat st {};
  std::string text;
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (ok) {
    char buf[1 << 16];
    ssize_t got = 0;
    while ((got = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(got));
    ok = got == 0;
  }
  ::close(fd);
  if (!ok)
    throw ConfigError(path + ": cannot read the experiment: not a regular file, or a read error");
  return text;
}

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

}  // namespace

namespace detail {

void FirstErrorCollector::AddError(int line, pb::io::ColumnNumber column,
                                   const std::string& message) {
  if (has_error) return;
  has_error = true;
  this->line = line;
  this->column = column;
  this->message = message;
}

bool parse_text(const std::string& text, pb::Message& out, FirstErrorCollector& errors,
                pb::TextFormat::ParseInfoTree* locations) {
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.AllowUnknownField(false);
  if (locations) parser.WriteLocationsTo(locations);
  return parser.ParseFromString(text, &out) && !errors.has_error;
}

}  // namespace detail

Experiment parse_experiment_text(const std::string& text, const std::string& source_name) {
  Experiment experiment;
  FirstErrorCollector errors;
  if (!parse_text(text, experiment, errors, nullptr)) {
    if (!errors.has_error) throw ConfigError(source_name + ": cannot parse the experiment");
    throw ConfigError(explain_parse_error(text, source_name, errors));
  }
  return experiment;
}

Experiment load_experiment(const std::string& path, const std::vector<std::string>& overrides) {
  Experiment experiment = parse_experiment_text(read_file(path), path);
  for (const std::string& assignment : overrides) apply_override(experiment, assignment);
  fill_defaults(experiment, path);
  return experiment;
}

std::string to_text(const Experiment& experiment) {
  std::string text;
  pb::TextFormat::Printer printer;
  printer.PrintToString(experiment, &text);
  return text;
}

namespace {

// Fields in number order, as protobuf's printer lists them. An enum without presence is printed
// at its first value too (protobuf's printer omits it there, which hid optimizer.kind: SGD,
// train.device: AUTO, precision.opt_level: O0, data.kind: FASHION_MNIST); other zero scalars
// stay omitted as protobuf omits them (0, false, "").
void print_effective(const pb::Message& message, int indent, std::string& out) {
  const Descriptor* type = message.GetDescriptor();
  const pb::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  for (int i = 0; i < type->field_count(); ++i) fields.push_back(type->field(i));
  std::sort(fields.begin(), fields.end(), [](const FieldDescriptor* a, const FieldDescriptor* b) {
    return a->number() < b->number();
  });
  const std::string pad(static_cast<std::size_t>(indent), ' ');
  for (const FieldDescriptor* field : fields) {
    const bool repeated = field->is_repeated();
    const int count = repeated ? reflection->FieldSize(message, field) : 1;
    if (!repeated && !reflection->HasField(message, field) &&
        (field->has_presence() || field->cpp_type() != FieldDescriptor::CPPTYPE_ENUM)) {
      continue;
    }
    for (int index = 0; index < count; ++index) {
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        out += pad + field->name() + " {\n";
        print_effective(repeated ? reflection->GetRepeatedMessage(message, field, index)
                                 : reflection->GetMessage(message, field),
                        indent + 2, out);
        out += pad + "}\n";
        continue;
      }
      std::string value;
      pb::TextFormat::PrintFieldValueToString(message, field, repeated ? index : -1, &value);
      out += pad + field->name() + ": " + value + "\n";
    }
  }
}

}  // namespace

std::string to_effective_text(const Experiment& experiment) {
  std::string text;
  print_effective(experiment, 0, text);
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
